"""Which life of its origin stream a landed message came from.

A stream deleted and created again under the same name starts its sequences at 1 again, so
``(stream name, sequence)`` alone would name two different messages, and the second life's
messages would be dropped as duplicates of the first's. The sink therefore records, per origin
stream name, each life it has landed: the stream's creation time (``created`` in the stream
info) and the key its messages are landed under, the ``origin_stream`` of their rows and of
every exactly-once key: the stream's name for the first life, ``<name>#<n>`` for the n-th.

What keeps the creation time (nats-server 2.14/2.15, read in its source and checked here where
noted): a server restart (stored with the stream; checked), a change of replicas or a move
between servers of a cluster (the stream assignment keeps it), a restore of a snapshot on a
single server (``RestoreStream`` sets the snapshot's creation time). A clustered restore makes a
new assignment created at restore time, and a mirror is a stream of its own with its own
creation time: such a stream shows as a new life, and the job refuses it until told which it
is. A purge is not a new life: sequences go on.

A job whose origin's creation time the sink does not know refuses (exit 1, nothing acked,
nothing written) unless ``--stream-life`` names that creation time:

- ``new:<created>``: another stream under the same name; its messages land beside the old
  ones, under the next key, and dedupe among themselves.
- ``continue:<created>``: the same messages as the latest life (a restored backup, a clustered
  restore): they dedupe against what the table holds.

A sink written by a version without lives takes the life it meets first as its first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_cg.core.jetstream.api import JsApi

FIELD = "stream_life"
NEW, CONTINUE = "new", "continue"


@dataclass(frozen=True)
class LifeChoice:
    """The ``stream_life`` option: what to do with an origin created at ``created``."""

    mode: str
    created: str

    @classmethod
    def parse(cls, text: str | None) -> LifeChoice | None:
        if text is None or text == "":
            return None
        mode, sep, created = str(text).partition(":")
        if not sep or mode not in (NEW, CONTINUE) or not created.strip():
            raise ConfigError(FIELD, f"must be new:<created> or continue:<created>, with the origin stream's "
                                     f"creation time as the job's refusal prints it (got {text!r})")
        return cls(mode, created.strip())

    def __str__(self) -> str:
        return f"{self.mode}:{self.created}"


@dataclass(frozen=True)
class Life:
    """One life of an origin stream in a sink: its creation time and the key it lands under."""

    created: str
    key: str


class StreamLifeChanged(ConfigError):
    """The origin is a life of its name the table does not know (deleted and created again?)."""

    def __init__(self, stream: str, known: Life, created: str) -> None:
        self.stream, self.known, self.created = stream, known, created
        super().__init__(FIELD, (
            f"origin stream {stream!r} was created at {created}, but this table holds messages of a stream "
            f"of that name created at {known.created} (another life: deleted and created again, or restored "
            "elsewhere); nothing was acknowledged or written. To land it as a new stream beside the old "
            f"one: --stream-life new:{created} (operator: stream_life=\"new:{created}\"); if it holds the same "
            f"messages (a restored backup): --stream-life continue:{created}"))


LIFE_SEPARATOR = "#"


def life_key(stream: str, n: int) -> str:
    """The key of a stream's n-th life in a sink (1: the stream's name)."""
    return stream if n == 1 else f"{stream}{LIFE_SEPARATOR}{n}"


def life_number(key: str | None) -> int:
    """Which life of its stream a key names (``life_key``'s inverse: ``ORDERS`` 1, ``ORDERS#2`` 2)."""
    _, sep, n = (key or "").rpartition(LIFE_SEPARATOR)
    return int(n) if sep and n.isdigit() else 1


def decide(stream: str, created: str, lives: Sequence[Life], choice: LifeChoice | None,
           first_key: str | None = None) -> tuple[Life, bool]:
    """The life of an origin created at ``created``, given the ``lives`` a sink holds (oldest
    first), and whether the sink must record it. Raises ``StreamLifeChanged`` or a
    ``ConfigError`` for a choice that names another creation time. ``first_key``: the key a
    sink that holds no life of the stream takes (the stream's name unless the other tables of
    a routed landing know this life by another key)."""
    for life in lives:
        if life.created == created:
            return life, False
    if not lives:
        return Life(created, first_key or stream), True
    if choice is None:
        raise StreamLifeChanged(stream, lives[-1], created)
    if choice.created != created:
        raise ConfigError(FIELD, f"names a stream created at {choice.created}, but origin stream {stream!r} was "
                                 f"created at {created}; nothing was acknowledged or written")
    if choice.mode == CONTINUE:
        return Life(created, lives[-1].key), True
    return Life(created, life_key(stream, len({life.key for life in lives}) + 1)), True


async def origin_created(api: JsApi, stream: str) -> str:
    """The origin stream's creation time, as its stream info gives it."""
    info = await api.stream_info(stream)
    created = info.get("created")
    if not created:
        raise ConfigError("stream", f"stream {stream!r} has no creation time in its info")
    return str(created)
