"""Which life of its origin stream a landed message came from, and where a life begins.

A stream sequence names one message only within one life of its stream. Two events make it
name another:

- **a stream deleted and created again** under the same name starts its sequences at 1 again;
- **a store that comes back older** (a power loss under nats-server's lazy fsync, a restored
  disk, VM or volume snapshot) keeps the stream's creation time, but its last sequence goes
  back, and the next messages published take the sequences of the ones it lost.

Without a record of which life a message belongs to, the second life's messages would be
dropped as duplicates of the first's. So a sink records, per origin stream name, each life it
has landed (``Life``): the stream's creation time (``created`` in the stream info), the key its
messages land under (the ``origin_stream`` of their rows and of every exactly-once key: the
stream's name for the first life, ``<name>#<n>`` for the n-th) and the first sequence it names:
1, or after a store went back to sequence R, R + 1 (the messages up to R are still those the
table landed; ``OriginKeys`` maps a sequence to its key). What tells the lives apart:

- the creation time, which survives a server restart, a change of replicas or a move in a
  cluster (the stream assignment keeps it) and a restore on a single server (``RestoreStream``
  sets the snapshot's); a clustered restore and a mirror get their own and show as a new life;
- the table's **marks** (``OriginMark``): with every batch it commits a sink records the last
  message's sequence and stored time, and ``protocol/origin_guard.py`` checks, before a job
  reads and before each batch is acknowledged, that the origin still holds that message there.

A job refuses (exit 1, nothing acked, nothing written) an origin the sink cannot place, until
``--stream-life`` says what it is:

- ``new:<created>``: another stream under the same name; its messages land beside the old
  ones, under the next key, and dedupe among themselves;
- ``continue:<created>``: the same messages as the latest life (a restored backup, a clustered
  restore): they dedupe against what the table holds, and the table's marks are checked on it;
- ``went-back:<seq>``: the origin went back to ``seq`` (its messages up to there are the
  table's, those after are others): they land under the next key, from ``seq + 1``, beside the
  lost ones, and dedupe among themselves, never against the lost ones.

A purge is not a new life: sequences go on. A sink written by a version without lives takes
the life it meets first as its first; one written without marks is checked from its first mark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_cg.core.jetstream.api import JsApi

FIELD = "stream_life"
NEW, CONTINUE, WENT_BACK = "new", "continue", "went-back"


@dataclass(frozen=True)
class OriginMark:
    """What a table knows the origin held: the message at ``seq`` was stored at ``ts``
    (nanoseconds since the epoch), landed under ``key``."""

    key: str
    seq: int
    ts: int

    def to_list(self) -> list:
        return [self.key, self.seq, self.ts]

    @classmethod
    def from_list(cls, data: Sequence | None) -> OriginMark | None:
        return cls(str(data[0]), int(data[1]), int(data[2])) if data else None


@dataclass(frozen=True)
class LifeChoice:
    """The ``stream_life`` option: what to do with an origin created at ``created`` (``new``,
    ``continue``), or one that went back to sequence ``seq`` (``went-back``; ``anchor``: that
    message as the origin holds it, set once the job has checked it)."""

    mode: str
    created: str = ""
    seq: int = 0
    anchor: OriginMark | None = None

    @classmethod
    def parse(cls, text: str | None) -> LifeChoice | None:
        if text is None or text == "":
            return None
        mode, sep, value = str(text).partition(":")
        value = value.strip()
        if mode == WENT_BACK and sep and value.isdigit() and int(value) >= 0:
            return cls(mode, seq=int(value))
        if not sep or mode not in (NEW, CONTINUE) or not value:
            raise ConfigError(FIELD, f"must be new:<created>, continue:<created> or went-back:<sequence>, with the "
                                     f"creation time or the sequence as the job's refusal prints it (got {text!r})")
        return cls(mode, value)

    def __str__(self) -> str:
        return f"{self.mode}:{self.seq if self.mode == WENT_BACK else self.created}"


@dataclass(frozen=True)
class Life:
    """One life of an origin stream in a sink: its creation time, the key it lands under, the
    first sequence it names (after a store went back, the first new one) and, then, the
    message before it as the origin held it when the life was recorded (``anchor``)."""

    created: str
    key: str
    from_seq: int = 1
    anchor: OriginMark | None = None

    def to_list(self) -> list:
        return [self.created, self.key, self.from_seq, self.anchor.to_list() if self.anchor else None]

    @classmethod
    def from_list(cls, data: Sequence) -> Life:
        """A stored life (``to_list``; a life written before ``from_seq`` has two fields)."""
        anchor = OriginMark.from_list(data[3]) if len(data) > 3 else None
        return cls(str(data[0]), str(data[1]), int(data[2]) if len(data) > 2 else 1, anchor)


@dataclass(frozen=True)
class OriginKeys:
    """The keys an origin's messages land under, by sequence: ``segments`` are ``(from_seq,
    key)`` in increasing ``from_seq``, each naming the sequences up to the next one's start.
    ``current`` is the key of new messages; ``anchor`` the message before the current segment
    (the last one a rollback left the table), what is checked while the segment has no mark."""

    stream: str
    created: str
    segments: tuple[tuple[int, str], ...]
    anchor: OriginMark | None = None

    @property
    def current(self) -> str:
        return self.segments[-1][1]

    @property
    def keys(self) -> list[str]:
        return [k for _, k in self.segments]

    def key_of(self, seq: int) -> str:
        for start, key in reversed(self.segments):
            if seq >= start:
                return key
        return self.segments[0][1]

    def split(self, seqs: np.ndarray) -> dict[str, np.ndarray]:
        """``seqs`` by the key each lands under (one key: no copy)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if len(self.segments) == 1:
            return {self.current: seqs}
        out: dict[str, np.ndarray] = {}
        where = self._segment_index(seqs)
        for i, (_, key) in enumerate(self.segments):
            part = seqs[where == i]
            if len(part):
                out[key] = np.concatenate([out[key], part]) if key in out else part
        return out

    def mask(self, seqs: np.ndarray, held: Callable[[str, np.ndarray], np.ndarray]) -> np.ndarray:
        """A mask over ``seqs``: ``held(key, its seqs)`` asked once per key they land under."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if len(self.segments) == 1:
            return held(self.current, seqs)
        out = np.zeros(len(seqs), dtype=bool)
        where = self._segment_index(seqs)
        for i, (_, key) in enumerate(self.segments):
            rows = where == i
            if rows.any():
                out[rows] = held(key, seqs[rows])
        return out

    def _segment_index(self, seqs: np.ndarray) -> np.ndarray:
        starts = np.asarray([s for s, _ in self.segments], dtype=np.int64)
        return np.clip(np.searchsorted(starts, seqs, side="right") - 1, 0, len(starts) - 1)

    def apply(self, table: pa.Table) -> pa.Table:
        """Rows of this origin under their keys: ``origin_stream`` becomes each row's key."""
        if table.num_rows == 0:
            return table
        i = table.schema.get_field_index("origin_stream")
        if len(self.segments) == 1:
            key = self.current
            streams = table.column(i)
            if streams.null_count == 0 and pc.all(pc.equal(streams, key)).as_py():
                return table
            return table.set_column(i, table.schema.field(i), pa.array([key] * table.num_rows, pa.string()))
        where = self._segment_index(table.column("origin_seq").to_numpy())
        names = np.asarray([k for _, k in self.segments], dtype=object)
        return table.set_column(i, table.schema.field(i), pa.array(names[where], pa.string()))

    def to_list(self) -> list:
        """As a batch plan carries it to Spark's tasks (``nats_source.py``)."""
        return [[s, k] for s, k in self.segments]

    @classmethod
    def single(cls, key: str) -> OriginKeys:
        return cls(key, "", ((1, key),))

    @classmethod
    def from_list(cls, data: Sequence | str | None) -> OriginKeys | None:
        """A plan's keys (``to_list``; a plan of an older version names one key)."""
        if data is None:
            return None
        if isinstance(data, str):
            return cls.single(data)
        return cls("", "", tuple((int(pair[0]), str(pair[1])) for pair in data))


