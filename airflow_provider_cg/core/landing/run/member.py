"""Bounded, exclusively pinned consumption of one member into a two-phase sink.

``run_member_batch`` is what the Spark member job runs. ``MemberRun`` is its lifecycle: for
each assignment of partitions, ``setup`` (the ``Assignment``, one frozen value: the member
consumer, its partitions, layout and keys) and ``_open`` (its reader of direct gets, its pin), then the
pin (``pin.py``: acquire, anchor, keep, hand over, release), ``_take_over`` (recover what
earlier holders left), then one reader lands batches (``reads/direct.py``, ``reads/executors.py`` or
``reads/consumer.py``, chosen by ``reads/registry.choose``) until the stop rule says so (``stop_rule.py``: the
target is the backlog found, like Spark's ``Trigger.AvailableNow``), then ``finish``. A
reader gets what it needs as one ``MemberReading`` and changes nothing of the run's. Each
batch:

    prepare (sink staging) -> mark acking -> double-ack all -> commit

The rule for ending a batch is in docs/architecture.md: roll back only when certain that no
ack took effect, otherwise commit; the sink's dedupe on ``(origin_stream, origin_seq)`` makes
a commit of a message that comes back again a no-op.

Per-key order across a takeover: the server moves the pin without waiting for the previous
holder's unacked messages, and a previous holder may be a zombie (stopped, not dead). So a new
holder, before it lands anything, (1) fences the member's partitions in the sink, so no
earlier instance can start acking any more; (2) finishes every prepared write that touches
them (any member's: orphans of dropped members too); (3) waits until every message of the
consumer that is still unacknowledged is in its own hands (earlier holders' in-flight ones
come back to it after their ack wait), and lands them in stream order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound, JetStreamApiError
from airflow_provider_cg.core.groups import layouts, partitioning, problems, sourcing
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, in_membership
from airflow_provider_cg.core.groups.consumers import (
    PRIORITY_GROUP,
    pinned_id,
    priority_group_of,
    static_max_ack_pending,
)
from airflow_provider_cg.core.groups.layouts import Layout
from airflow_provider_cg.core.groups.names import subjects_regex
from airflow_provider_cg.core.groups.store import kind_of
from airflow_provider_cg.core.jetstream import tasks
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.direct_gets import PartitionReader, PartitionStreamReaders
from airflow_provider_cg.core.jetstream.protocol import ConsumerGone
from airflow_provider_cg.core.landing.contract import (
    RESULT_COMMITTED,
    RESULT_EMPTY,
    RESULT_NOT_PINNED,
    RESULT_REVOKED,
    BatchOptions,
    Summary,
)
from airflow_provider_cg.core.landing.modes import StopReason
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, Pipeline
from airflow_provider_cg.core.landing.protocol.dead_letters import DeadLetters
from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard, OriginWentBack
from airflow_provider_cg.core.landing.protocol.two_phase import TwoPhaseLander
from airflow_provider_cg.core.landing.reads.direct import (
    ConsumerPosition,
    PartitionPositions,
    PartitionStreamPositions,
    Positions,
)
from airflow_provider_cg.core.landing.reads.pin import Pin
from airflow_provider_cg.core.landing.reads.reading import Assignment, BatchIds, MemberReading, Progress
from airflow_provider_cg.core.landing.reads.registry import FALLBACK, Reader, ReadPath, choose, read_path
from airflow_provider_cg.core.landing.reads.stop_rule import StopRule
from airflow_provider_cg.core.landing.rows import KeySelector
from airflow_provider_cg.core.landing.run.board import (
    HANDING_OVER,
    WAITING_FOR_PIN,
    WARMING_UP,
    ProgressBoard,
)
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger("airflow_provider_cg.landing")

MEMBERSHIP_POLL = 0.5  # seconds between looks at the group's config while consuming
SOURCE_CHECK_EVERY = 10  # membership polls between looks at the group's source (``_heal_source``)
#: seconds at least between two restarts of a stalled source by one run: a restarted source can
#: stall again while the server's own retry of it is still pending (its back-off timer)
SOURCE_RESTART_GAP = 12.0
MAX_REJOINS = 3  # a run whose member consumer is deleted before its pin joins again this often (in a row)


def _assignment_kept(config: object) -> str:
    """How an overflow member joins and leaves a group without changing how it assigns
    partitions: stickily where it has member mappings, else by the members' blocks."""
    return "sticky" if getattr(config, "member_mappings", None) else "block"


