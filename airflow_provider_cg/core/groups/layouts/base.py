"""What every layout gives (``Layout``), and how a group's layout is recorded.

A layout is where an elastic group's partitions are stored and how its members read them;
``work_queue.py`` (orbit's, and a static group's read of its origin) and
``partition_streams.py`` (one stream per partition, and its ``draining`` state on the way
back) are the layouts. Callers ask the group's layout object (``layouts.of``, ``named``,
``GroupStore.layout``) instead of comparing names: its member consumer's filters, its
readers, its backlog per partition and health, what it allows, and how a group moves into it.

The layout is recorded on the work-queue stream (``metadata["cg.layout"]``; orbit rewrites KV
entries, never the stream); none recorded is ``work-queue``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.jetstream.api import JsApi

if TYPE_CHECKING:
    from airflow_provider_cg.core.groups.config import GroupConfig
    from airflow_provider_cg.core.jetstream.direct_gets import PartitionStreamReaders

WORK_QUEUE = "work-queue"
PARTITION_STREAMS = "partition-streams"
DRAINING = "draining"  # moving from partition-streams back to work-queue
FILLING = "filling"  # moving from work-queue into partition-streams
LAYOUT_KEY = "cg.layout"
REPLICAS_KEY = "cg.partition_replicas"  # on the work queue: the partition streams' replicas, if chosen


class LayoutError(ConsumerGroupError):
    """A layout change cannot go on (the message says what to do)."""


@dataclass
class LayoutMove:
    """What a move did: the layout the group is in now, and whether the move is finished
    (``left``: per partition, what a draining move still waits to be landed)."""

    stream: str
    group: str
    layout: str
    done: bool
    left: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"stream": self.stream, "group": self.group, "layout": self.layout, "done": self.done,
                "left": {str(p): n for p, n in sorted(self.left.items()) if n}}

    def unfinished(self, waited: float) -> str:
        """What a move that is not done waits for, after ``waited`` seconds."""
        n = sum(self.left.values())
        if self.layout == FILLING:
            return (f"filling: {n} messages are still in the work queue after {waited:g}s (their members land "
                    "them; new ones gather in the partition log): run the command again to finish")
        return (f"draining: {n} messages are still in the partition log after {waited:g}s (their members land "
                "them; new ones wait in the work queue): run the command again to finish")


class Mover(Protocol):
    """What a layout's ``enter`` is given to move a group (``moves.LayoutMoves``)."""

    nc: Any
    api: JsApi

    async def drop_member_consumers(self, wq: str, *, partition_filters: bool) -> list[str]: ...


def pin_subjects(wq: str) -> str:
    return f"_cg.pin.{wq}.*"


def pin_subject(wq: str, member: str) -> str:
    return f"_cg.pin.{wq}.{member}"


