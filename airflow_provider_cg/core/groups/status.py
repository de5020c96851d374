"""What a group looks like to the server, cheap enough to poll: per-partition backlog and
each member's consumer state (pinned instance, pending, waiting requests)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_cg.core.errors import ConsumerGroupError, JetStreamApiError
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import layouts, partitioning, problems, sourcing
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, StaticGroupConfig
from airflow_provider_cg.core.groups.consumers import MemberConsumers, filters_of, pin_state
from airflow_provider_cg.core.groups.layouts.base import count_partitions
from airflow_provider_cg.core.groups.store import (
    ELASTIC,
    GroupBroken,
    GroupInfo,
    GroupStore,
    consumer_name_of,
    consumer_stream_of,
)
from airflow_provider_cg.core.jetstream.api import ERR_STREAM_NOT_FOUND


@dataclass
class MemberState:
    """One member as the server sees it (from its consumer's info)."""

    member: str
    partitions: list[int]
    consumer_exists: bool
    pinned_id: str | None = None
    pinned_since: str | None = None
    num_pending: int = 0
    num_ack_pending: int = 0
    num_redelivered: int = 0
    num_waiting: int = 0
    consumer: str = ""
    in_membership: bool = True
    filters_current: bool = True  # False: the consumer's filters are stale (transition pending)
    backlog: int = 0  # messages stored in the member's partitions (see GroupStatus.partitions)
    ack_floor: int = 0  # its consumer's acknowledged-through stream sequence

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupStatus:
    """Backlog and member state of a group, cheap enough to poll every few seconds.

    ``partitions`` counts the messages stored per partition: for an elastic group that is
    the backlog (the work-queue stream drops acknowledged messages); for a static group it
    is what the origin stream holds, consumed or not. ``backlog`` is the elastic work-queue
    size, or for a static group the sum of the member consumers' pending + ack pending.
    """

    kind: str
    stream: str
    group: str
    max_members: int
    partitions: dict[int, int]
    members: list[MemberState]
    backlog: int
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    unassigned_partitions: list[int] = field(default_factory=list)
    inactive_members: list[str] = field(default_factory=list)
    buffered_msgs: int | None = None
    buffered_bytes: int | None = None
    max_buffered_msgs: int | None = None
    max_buffered_bytes: int | None = None
    #: origin messages on the group's filters its sourcing stream has not taken (``sourcing.not_taken``)
    source_lag: int | None = None
    #: why the source is stalled (``sourcing.stalled``): the server retries it later; member jobs restart it
    source_stalled: str | None = None
    sourcing_stopped: dict | None = None  # a reset or resize stopped sourcing: {"op", "cut", ...}
    #: what the group's jobs found that no server state shows (``problems.py``): kind -> what
    problems: dict[str, dict] = field(default_factory=dict)
    revision: int = 0
    ts: float = 0.0
    layout: str = layouts.DEFAULT  # where an elastic group's partitions are stored (``layouts/``)
    #: partition streams that are not current (no leader, a failed or stalled mirror): partition ->
    #: why; their backlog is unknown beyond what their mirrors have yet to move
    partition_problems: dict[int, str] = field(default_factory=dict)

    @property
    def buffer_fill(self) -> float | None:
        """Fraction of the elastic buffer in use (the tighter of msgs and bytes), if limited."""
        fills = []
        if self.max_buffered_msgs and self.max_buffered_msgs > 0 and self.buffered_msgs is not None:
            fills.append(self.buffered_msgs / self.max_buffered_msgs)
        if self.max_buffered_bytes and self.max_buffered_bytes > 0 and self.buffered_bytes is not None:
            fills.append(self.buffered_bytes / self.max_buffered_bytes)
        return max(fills) if fills else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["partitions"] = {str(p): n for p, n in sorted(self.partitions.items())}
        d["partition_problems"] = {str(p): why for p, why in sorted(self.partition_problems.items())}
        d["buffer_fill"] = self.buffer_fill
        return d




class GroupObservation:
    """Member state and backlog of a group."""

    def __init__(self, store: GroupStore, consumers: MemberConsumers) -> None:
        self.store, self.consumers, self.api = store, consumers, store.api

    async def member_info(self, stream: str, group: str, kind: str | None = None) -> list[MemberState]:
        info = await self.store.get(stream, group, kind)
        return await self._member_states(info)

    async def _member_states(self, info: GroupInfo, layout: layouts.Layout | None = None) -> list[MemberState]:
        cstream = consumer_stream_of(info.kind, info.stream, info.group)
        layout = layout or await self.store.layout(info)
        consumers = await self.consumers.member_consumers(info, cstream)
        assignment = partitioning.assign_partitions(info.config)
        out: list[MemberState] = []
        for member in sorted(set(cgconfig.current_members(info.config)) | set(consumers)):
            c = consumers.get(member)
            inm = cgconfig.in_membership(info.config, member)
            parts = sorted(assignment.get(member, [])) if inm else []
            st = MemberState(
                member=member,
                partitions=parts,
                consumer_exists=c is not None,
                consumer=consumer_name_of(info.kind, info.group, member),
                in_membership=inm,
            )
            if c is not None:
                st.pinned_id, st.pinned_since = pin_state(c)
                st.num_pending = int(c.get("num_pending", 0))
                st.num_ack_pending = int(c.get("num_ack_pending", 0))
                st.num_redelivered = int(c.get("num_redelivered", 0))
                st.num_waiting = int(c.get("num_waiting", 0))
                st.ack_floor = int((c.get("ack_floor") or {}).get("stream_seq", 0))
                st.filters_current = sorted(filters_of(c["config"])) == sorted(
                    layout.member_filters(info.config, member, cstream)
                )
            out.append(st)
        return out

    async def _sourcing_info(self, name: str) -> dict:
        """Stream info of the stream that sources the origin, or an empty one while it is away
        (its partitions' problems say so)."""
        try:
            return await self.api.stream_info(name)
        except ConsumerGroupError:
            return {"state": {}}

    async def status(self, stream: str, group: str, kind: str | None = None) -> GroupStatus:
        """Per-partition backlog, per-member state and totals (one KV get, the member consumers,
        and for an elastic group two stream infos: its layout first, its messages last)."""
        info = await self.store.get(stream, group, kind)
        cfg = info.config
        si = None
        layout: layouts.Layout = layouts.ORIGIN
        if info.kind == ELASTIC:
            wq = groupnames.work_queue_stream(stream, group)
            try:
                si = await self.api.stream_info(wq)  # its layout, which says where the member consumers are
            except JetStreamApiError as e:
                if e.err_code != ERR_STREAM_NOT_FOUND:
                    raise
                raise GroupBroken(f"the work-queue stream {wq!r} of elastic group {group!r} is missing "
                                  f"(deleted?): create the group again (same config) to restore it, or remove "
                                  f"the group") from None
            layout = layouts.of(si.get("config") or {})
        members = await self._member_states(info, layout)
        partitions = {p: 0 for p in range(cfg.max_members)}
        st = GroupStatus(
            kind=info.kind,
            stream=stream,
            group=group,
            max_members=cfg.max_members,
            partitions=partitions,
            members=members,
            backlog=0,
            num_pending=sum(m.num_pending for m in members),
            num_ack_pending=sum(m.num_ack_pending for m in members),
            num_redelivered=sum(m.num_redelivered for m in members),
            revision=info.revision,
            ts=time.time(),
            layout=layout.name,
        )
        if si is not None and isinstance(cfg, ElasticGroupConfig):
            # the messages read after the consumers: while the origin is sourced, the partitions
            # never show fewer than the members' pending counts do
            si = await self.api.stream_info(wq, subjects_filter=">")
            partitions.update(await layout.backlog(self.api, wq, si["state"].get("subjects") or {},
                                                   range(cfg.max_members), st.partition_problems))
            # the work queue's messages, unless members read elsewhere (each counted once there)
            st.backlog = sum(partitions.values()) if layout.has_partition_streams \
                else int(si["state"].get("messages", 0))
            # the buffer and the source are where the origin is sourced to (the work queue, or the partition log)
            src = si if layout.sourcing_stream(wq) == wq else await self._sourcing_info(layout.sourcing_stream(wq))
            st.buffered_msgs = int(src["state"].get("messages", 0))
            st.buffered_bytes = int(src["state"].get("bytes", 0))
            st.max_buffered_msgs = cfg.max_buffered_msgs or None
            st.max_buffered_bytes = cfg.max_buffered_bytes or None
            await self._source_health(st, cfg, src)
            stopped = sourcing.stopped_state(si.get("config") or {})
            if stopped is not None:
                st.sourcing_stopped = {**stopped.intent, "cut": stopped.cut}
        elif isinstance(cfg, StaticGroupConfig):
            for f in cfg.filters or [">"]:
                try:
                    si = await self.api.stream_info(stream, subjects_filter=f if f == ">" else f"*.{f}")
                except JetStreamApiError as e:
                    if e.err_code != ERR_STREAM_NOT_FOUND:
                        raise
                    raise GroupBroken(f"the origin stream {stream!r} of static group {group!r} is missing "
                                      "(deleted?)") from None
                count_partitions(partitions, si["state"].get("subjects") or {})
            st.backlog = st.num_pending + st.num_ack_pending
        assigned = set()
        for m in members:
            m.backlog = sum(partitions.get(p, 0) for p in m.partitions)
            assigned.update(m.partitions)
            if m.in_membership and m.partitions and not m.consumer_exists:
                st.inactive_members.append(m.member)
        st.unassigned_partitions = [p for p in range(cfg.max_members) if p not in assigned]
        st.problems = await problems.read(self.api.nc, self.api.prefix, stream, group)
        return st

    async def _source_health(self, st: GroupStatus, cfg: ElasticGroupConfig, src: dict) -> None:
        """The true source lag (not the server's reported ``lag`` alone, which reads 0 while a
        lost origin's source is being made again) and whether the source is stalled."""
        sources = src.get("sources") or []
        if not sources:
            return
        configured = ((src.get("config") or {}).get("sources") or [{}])[0]
        source = {**configured, **sources[0]}
        try:
            origin = await self.api.stream_info(st.stream)
            last = int((origin.get("state") or {}).get("last_seq") or 0)
            filters = [f.filter for f in cfg.partitioning_filters]
            st.source_lag = max(int(source.get("lag", 0)), await sourcing.not_taken(
                self.api, st.stream, sourcing.source_taken(source), filters, last))
        except ConsumerGroupError:  # the origin's server away: what the source says
            st.source_lag = int(source.get("lag", 0))
        st.source_stalled = sourcing.stalled(source, st.source_lag)