class MemberRun:
    """One member job run (one sink, one summary), as a lifecycle over its parts: the pin, the
    stop rule, the lander and one reader per assignment (see the module docstring)."""

    def __init__(self, nc: NATS, sink: TwoPhaseSink, options: BatchOptions, pipeline: Pipeline, js_prefix: str) -> None:
        if options.member is None:  # the contract requires it unless backfilling (``backfill.py``)
            raise ConfigError("member", "required")
        self.member: str = options.member
        self.nc, self.sink, self.options, self.pipeline = nc, sink, options, pipeline
        self.summary = Summary(options.stream, options.group, options.member)
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.api = JsApi(nc, prefix=js_prefix)
        self.started = time.monotonic()
        self.stop = StopRule(options, self.summary, self.started)
        warming = self.stop.following or options.join
        if warming:  # it lands whatever comes: be ready when it does
            pipeline.start_warm_up()
        self.owner = f"{self.member}/{secrets.token_hex(8)}"  # this run, in the sink's fences
        self.board = ProgressBoard(nc, js_prefix, self.summary, owner=self.owner, interval=options.progress_interval)
        self.progress = Progress(self.summary, options.progress_interval, self.board.post, lambda: self.board.backlog,
                                 lambda: "warm-up" if warming and not pipeline.warm.is_set() else None)
        self.board.backlog_of = self._backlog_now
        self.batch_ids = BatchIds(options.stream, options.group, self.member)
        self.dlq = DeadLetters(nc, self.api, options.stream, options.group)
        self.lander = TwoPhaseLander(sink, self.summary, options.stream, options.group, self.member)
        self.lander.holds_pin = self.still_pinned
        self.batch_size = options.batch_size  # lowered to fit an existing consumer's max_ack_pending
        self._assignment: Assignment | None = None  # the current one (``setup``)
        # the current assignment's layout (a move back to the work queue may change it), reader
        # of direct gets, why it reads through the consumer instead, and pin (``_open``)
        self.layout: Layout  # (set by ``_open``)
        self.reader: PartitionReader | PartitionStreamReaders | None = None
        self.slow_path: str | None = None
        self.pin: Pin | None = None
        self.origin: OriginGuard | None = None  # the origin's life in the sink, checked (``origin_guard.py``)
        self._source_restarted = 0.0  # monotonic time of this run's last restart of a stalled source
        self._source_stored: tuple[int, float] = (-1, 0.0)  # the sourcing stream's last_seq, and since when
        self._pinned_now = False  # the current assignment got its pin (its deliveries may be in flight)

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self) -> Summary:
        talking = asyncio.create_task(self.progress.keep_talking())
        joined = False
        try:
            try:
                if self.options.join:
                    await self._join()
                    joined = True
                s = await self._assignments()
            except OriginWentBack as e:  # what no server state shows: said where the tools look
                await problems.post(self.nc, self.api.prefix, self.options.stream, self.options.group,
                                    problems.ORIGIN_WENT_BACK, e.went.to_dict())
                raise
            self.progress.waiting = "table"
            await self.lander.finish()  # what it committed is readable when the run ends
            return s
        finally:
            talking.cancel()
            self.progress.waiting = None
            self.summary.duration_s = round(time.monotonic() - self.started, 3)
            self.progress.tick(force=True)
            await self.board.close()  # a run that ends otherwise than by releasing its pin
            await self._close_assignment()
            if joined:
                await self._leave()

    async def _join(self) -> None:
        """An overflow member (``join``): once warm, add the member to the group, so its
        partitions move to it when it can serve them (their previous owners' runs hand them
        over within a batch). Already a member (an earlier run that died before it left): it
        stays one, and leaves at this run's end."""
        o = self.options
        await asyncio.to_thread(self.pipeline.warm.wait)  # (the progress line says warm-up meanwhile)
        self.progress.waiting = "join"
        info = await self.groups.get(o.stream, o.group)
        if not isinstance(info.config, ElasticGroupConfig):
            raise ConfigError("join", f"group {o.group!r} is static: its membership is fixed at creation")
        if not in_membership(info.config, self.member):
            info = await self.groups.add_members(o.stream, o.group, [self.member],
                                                 assignment=_assignment_kept(info.config))
        log.info("cg member=%s joined group %s: partitions %s", self.member, o.group,
                 partitioning.member_partitions(info.config, self.member))
        self.progress.waiting = None

    async def _leave(self) -> None:
        """The overflow member's end (``join``): drop it, so its partitions move back to the
        members they came from (their runs take them at their next batch). A run that fails
        here leaves the member in the group: the DAG's restore drops it (and says so)."""
        o = self.options
        try:
            info = await self.groups.get(o.stream, o.group)
            await self.groups.drop_members(o.stream, o.group, [self.member], assignment=_assignment_kept(info.config))
        except Exception as e:  # noqa: BLE001 - what it landed stands; the restore finishes the leave
            log.warning("cg member=%s did not leave group %s (%s): drop it (the overflow DAG's restore does)",
                        self.member, o.group, str(e)[:200] or type(e).__name__)
            return
        log.info("cg member=%s left group %s: its partitions moved back", self.member, o.group)

    async def _assignments(self) -> Summary:
        """Assignment after assignment, while membership changes hand this run new partitions."""
        s = self.summary
        rejoins = 0
        while True:
            try:
                await self._run_assignment()
            except ConsumerGone as e:
                if self._pinned_now and (s.messages_read or s.rows_written):
                    raise
                # The member's consumer was deleted before this assignment got its pin
                # (nothing of ours is in flight): a membership change (the pinned instance
                # re-creates it with new filters; another change's reconciling deletes a
                # consumer not pinned yet, as a run that just handed over re-creates its own),
                # or an inactivity threshold that ran out while this instance was starting.
                # A member that still has partitions joins again while its standby time (a
                # follower: its follow time) lasts; one that has none is revoked.
                if rejoins < MAX_REJOINS and await self._may_rejoin():
                    rejoins += 1
                    log.info("cg member=%s: member consumer deleted (%s); joining again", self.member,
                             e.description)
                    await self._close_assignment()
                    await asyncio.sleep(min(0.2 * rejoins, 1.0))
                    continue
                s.result, s.stop_reason = RESULT_REVOKED, f"member consumer deleted ({e.description})"
                log.info("cg member=%s: %s", self.member, s.stop_reason)
                return s
            if self.stop.revoked is None:
                return s
            rejoins = 0  # it held the pin: a later deletion comes with another membership change
            if not await self._hand_over():
                return s
            log.info("cg member=%s: continuing with partitions %s", self.member, self.assignment.partitions)

    async def setup(self) -> Assignment:
        """The assignment as the group's config says now (``member_assignment``)."""
        return await member_assignment(self.groups, self.api, self.options, self.member, self.batch_size)

    async def _open(self, a: Assignment) -> None:
        """The assignment's reader of direct gets, where its stream serves them (else why not,
        with the remedy: ``slow_path``), and its pin."""
        self.lander.partition_count = a.config.max_members
        self.layout = a.layout
        self.reader, self.slow_path = await direct_reader(self.nc, self.api, a, read_path(self.options.read).direct)
        if self.slow_path:
            log.warning("cg member=%s reads through the consumer, the slow path: %s", self.member, self.slow_path)
        client = PriorityClient(self.nc, a.consumer_stream, a.consumer, a.priority_group)
        self.pin = Pin(self.nc, client, member=self.member, owner=self.owner, anchored=a.partition_streams,
                       ack_wait=a.ack_wait)

    async def _run_assignment(self) -> None:
        """One assignment of partitions: set it up, take the pin, take over, land until the stop
        rule says so (a limit, the end of the backlog, the loss of the pin, a membership
        change), finish. Each step is a method below."""
        o, s, stop = self.options, self.summary, self.stop
        stop.revoked = None
        pin_wait_from = time.monotonic()
        a = self._assignment = await self.setup()
        await self._open(a)
        pin = self._pin()
        if self.origin is None:
            self.origin = await OriginGuard.open(self.api, self.sink, o.stream, o.stream_life, reads_origin=not a.elastic,
                                                 group=o.group)
            self.summary.origin_key = self.origin.keys.current
            self.lander.origin = self.origin
            await problems.clear(self.nc, self.api.prefix, o.stream, o.group)
        await self._heal_source()
        info = await pin.client.consumer_info()
        path = choose(o.read, direct_gets=self.reader is not None)
        reads = self._reader(path, info)
        pin.adopt_timings(info.get("config") or {}, a.ack_wait)
        backlog = await self._backlog(a, info)
        stop.aim(backlog)
        if backlog == 0 and not pinned_id(info) and not stop.following:
            await self.lander.recover(a.partitions)
            s.result, s.stop_reason = (RESULT_COMMITTED if s.messages_read else RESULT_EMPTY), StopReason.EMPTY_BACKLOG
            return
        watcher = asyncio.create_task(self._watch_membership())
        self._pinned_now = False
        try:
            first = await self._wait_for_pin(pin, reads, pin_wait_from)
            if first is None:
                await self._not_pinned(a, pin)
                return
            self._pinned_now = True
            pinned, landed = await self._pinned(a, pin, first)
            declined = await reads.begin(first, pinned)
            if declined is not None:
                self.slow_path = declined
                log.warning("cg member=%s reads through the consumer this run, the slow path: %s", self.member,
                            self.slow_path)
                path = FALLBACK
                reads = self._reader(path, info)
            s.read_path = reads.read_path
            if path is not read_path(o.read):
                s.read_path_reason = self.slow_path
            if not await reads.land(first, landed):
                return
        finally:
            await tasks.stop(watcher)
        s.result = RESULT_COMMITTED if s.messages_read else RESULT_EMPTY
        if stop.revoked is None:
            await self.board.close()  # before the pin goes: the successor's entry comes after
            await self._release_pin()

    async def _backlog_now(self) -> int:
        """The member's backlog as the server counts it this moment, for the run's own reports
        (``board.py``): its consumer's pending and unacknowledged messages, or its partition
        streams' (read only: nothing is rebuilt for a report)."""
        a = self.assignment
        info = {} if a.partition_streams else await self.api.consumer_info(a.consumer_stream, a.consumer) or {}
        return await self._backlog(a, info, rebuild=False)

    async def _backlog(self, a: Assignment, info: dict, *, rebuild: bool = True) -> int:
        """What the member has to land now: its consumer's pending and unacknowledged messages,
        or, when the member consumer holds only pin anchors, its partition streams' (made
        current first, unless ``rebuild`` is off)."""
        if not a.partition_streams:
            return int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))
        if rebuild:
            await self.ensure_partition_streams_current(pinned=False)
        return sum((await self.layout.backlog(self.api, a.consumer_stream, {}, a.partitions)).values())

    async def _wait_for_pin(self, pin: Pin, reads: Reader, pin_wait_from: float) -> list | None:
        """The pin's first pull (None: no pin within the standby time, or revoked meanwhile); a
        follower waits for it (the first message, on an empty work queue) as long as it follows,
        and says meanwhile that it is there, warming up, then warm (``board.py``): a follower
        holding the pin past its follow time hands it over to it."""
        o, stop = self.options, self.stop
        until = max(pin_wait_from + o.standby_timeout, stop.follow_until or 0.0)
        self.progress.waiting = "pin"
        pinned = asyncio.Event()  # (not a cancel: a request of nats-py's turns one into its timeout)
        announcing = asyncio.create_task(self._announce_waiting(pinned)) if stop.following else None
        try:
            return await pin.acquire(until, reads.pin_pull(self.summary.target), lambda: stop.revoked is not None)
        finally:
            self.progress.waiting = None
            if announcing is not None:
                pinned.set()
                await announcing
                await self.board.withdraw()

    async def _announce_waiting(self, done: asyncio.Event) -> None:
        """A waiting follower's entry, every second until ``done``: warming up until its
        pipeline is warm."""
        while not done.is_set():
            warm = self.pipeline.warm.is_set()
            self.progress.waiting = "pin" if warm else "warm-up"
            await self.board.announce(WAITING_FOR_PIN if warm else WARMING_UP)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0)

    async def _not_pinned(self, a: Assignment, pin: Pin) -> None:
        """The run's result when it got no pin: a standby the pinned instance handed the consumer
        over from, another instance holding it, or nothing to land."""
        s, stop = self.summary, self.stop
        if stop.revoked is not None:  # a standby: the pinned instance hands the consumer over
            s.result, s.stop_reason = (RESULT_COMMITTED if s.messages_read else RESULT_REVOKED), stop.revoked
        elif pinned_id(await pin.client.consumer_info()):
            s.result, s.stop_reason = RESULT_NOT_PINNED, StopReason.ANOTHER_HOLDS_PIN
        else:
            await self.lander.recover(a.partitions)
            s.result, s.stop_reason = RESULT_EMPTY, StopReason.NO_MESSAGE_ARRIVED

    async def _pinned(self, a: Assignment, pin: Pin, first: list) -> tuple[dict, set[int]]:
        """Just pinned: say so, then take over (keeping the pin meanwhile: fencing and recovery
        can take longer than the consumer's priority timeout or inactivity threshold, orbit's
        the ack wait, 5 s). Returns the consumer as this run was pinned on it and the sequences
        the take-over's recovery committed."""
        s, stop = self.summary, self.stop
        s.pin_id = pin.pin_id
        if a.partition_streams:  # the pin anchors: nothing to land
            for m in first:
                await pin.client.ack(m)
        pinned = await pin.pinned()
        log.info("cg pinned member=%s pin_id=%s owner=%s target=%d partitions=%s", self.member, s.pin_id,
                 self.owner, s.target, list(a.partitions))
        if stop.follow_until is not None:
            self.board.follow_until = time.time() + stop.follow_left()
        self.board.post()
        keeper = asyncio.create_task(pin.keep_until_lost())
        self.progress.waiting = "take-over"
        try:
            landed = await self._take_over()
        finally:
            await tasks.stop(keeper)
            self.progress.waiting = None
        return pinned, landed

    @property
    def assignment(self) -> Assignment:
        if self._assignment is None:
            raise ConsumerGroupError("no assignment: the member run has not set one up")
        return self._assignment

    def _origin(self) -> OriginGuard:
        if self.origin is None:
            raise ConsumerGroupError("the run has not checked its origin stream")
        return self.origin

    def _pin(self) -> Pin:
        if self.pin is None:
            raise ConsumerGroupError("no pin: the member's assignment is closed")
        return self.pin

    # --- the reader (the path chosen by ``reads/registry.choose``) --------------------------------

    def _reader(self, path: ReadPath, consumer_info: dict) -> Reader:
        """``path``'s reader of this assignment (``consumer_info``: the member consumer's, whose
        limits a consumer reader keeps to)."""
        positions = self._positions(consumer_info["name"]) if path.direct else None
        reads = path.make(self._reading(consumer_info), positions)
        self.batch_size = reads.batch_size  # a consumer's limit holds for the rest of the run
        return reads

    def _reading(self, consumer_info: dict) -> MemberReading:
        """What this assignment's reader is given (``reading.py``)."""
        return MemberReading(
            options=self.options, member=self.member, summary=self.summary, progress=self.progress,
            pin=self._pin(), stop=self.stop, lander=self.lander, sink=self.sink, pipeline=self.pipeline,
            dlq=self.dlq, api=self.api, assignment=self.assignment, origin=self._origin().keys,
            batch_size=self.batch_size,
            batch_ids=self.batch_ids, consumer_info=consumer_info, ensure_current=self.ensure_partition_streams_current,
            rebuild_partition=self.rebuild_partition_stream)

    def _positions(self, consumer: str) -> Positions:
        """Where a direct-get reader of this member reads from, and how it acks a range."""
        if self.reader is None:
            raise ConsumerGroupError("no reader: the member's assignment is closed")
        return positions_of(self.assignment, self.reader, self.api, consumer)

    # --- membership ------------------------------------------------------------------------

    async def _watch_membership(self) -> None:
        """Poll the group's config (whoever changes it: our operators or ``cg``, orbit's ``cg``)
        and revoke the assignment (``StopRule.revoke``) when this member's filters change; the
        readers then stop after the batch in flight has landed."""
        a = self.assignment
        o = self.options
        polls = 0
        while True:
            await asyncio.sleep(MEMBERSHIP_POLL)
            polls += 1
            if polls % SOURCE_CHECK_EVERY == 0:
                await self._heal_source()
            if self.stop.handing_over:
                await self._look_for_successor()
            try:  # in its own kind's bucket only: a missing other bucket is not looked up twice a second
                cfg = (await self.groups.get(o.stream, o.group, kind_of(a.config))).config
            except GroupNotFound:
                self.stop.revoke(StopReason.GROUP_DELETED)
                return
            except Exception as e:  # a server restart, a timeout: look again later
                log.debug("cg member=%s: membership check failed (%s)", self.member, e)
                continue
            now = partitioning.member_filter_subjects(cfg, self.member) if in_membership(cfg, self.member) else []
            if sorted(now) != sorted(a.filters):
                self.stop.revoke(f"membership changed (partitions {list(a.partitions)} -> "
                                 f"{partitioning.member_partitions(cfg, self.member) if now else []})")
                log.info("cg member=%s: %s; finishing the batch in flight", self.member, self.stop.revoked)
                return

    async def _look_for_successor(self) -> None:
        """Past its follow time: hand over to the member's next follower once it waits warm
        (``stop_rule.py``); meanwhile the board says the run is handing over."""
        if self.board.state != HANDING_OVER:
            self.board.state = HANDING_OVER
            self.board.post()
            log.info("cg member=%s: follow time over; landing on until the member's next follower is ready "
                     "(at most %.0f s)", self.member, self.options.handover_wait)
        successor = await self.board.successor()
        if successor is not None:
            log.info("cg member=%s: handing over to %s, warm and waiting for the pin", self.member,
                     successor.get("owner"))
            self.stop.relieve()

    async def _heal_source(self) -> None:
        """As the holder of the group's partition 0 (one run per group): start the group's
        source again when it is stalled (``sourcing.py``: nats-server would wait up to two
        minutes after its origin's server was lost), so the group lands again within seconds
        of the cluster being healthy. Best effort: a failed look is tried again later."""
        a = self.assignment
        if not a.elastic or 0 not in a.partitions or \
                time.monotonic() - self._source_restarted < SOURCE_RESTART_GAP:
            return
        name = self.layout.sourcing_stream(a.consumer_stream)
        try:
            info = await self.api.stream_info(name)
            config = info.get("config") or {}
            stop = sourcing.stopped_state(config)
            sources = info.get("sources") or []
            if (stop is not None and stop.intent.get("op") != sourcing.RESTART) or (stop is None and not sources):
                return  # a reset, resize or move has the source: not ours to start
            if stop is None:
                source = {**(config.get("sources") or [{}])[0], **sources[0]}
                origin = await self.api.stream_info(self.options.stream)
                filters = [f.filter for f in getattr(a.config, "partitioning_filters", ())]
                lag = await sourcing.not_taken(self.api, self.options.stream, sourcing.source_taken(source), filters,
                                               int((origin.get("state") or {}).get("last_seq") or 0))
                stored, now = int((info.get("state") or {}).get("last_seq") or 0), time.monotonic()
                if stored != self._source_stored[0]:
                    self._source_stored = (stored, now)
                why = sourcing.stalled(source, lag, still_for=now - self._source_stored[1])
                if why is None:
                    return
                log.warning("cg member=%s: the group's source into %s is stalled (%s); starting it again",
                            self.member, name, why)
            self._source_restarted = time.monotonic()
            cut = await sourcing.restart(self.api, name)
            log.info("cg member=%s: the source into %s resumes after origin sequence %d", self.member, name, cut)
        except Exception as e:  # noqa: BLE001 - the server away, a race with another tool: look again later
            log.debug("cg member=%s: source check failed (%s)", self.member, e)

    async def _may_rejoin(self) -> bool:
        """Whether the member still has partitions and this run's standby time is not up."""
        o, stop = self.options, self.stop
        if stop.following:
            if stop.follow_left() <= 0:
                return False
        elif time.monotonic() - self.started > o.standby_timeout:
            return False
        try:
            cfg = (await self.groups.get(o.stream, o.group)).config
        except GroupNotFound:
            return False
        return in_membership(cfg, self.member) and bool(partitioning.member_partitions(cfg, self.member))

    async def _hand_over(self) -> bool:
        """After a membership change stopped the reader (the batch in flight landed): as
        orbit's pinned instance does, delete the member's consumer so it can be re-created
        with the new filters (the partitions it lost are then free for their new owners).
        Returns True to go on with the member's new partitions."""
        o, s = self.options, self.summary
        s.stop_reason = self.stop.revoked or ""
        pin = self._pin()
        holds = not self.lander.taken_over and await pin.holds()
        consumer = pin.client.consumer
        await self._close_assignment()
        if not holds:
            return False  # another instance of the member is in charge of the change
        try:
            await self.api.delete_consumer(self.assignment.consumer_stream, consumer)
        except JetStreamApiError as e:
            if e.code != 404:
                raise
        try:
            cfg = (await self.groups.get(o.stream, o.group)).config
        except GroupNotFound:
            cfg = None
        if cfg is None or not in_membership(cfg, self.member) or not partitioning.member_partitions(cfg, self.member):
            if not s.messages_read:
                s.result = RESULT_REVOKED
            return False
        if self.stop.reason() not in (None, self.stop.revoked):
            return False
        return True

    # --- the pin and the takeover -----------------------------------------------------------

    async def _close_assignment(self) -> None:
        pin, reader = self.pin, self.reader
        self.pin = self.reader = None
        if pin is not None:
            await pin.close()
        if reader is not None:
            await reader.close()

    async def still_pinned(self) -> bool:
        """The lander's question before every batch's acks (``Pin.confirm``); no pin: no."""
        return self.pin is not None and await self.pin.confirm()

    async def _release_pin(self) -> None:
        """After a run that ended normally, hand the pin back at once, unless a successor took
        over the member's partitions meanwhile (``Pin.release``)."""
        if self.pin is not None and not self.lander.taken_over:
            await self.pin.release()

    async def _take_over(self) -> set[int]:
        """As the new pin holder, before landing anything: fence the member's partitions in the
        sink and finish what earlier holders left prepared there. Returns the sequences (in the
        consumed stream) of the messages whose rows that recovery committed."""
        a = self.assignment
        writes = await self.lander.take_over(self.owner, a.partitions)
        return {int(q) for w in writes for q in w.refs.get(a.consumer_stream, ())}

    async def ensure_partition_streams_current(self, pinned: bool = True) -> None:
        """The member's partition streams answer, have a leader and a working mirror, or the run
        ends with a server error (exit 2, retried) naming the stream, rather than landing nothing
        from a stream that cannot serve it. A server restart or a leader election heals within
        seconds: the run waits up to its ``standby_timeout`` first, as it would for its pin. A
        stream that is missing or lost messages (its server's store lost) is rebuilt from the
        log by the pin holder (``pinned``), before anything of its partition lands."""
        a = self.assignment
        deadline = time.monotonic() + self.options.standby_timeout
        while True:
            problems = await self.layout.problems(self.api, a.consumer_stream, a.partitions)
            if problems and self.layout.mirrored:  # a move back to the work queue may have stopped the mirrors
                self.layout = layouts.of(await layouts.wq_config(self.api, a.consumer_stream))
                if not self.layout.mirrored:
                    continue
            for p, why in list(problems.items()):
                if self.layout.rebuilds(why):
                    if pinned:
                        await self.rebuild_partition_stream(p)
                    del problems[p]
            if not problems:
                return
            if time.monotonic() >= deadline:
                p, why = min(problems.items())
                raise ConsumerGroupError(
                    f"partition {p}'s stream {self.layout.partition_store(a.consumer_stream, p)} is not current: "
                    f"{why}; nothing of it can be landed until the cluster serves it again (cg status shows it; if "
                    f"its server is gone for good: cg layout {self.options.stream} {self.options.group} "
                    "partition-streams makes it again from the log)")
            log.warning("cg member=%s: partition streams not current (%s); waiting", self.member,
                        "; ".join(f"{self.layout.partition_store(a.consumer_stream, p)}: {why}"
                                  for p, why in sorted(problems.items())))
            await asyncio.sleep(1.0)

    async def rebuild_partition_stream(self, partition: int) -> None:
        """As the pin holder: make partition ``partition``'s stream again from the log (it lost
        messages the log holds: ``PartitionStreamLost``); nothing newer of it has landed."""
        a = self.assignment
        log.warning("cg member=%s: partition %d's stream %s lost messages its log holds; rebuilding it from the "
                    "log before anything newer of it lands", self.member, partition,
                    self.layout.partition_store(a.consumer_stream, partition))
        await self.layout.rebuild(self.api, a.consumer_stream, partition)
        self.summary.rebuilt_partitions.append(partition)


