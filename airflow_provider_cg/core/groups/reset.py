"""Moving a group's (or one member's) position, as ``kafka-consumer-groups --reset-offsets`` does.

A partition's *position* is the origin sequence of the next message its member will process.
``plan_reset`` says what a reset would do (per member and partition: position now and after,
messages that will be processed again or skipped) and changes nothing; ``execute_reset``
applies a plan after checking it still holds.

- Static groups: a member's durable consumer has one position over all its partitions; it
  moves with ``$JS.API.CONSUMER.RESET`` (nats-server 2.14+; older servers are refused, naming
  their version). A shift moves it by that many messages of the member's partitions.
- Elastic groups: what is stored in the work-queue stream is pending. Forward, a filtered purge
  per partition removes the messages skipped. Backward, the messages are no longer in the
  work queue: sourcing is stopped, the work queue purged, the origin re-sourced from the lowest
  new position, and each partition purged up to its own position (partitions not reset keep
  theirs). Messages landed before and replayed now are no-ops in every sink (they drop
  ``(origin_stream, origin_seq)`` they hold). A shift moves only forward here: an elastic
  origin does not carry the partition, so "N messages back in partition p" has no cheap answer;
  ``to_seq`` / ``to_datetime`` move back.

As in Kafka, the group must be inactive: a reset is refused while an instance of an affected
member is pinned, unless ``force``, which steps them down first (a job that loses its pin rolls
its batch back before acknowledging it). orbit's instances cannot be stepped down for good (an
orbit instance re-creates its member consumer): stop them before a reset.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConfigError, JetStreamApiError
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups import partitioning, sourcing
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.consumers import (
    PRIORITY_GROUP,
    STATIC_ACK_WAIT,
    pinned_id,
    priority_group_of,
    static_max_ack_pending,
)
from airflow_provider_cg.core.groups.reset_plan import (
    PositionChange,
    ResetPlan,
    ResetRefused,
    ResetTarget,
    target_of,
)
from airflow_provider_cg.core.groups.store import ELASTIC, consumer_name_of, consumer_stream_of
from airflow_provider_cg.core.jetstream.api import JsApi, server_version

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.aio.client import Client as NATS

    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig

    #: how many messages are stored from a sequence on
    PendingFrom = Callable[[int], Awaitable[int]]


class GroupReset:
    """Plans and executes resets on one connection (``js_prefix`` as the rest of ``core``)."""

    def __init__(self, nc: NATS, js_prefix: str = "$JS.API", batch_size: int = 100_000) -> None:
        """``batch_size``: the member jobs' (it sizes a static durable this creates, as they would)."""
        self.nc, self.batch_size = nc, batch_size
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.api = JsApi(nc, prefix=js_prefix)

    # --- planning ----------------------------------------------------------------------------

    async def plan(self, stream: str, group: str, target: ResetTarget, member: str | None = None) -> ResetPlan:
        info = await self.groups.get(stream, group)
        cfg = info.config
        (await self.groups.layout(info)).check_repartition("reset", stream, group)
        if member is not None and not cgconfig.in_membership(cfg, member):
            raise ConfigError("member", f"{member!r} is not a member of group {group!r} on stream {stream!r}")
        members = [member] if member is not None else sorted(partitioning.assign_partitions(cfg))
        origin = (await self.api.stream_info(stream))["state"]
        first, last = int(origin.get("first_seq", 1)), int(origin.get("last_seq", 0))
        plan = ResetPlan(stream, group, info.kind, member, target.describe(), first, last)
        cstream = consumer_stream_of(info.kind, stream, group)
        for m in members:
            c = await self.api.consumer_info(cstream, consumer_name_of(info.kind, group, m))
            pin = pinned_id(c)
            if pin:
                plan.pinned[m] = pin
        absolute = await self._absolute(stream, target, first, last)
        if isinstance(cfg, cgconfig.ElasticGroupConfig):  # the kind's config (``info.kind == ELASTIC``)
            await self._plan_elastic(plan, cfg, members, target, absolute)
        else:
            await self._plan_static(plan, cfg, members, target, absolute)
        return plan

    async def _absolute(self, stream: str, target: ResetTarget, first: int, last: int) -> int | None:
        """The origin sequence a target names for every partition (None for a shift)."""
        if target.mode == "to_earliest":
            return first
        if target.mode == "to_latest":
            return last + 1
        if target.mode == "to_seq":
            return min(max(target.value, first), last + 1)
        if target.mode in ("to_datetime", "by_duration"):
            when = target.value if target.mode == "to_datetime" else \
                dt.datetime.now(dt.UTC) - dt.timedelta(seconds=target.value)
            try:
                msg = await self.api.request(f"STREAM.MSG.GET.{stream}",
                                             {"start_time": when.isoformat().replace("+00:00", "Z")})
            except JetStreamApiError as e:
                if e.code == 404:
                    return last + 1  # nothing stored at or after that time
                raise
            return int(msg["message"]["seq"])
        return None

    async def _count(self, pending_from: PendingFrom, lo: int, hi: int) -> int:
        """Messages with sequence in ``[lo, hi)``, from ``pending_from(seq)``: how many are stored
        from ``seq`` on (the server counts)."""
        if hi <= lo:
            return 0
        return await pending_from(lo) - await pending_from(hi)

    def _origin_pending(self, stream: str, filters: list[str]) -> PendingFrom:
        """``pending_from`` over the origin: an ephemeral consumer's pending (it sees every filter
        at once; never on a work queue, which refuses a consumer overlapping its members')."""
        async def pending_from(seq: int) -> int:
            reply = await self.api.request(f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": {
                "deliver_policy": "by_start_sequence", "opt_start_seq": max(seq, 1), "ack_policy": "none",
                "filter_subjects": filters, "inactive_threshold": 10 * 10**9, "mem_storage": True,
                "num_replicas": 1}})
            try:
                return int(reply.get("num_pending", 0))
            finally:
                await self.api.delete_consumer(stream, reply["name"])
        return pending_from

    def _wq_pending(self, wq: str, partition: int) -> PendingFrom:
        """``pending_from`` over one partition of a work queue: a batched direct get of one
        message answers with ``Nats-Num-Pending`` (those after it)."""
        async def pending_from(seq: int) -> int:
            msg = await self.nc.request(f"{self.api.prefix}.DIRECT.GET.{wq}", json.dumps(
                {"seq": max(seq, 1), "next_by_subj": f"{partition}.>", "batch": 1}).encode(), timeout=5.0)
            headers = msg.headers or {}
            if headers.get("Status"):  # 404: nothing from there on
                return 0
            return int(headers.get("Nats-Num-Pending", 0)) + 1
        return pending_from

    async def positions(self, stream: str, group: str) -> dict[int, int]:
        """Per partition the group will land: its position (the origin sequence of the next
        message its member processes; past the origin's last when it is caught up). A static
        partition no member holds is absent: nothing is pending there."""
        info = await self.groups.get(stream, group)
        cfg = info.config
        origin = (await self.api.stream_info(stream))["state"]
        first, last = int(origin.get("first_seq", 1)), int(origin.get("last_seq", 0))
        out: dict[int, int] = {}
        if info.kind == ELASTIC:
            wq = groupnames.work_queue_stream(stream, group)
            sourced = await self._sourced_through(wq, last)
            for p in range(cfg.max_members):
                found = await self._first_in(wq, p, 0)
                out[p] = found[1] if found else sourced + 1
            return out
        for m, parts in partitioning.assign_partitions(cfg).items():
            current = await self._static_position(stream, group, m, first, last)
            out.update({p: current for p in parts})
        return out

    async def _static_position(self, stream: str, group: str, member: str, first: int, last: int) -> int:
        c = await self.api.consumer_info(stream, consumer_name_of(groupnames.STATIC, group, member))
        if c is None:  # no consumer yet: it will start at the stream's first message
            return first
        if int(c.get("num_pending", 0)) + int(c.get("num_ack_pending", 0)) == 0:
            return last + 1  # caught up
        return max(int(c["ack_floor"]["stream_seq"]) + 1, first)

    async def _plan_static(self, plan: ResetPlan, cfg: StaticGroupConfig, members: list[str],
                           target: ResetTarget,
                           absolute: int | None) -> None:
        cstream = plan.stream
        for m in members:
            filters = list(partitioning.member_filter_subjects(cfg, m))
            current = await self._static_position(cstream, plan.group, m, plan.origin_first_seq, plan.origin_last_seq)
            pending = self._origin_pending(cstream, filters)
            new = absolute if absolute is not None else await self._shift(pending, current, target.value,
                                                                          plan.origin_last_seq)
            plan.changes.append(PositionChange(
                m, sorted(partitioning.member_partitions(cfg, m)), current, new,
                replay=await self._count(pending, new, current), skip=await self._count(pending, current, new)))

    async def _shift(self, pending_from: PendingFrom, current: int, by: int, last: int) -> int:
        """The sequence ``by`` messages from ``current``: the lowest from which exactly that many
        fewer (more, backward) messages are pending (``pending_from`` does not grow with seq)."""
        want = await pending_from(current) - by
        lo, hi = (current, last + 1) if by > 0 else (1, current)
        while lo < hi:
            mid = (lo + hi) // 2
            if await pending_from(mid) > want:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def _plan_elastic(self, plan: ResetPlan, cfg: ElasticGroupConfig, members: list[str],
                            target: ResetTarget,
                            absolute: int | None) -> None:
        wq = groupnames.work_queue_stream(plan.stream, plan.group)
        sourced = await self._sourced_through(wq, plan.origin_last_seq)
        assignment = partitioning.assign_partitions(cfg)
        last_wq = int((await self.api.stream_info(wq))["state"].get("last_seq", 0))
        moves: list[tuple[str, int, int, int]] = []
        for m in members:
            for p in sorted(assignment.get(m, [])):
                first = await self._first_in(wq, p, 0)
                current = first[1] if first else sourced + 1
                if absolute is not None:
                    new = absolute
                elif target.value < 0:
                    raise ConfigError("shift_by", "an elastic group moves back with --to-seq or --to-datetime (its "
                                      "origin stream does not record partitions, so a shift back has no position)")
                else:
                    at = await self._shift(self._wq_pending(wq, p), first[0] if first else last_wq + 1, target.value,
                                           last_wq)
                    nth = await self._first_in(wq, p, at)
                    new = nth[1] if nth else sourced + 1
                moves.append((m, p, current, new))
        back = [(p, c, n) for _, p, c, n in moves if n < c]
        replayed = await self._origin_partitions(plan.stream, cfg, min(n for *_, n in back),
                                                 max(c for _, c, _ in back)) if back else {}
        for m, p, current, new in moves:
            skip = await self._count(self._wq_pending(wq, p), *await self._wq_range(wq, p, current, new)) \
                if new > current else 0
            replay = sum(1 for seq, part in replayed.items() if part == p and new <= seq < current)
            plan.changes.append(PositionChange(m, [p], current, new, replay, skip))

    async def _sourced_through(self, wq: str, origin_last: int) -> int:
        """The highest origin sequence the work queue has sourced (the cut, if stopped)."""
        stopped = await sourcing.current_stop(self.api, wq)
        if stopped is not None:
            return stopped.cut
        last = await sourcing.last_sourced(self.api, wq)
        return origin_last if last is None else last

    async def _first_in(self, wq: str, partition: int, from_wq_seq: int) -> tuple[int, int] | None:
        """``(work-queue seq, origin seq)`` of the partition's first stored message from ``from_wq_seq``."""
        msg = await self.api.next_msg(wq, max(from_wq_seq, 1), f"{partition}.>")
        if msg is None:
            return None
        return int(msg["seq"]), sourcing.origin_seq(msg)

    async def _wq_range(self, wq: str, partition: int, current: int, new: int) -> tuple[int, int]:
        """Work-queue sequences ``[lo, hi)`` of the partition's messages with origin seq in
        ``[current, new)``."""
        lo = await self._wq_seq_at(wq, partition, current)
        hi = await self._wq_seq_at(wq, partition, new)
        return lo, hi

    async def _wq_seq_at(self, wq: str, partition: int, origin_seq: int) -> int:
        """The work-queue sequence of the partition's first message whose origin seq is ``>=
        origin_seq`` (one past the stream's end if none): origin sequences grow with work-queue
        ones, so a binary search of direct reads."""
        state = (await self.api.stream_info(wq))["state"]
        lo, hi = int(state.get("first_seq", 1)), int(state.get("last_seq", 0)) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            found = await self._first_in(wq, partition, mid)
            if found is None:
                hi = mid
            elif found[1] >= origin_seq:
                hi = mid
            else:
                lo = found[0] + 1
        return lo

    async def _origin_partitions(self, stream: str, cfg: GroupConfig, lo: int, hi: int) -> dict[int, int]:
        """``{origin seq: partition}`` of the group's messages with sequence in ``[lo, hi)``:
        subjects only (headers-only reads), partitioned as the server does."""
        if hi <= lo:
            return {}
        rules = partitioning.key_rules(cfg)
        filters = [f for f, _ in rules] or [">"]
        js = self.nc.jetstream(prefix=self.api.prefix)  # the connection's API prefix (a domain, an import)
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        sub = await js.pull_subscribe_bind(
            (await js.add_consumer(stream, ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=lo, ack_policy=AckPolicy.NONE,
                headers_only=True, filter_subjects=filters, inactive_threshold=10.0, mem_storage=True))).name,
            stream=stream)
        out: dict[int, int] = {}
        try:
            while True:
                try:
                    msgs = await sub.fetch(5000, timeout=1.0)
                except TimeoutError:
                    return out
                for msg in msgs:
                    seq = msg.metadata.sequence.stream
                    if seq >= hi:
                        return out
                    out[seq] = _partition(msg.subject, cfg, rules)
        finally:
            await sub.unsubscribe()

    # --- execution ---------------------------------------------------------------------------

    async def execute(self, plan: ResetPlan, *, force: bool = False) -> ResetPlan:
        """Apply ``plan`` (made again first, so it is current). Refused while an affected member
        is pinned, unless ``force``: then each is stepped down first."""
        target = ResetTarget(*target_of(plan.target))
        if plan.kind == ELASTIC:
            await self._finish_interrupted(groupnames.work_queue_stream(plan.stream, plan.group))
        fresh = await self.plan(plan.stream, plan.group, target, plan.member)
        if fresh.pinned:
            if not force:
                raise ResetRefused("reset: member(s) " + ", ".join(sorted(fresh.pinned)) + " have a running "
                                   "(pinned) instance; stop them, or --force to step them down first")
            await self._step_down(fresh)
            fresh = await self.plan(plan.stream, plan.group, target, plan.member)
        if fresh.kind == ELASTIC:
            await self._execute_elastic(fresh)
        else:
            await self._execute_static(fresh)
        fresh.executed = True
        return fresh

    async def _finish_interrupted(self, wq: str) -> None:
        """A reset killed after it stopped sourcing: source again from where it recorded (a
        replay of what may have been purged, never a gap). A resize in progress is its own."""
        stopped = await sourcing.current_stop(self.api, wq)
        if stopped is None:
            return
        if stopped.intent.get("op") != "reset":
            raise ResetRefused(f"reset: a resize to {stopped.intent.get('max_members')} partitions is in progress "
                               "on this group; run it again to finish it first")
        await sourcing.resume(self.api, wq, stopped, int(stopped.intent.get("resume_from", stopped.cut + 1)))
        await sourcing.await_sourced(self.api, wq, stopped.cut)  # before positions are read again

    async def _step_down(self, plan: ResetPlan) -> None:
        """Unpin every affected member and wait until no instance is pinned (a standby may be
        pinned in its place: unpinned again, for up to 30 s)."""
        cstream = consumer_stream_of(plan.kind, plan.stream, plan.group)
        deadline = asyncio.get_running_loop().time() + 30
        pending = dict(plan.pinned)
        while pending:
            for m in list(pending):
                name = consumer_name_of(plan.kind, plan.group, m)
                c = await self.api.consumer_info(cstream, name)
                if c is None or not pinned_id(c):
                    del pending[m]
                    continue
                await self.api.unpin(cstream, name, priority_group_of(c["config"]) or PRIORITY_GROUP)
            if pending:
                if asyncio.get_running_loop().time() > deadline:
                    raise ResetRefused("reset: member(s) " + ", ".join(sorted(pending)) + " were pinned again "
                                       "after a step-down; stop their instances")
                await asyncio.sleep(0.5)

    async def _execute_static(self, plan: ResetPlan) -> None:
        if not self.api.can_reset_consumers():
            raise ResetRefused(f"reset: a static group's durables move with $JS.API.CONSUMER.RESET, which needs "
                               f"nats-server 2.14+ (this server is {'.'.join(map(str, server_version(self.nc)))})")
        for c in plan.changes:
            name = consumer_name_of(plan.kind, plan.group, c.member)
            if await self.api.consumer_info(plan.stream, name) is None:  # no job ran yet: create its durable
                await self.groups.ensure_member_consumer(plan.stream, plan.group, c.member, ack_wait=STATIC_ACK_WAIT,
                                                         max_ack_pending=static_max_ack_pending(self.batch_size))
            await self.api.reset_consumer(plan.stream, name, c.new)

    async def _execute_elastic(self, plan: ResetPlan) -> None:
        wq = groupnames.work_queue_stream(plan.stream, plan.group)
        if not any(c.new < c.current for c in plan.changes):
            # what is still on its way into the queue must be there before the skipped part goes
            await sourcing.await_caught_up(self.api, wq)
            for c in plan.changes:
                if c.new > c.current:
                    await self._purge_below(wq, c.partitions[0], c.new)
            return
        # Backward: stop sourcing; every partition's position, now fixed; purge; re-source from
        # the lowest; each partition purged up to its own position.
        stopped = await sourcing.stop(self.api, wq, {"op": "reset", "target": plan.target})
        resume_from: int | None = stopped.cut + 1  # until the queue is purged, nothing needs sourcing again
        try:
            cfg = (await self.groups.get(plan.stream, plan.group)).config
            moved = {c.partitions[0]: c.new for c in plan.changes}
            positions = {}
            for p in range(cfg.max_members):
                first = await self._first_in(wq, p, 0)
                positions[p] = moved.get(p, first[1] if first else stopped.cut + 1)
            resume_from = min(positions.values())
            # where a killed run must resume (a replay, never a gap), before anything is purged
            stopped = await sourcing.record(self.api, wq, stopped, resume_from=resume_from)
            await self.api.request(f"STREAM.PURGE.{wq}", {})
            await sourcing.resume(self.api, wq, stopped, resume_from)
            resume_from = None
            await sourcing.await_sourced(self.api, wq, stopped.cut)
            for p, new in positions.items():
                await self._purge_below(wq, p, new)
        finally:
            if resume_from is not None:  # stopped part way: source again
                await sourcing.resume(self.api, wq, stopped, resume_from)

    async def _purge_below(self, wq: str, partition: int, origin_seq: int) -> None:
        keep_from = await self._wq_seq_at(wq, partition, origin_seq)
        await self.api.request(f"STREAM.PURGE.{wq}", {"filter": f"{partition}.>", "seq": keep_from})


def _partition(subject: str, cfg: GroupConfig, rules: list[tuple[str, tuple[int, ...]]]) -> int:
    for filt, wildcards in rules:
        try:
            return partitioning.partition_of(subject, cfg.max_members, wildcards, filt)
        except ValueError:
            continue
    return partitioning.partition_of(subject, cfg.max_members)