class StreamLifeChanged(ConfigError):
    """The origin is a life of its name the table does not know (deleted and created again?)."""

    def __init__(self, stream: str, known: Life, created: str) -> None:
        self.stream, self.known, self.created = stream, known, created
        super().__init__(FIELD, (
            f"origin stream {stream!r} was created at {created}, but this table holds messages of a stream "
            f"of that name created at {known.created} (another life: deleted and created again, or restored "
            "elsewhere); nothing was acknowledged or written. To land it as a new stream beside the old "
            f"one: --stream-life new:{created} (operator: stream_life=\"new:{created}\"); if it holds the same "
            f"messages (a restored backup, checked against what the table landed): --stream-life continue:{created}"))


LIFE_SEPARATOR = "#"


def life_key(stream: str, n: int) -> str:
    """The key of a stream's n-th life in a sink (1: the stream's name)."""
    return stream if n == 1 else f"{stream}{LIFE_SEPARATOR}{n}"


def life_number(key: str | None) -> int:
    """Which life of its stream a key names (``life_key``'s inverse: ``ORDERS`` 1, ``ORDERS#2`` 2)."""
    _, sep, n = (key or "").rpartition(LIFE_SEPARATOR)
    return int(n) if sep and n.isdigit() else 1


def _next_key(stream: str, lives: Sequence[Life]) -> str:
    return life_key(stream, len({life.key for life in lives}) + 1)