async def member_assignment(groups: ConsumerGroups, api: JsApi, options: BatchOptions, member: str,
                            batch_size: int) -> Assignment:
    """A member's assignment as the group's config says now: its member consumer (as orbit
    creates it; an orbit instance of the member then shares it through the pin, and an existing
    one is used as it is), its partitions and layout. Also the streaming source's
    (``core/streaming/``)."""
    o = options
    group = await groups.get(o.stream, o.group)
    config = group.config
    if not in_membership(config, member):
        raise ConfigError("member", f"{member!r} is not a member of group {o.group!r} on stream {o.stream!r}")
    elastic = isinstance(config, ElasticGroupConfig)
    ack_wait = o.consumer_ack_wait(elastic)
    layout = await groups.layout(group)
    consumer_stream, consumer = await groups.ensure_member_consumer(
        o.stream, o.group, member, ack_wait=ack_wait, layout=layout,
        max_ack_pending=o.max_ack_pending or (None if elastic else static_max_ack_pending(batch_size)),
    )
    existing = await api.consumer_info(consumer_stream, consumer)
    if existing is None:
        raise ConsumerGone(404, "member consumer deleted right after it was ensured")
    key_rules = partitioning.key_rules(config)
    return Assignment(
        config=config, layout=layout, consumer_stream=consumer_stream, consumer=consumer,
        priority_group=priority_group_of(existing.get("config") or {}) or PRIORITY_GROUP, ack_wait=ack_wait,
        elastic=elastic, partition_streams=layout.reads_partition_streams,
        partitions=tuple(partitioning.member_partitions(config, member)),
        filters=tuple(partitioning.member_filter_subjects(config, member)),
        key_rules=key_rules, keys=KeySelector(key_rules))