class Layout:
    """One layout (see the module docstring); the defaults are the work queue's."""

    name: ClassVar[str]
    #: a name ``cg layout`` and the operators take (``draining`` is a state on the way back)
    chosen: ClassVar[bool] = True
    #: members read a stream per partition, not the work queue
    reads_partition_streams: ClassVar[bool] = False
    #: the group has a partition log and partition streams (in this layout or on the way to or from it)
    has_partition_streams: ClassVar[bool] = False
    #: the partition streams are being fed by their mirrors (not while draining back)
    mirrored: ClassVar[bool] = False
    #: only an elastic group can be in it (a static group's members read the origin)
    elastic_only: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<layout {self.name}>"

    def member_filters(self, config: GroupConfig, member: str, wq: str | None = None) -> list[str]:
        """The filter subjects of ``member``'s consumer: its partitions' ([] when it is not a
        member or has no partitions). ``wq``: the consumer's stream."""
        from airflow_provider_cg.core.groups import partitioning
        from airflow_provider_cg.core.groups.config import in_membership

        if not in_membership(config, member):
            return []
        return list(partitioning.member_filter_subjects(config, member))

    def work_queue_config(self, wq_config: dict, replicas: int | None = None) -> dict:
        """The work queue's config recording this layout (``work-queue``: orbit's stream exactly)."""
        cfg = {k: v for k, v in wq_config.items() if k not in ("subjects", "metadata")}
        md = {k: v for k, v in (wq_config.get("metadata") or {}).items()
              if not k.startswith("_nats.") and k not in (LAYOUT_KEY, REPLICAS_KEY)}
        if md:
            cfg["metadata"] = md
        return cfg

    async def record(self, api: JsApi, wq: str, replicas: int | None = None) -> dict:
        """Record this layout on the work queue; its new config."""
        cfg = self.work_queue_config(await wq_config(api, wq), replicas)
        return (await api.request(f"STREAM.UPDATE.{wq}", cfg))["config"]

    def check_server(self, nc: Any) -> None:
        """``ConfigError`` when the connected server cannot hold this layout."""

    def creation_source(self, wq_cfg: dict) -> tuple[dict, dict | None]:
        """A new group's work-queue config in this layout, and the source ``prepare`` gives
        elsewhere (None: the work queue sources the origin itself)."""
        return wq_cfg, None

    async def prepare(self, api: JsApi, wq: str, partitions: int, deadline: float, source: dict | None = None) -> None:
        """What a group created in this layout needs besides its work queue ``wq`` (``source``:
        the origin's source, when the work queue does not hold it)."""

    def check_repartition(self, what: str, stream: str, group: str) -> None:
        """``ConfigError`` unless a ``reset`` or ``resize`` (``what``) can run in this layout."""

    def partition_readers(self, nc: Any, wq: str, partitions: tuple[int, ...], js_prefix: str
                          ) -> PartitionStreamReaders | None:
        """The readers of a member's partition streams, in a layout that has them (else None:
        the member reads the work queue, or its origin)."""
        return None

    def sourcing_stream(self, wq: str) -> str:
        """The stream that sources the origin (and holds the group's buffered limits)."""
        return wq

    def partition_store(self, wq: str, partition: int) -> str:
        """The stream that holds a partition's messages not yet landed."""
        return wq

    async def backlog(self, api: JsApi, wq: str, wq_subjects: dict[str, int], partitions: Iterable[int],
                      problems: dict[int, str] | None = None) -> dict[int, int]:
        """Per partition, the messages not yet landed; ``wq_subjects``: the work queue's count
        per subject. ``problems``: filled with the partitions whose store is not current, whose
        backlog is then only partly known (None: such a store fails the count)."""
        return count_partitions(dict.fromkeys(partitions, 0), wq_subjects)

    async def problems(self, api: JsApi, wq: str, partitions: tuple[int, ...]) -> dict[int, str]:
        """The partitions whose store is not current, and why (none in the work queue)."""
        return {}

    async def oldest(self, api: JsApi, wq: str, partition: int, problems: dict[int, str]) -> Any:
        """The oldest message of a partition not yet landed (None when there is none)."""
        return await api.next_msg(wq, 1, f"{partition}.>")

    async def rebuild(self, api: JsApi, wq: str, partition: int) -> None:
        """Make a partition's stream again from the copy of record (a layout that has them)."""
        raise ConsumerGroupError(f"the {self.name} layout has no partition streams to rebuild")

    def rebuilds(self, why: str) -> bool:
        """Whether ``rebuild`` heals a partition whose store has the problem ``why``."""
        return False

    async def enter(self, moves: Mover, stream: str, group: str, have: Layout, wq_cfg: dict, partitions: int,
                    deadline: float, replicas: int | None) -> LayoutMove:
        """Move a group that is in ``have`` into this layout (``moves.py``)."""
        raise NotImplementedError


def count_partitions(partitions: dict[int, int], subjects: dict[str, int]) -> dict[int, int]:
    """Add per-subject counts of subjects whose first token is the partition (``<p>.<subject>``)
    to ``partitions``."""
    for subject, n in subjects.items():
        first = subject.split(".", 1)[0]
        if first.isdigit():
            p = int(first)
            partitions[p] = partitions.get(p, 0) + int(n)
    return partitions


async def wq_config(api: JsApi, wq: str) -> dict:
    return (await api.stream_info(wq))["config"]


def recorded_name(wq_config: dict) -> str:
    """The layout's name recorded on a work-queue stream's config (``work-queue`` when none is)."""
    return (wq_config.get("metadata") or {}).get(LAYOUT_KEY) or WORK_QUEUE


def check_name(field: str, value: Any, names: tuple[str, ...]) -> str:
    if value not in names:
        raise ConfigError(field, f"must be one of {', '.join(names)} (got {value!r})")
    return value