def chain(lives: Sequence[Life], created: str) -> list[Life]:
    """The lives of the origin created at ``created``, in the order they were recorded."""
    return [life for life in lives if life.created == created]


def decide(stream: str, created: str, lives: Sequence[Life], choice: LifeChoice | None,
           like: Sequence[Life] = ()) -> list[Life]:
    """The lives a sink holding ``lives`` (oldest first) must record for an origin created at
    ``created``: none when it knows that creation time. Raises ``StreamLifeChanged`` for an
    unknown one without ``choice``, or a ``ConfigError`` for a choice that names another
    creation time. ``like``: the lives a sink holding none of the stream takes (the other tables
    of a routed landing's), else it takes the origin as the stream's first life. A ``went-back``
    choice is recorded by ``went_back`` once the job has checked it; for an unknown creation
    time it means ``continue`` (a restored copy, older than what the table landed)."""
    if chain(lives, created):
        return []
    if not lives:
        if like:
            latest = chain(like, created) or chain(like, like[-1].created)
            return [replace(life, created=created) for life in latest]
        return [Life(created, stream)]
    if choice is None:
        raise StreamLifeChanged(stream, lives[-1], created)
    if choice.mode != WENT_BACK and choice.created != created:
        raise ConfigError(FIELD, f"names a stream created at {choice.created}, but origin stream {stream!r} was "
                                 f"created at {created}; nothing was acknowledged or written")
    if choice.mode == NEW:
        return [Life(created, _next_key(stream, lives))]
    # the same messages as the latest life: its lives, under this creation time
    return [replace(life, created=created) for life in chain(lives, lives[-1].created)]


def went_back(stream: str, created: str, lives: Sequence[Life], anchor: OriginMark) -> list[Life]:
    """The life to record when the origin created at ``created`` went back to ``anchor.seq``
    (checked by the job): its messages from ``anchor.seq + 1`` on land under a key of their
    own. None to record when the sink holds that life already. (A life is one creation time
    and one key: after a store went back to 0, two lives of one creation time start at 1.)"""
    if any(life.from_seq == anchor.seq + 1 for life in chain(lives, created)[1:]):
        return []
    return [Life(created, _next_key(stream, lives), anchor.seq + 1, anchor)]


def to_record(stream: str, created: str, lives: Sequence[Life], choice: LifeChoice | None,
              like: Sequence[Life] = ()) -> list[Life]:
    """What a sink holding ``lives`` records next (``decide``, then a checked ``went-back``)."""
    new = decide(stream, created, lives, choice, like)
    if not new and choice is not None and choice.anchor is not None:
        new = went_back(stream, created, lives, choice.anchor)
    return new


def origin_keys(stream: str, created: str, lives: Sequence[Life]) -> OriginKeys:
    """Where the messages of the origin created at ``created`` land (its lives in ``lives``):
    each later life of the same creation time takes over from its first sequence on."""
    segments: list[tuple[int, str]] = []
    anchor = None
    for life in chain(lives, created):
        segments = [s for s in segments if s[0] < life.from_seq] if segments else []
        segments.append((life.from_seq, life.key))
        anchor = life.anchor
    if not segments:
        raise ConfigError(FIELD, f"origin stream {stream!r} created at {created} has no life in this table")
    return OriginKeys(stream, created, tuple(segments), anchor)


async def origin_created(api: JsApi, stream: str) -> str:
    """The origin stream's creation time, as its stream info gives it."""
    info = await api.stream_info(stream)
    created = info.get("created")
    if not created:
        raise ConfigError("stream", f"stream {stream!r} has no creation time in its info")
    return str(created)