async def direct_reader(nc: NATS, api: JsApi, a: Assignment, direct: bool
                        ) -> tuple[PartitionReader | PartitionStreamReaders | None, str | None]:
    """The assignment's reader of direct gets (its partition streams', whatever ``direct``
    says), or None and why not, with the remedy (None when ``direct`` is off: not asked)."""
    reader = a.layout.partition_readers(nc, a.consumer_stream, a.partitions, api.prefix)
    if reader is not None or not direct:
        return reader, None
    if a.elastic or api.can_reset_consumers():
        read = await api.stream_info(a.consumer_stream)
        if (read.get("config") or {}).get("allow_direct"):  # orbit's own streams, and origins, may lack it
            return PartitionReader(nc, a.consumer_stream, js_prefix=api.prefix), None
        return None, (f"stream {a.consumer_stream} has no direct gets (allow_direct is off): turn them on "
                      f"(nats stream edit {a.consumer_stream} --allow-direct) for batched reads several times faster")
    return None, ("the server cannot move a static member's durable (nats-server 2.14+ can): upgrade it for "
                  "batched reads several times faster")


def positions_of(a: Assignment, reader: PartitionReader | PartitionStreamReaders, api: JsApi,
                 consumer: str) -> Positions:
    """Where a direct-get reader of the assignment reads from, and how it acks a range."""
    if isinstance(reader, PartitionStreamReaders):
        return PartitionStreamPositions(reader, a.partitions)
    if a.elastic:
        return PartitionPositions(reader, a.partitions, a.config.max_members, list(a.filters))
    only, subjects = None, list(a.filters)
    if set(a.partitions) == set(range(a.config.max_members)):  # one unfiltered scan, not one each
        only, subjects = subjects_regex(a.filters), [">"]
    return ConsumerPosition(reader, api, a.consumer_stream, consumer, subjects, only, list(a.filters))


async def run_member_batch(nc: NATS, sink: TwoPhaseSink, options: BatchOptions, pipeline: Pipeline | None = None,
                           *, js_prefix: str = "$JS.API") -> Summary:
    """Consume the member's backlog as its pinned instance, land it in ``sink``; return the summary.

    ``pipeline`` (``core/landing/pipeline/processing.py``): what happens to each batch before the sink's prepare
    (decoding and the user's transformation in Spark); default: the rows as read."""
    return await MemberRun(nc, sink, options, pipeline or ArrowPipeline(), js_prefix).run()
