"""Bounded, exclusively pinned consumption of one member into a two-phase sink.

``run_member_batch`` is what the Spark member job runs. It joins the member's consumer as a
pinned client (priority group ``PCG``), fixes its target at the backlog it finds (like
Spark's ``Trigger.AvailableNow``), and lands messages batch by batch:

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
import logging
import secrets
import time
from collections.abc import Sequence

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound, JetStreamApiError
from airflow_provider_cg.core.groups import layouts, partitioning
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, in_membership, subjects_regex
from airflow_provider_cg.core.groups.consumers import (
    PRIORITY_GROUP,
    pinned_id,
    priority_group_of,
    static_max_ack_pending,
)
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.direct import PartitionReader, PartitionStreamReaders
from airflow_provider_cg.core.jetstream.protocol import ConsumerGone, PinLost, PullTransient
from airflow_provider_cg.core.landing.consumer_reads import ConsumerReads
from airflow_provider_cg.core.landing.contract import (
    RESULT_COMMITTED,
    RESULT_EMPTY,
    RESULT_NOT_PINNED,
    RESULT_REVOKED,
    BatchOptions,
    Summary,
)
from airflow_provider_cg.core.landing.dead_letters import DeadLetters
from airflow_provider_cg.core.landing.direct_reads import (
    ConsumerPosition,
    DirectReads,
    PartitionPositions,
    PartitionStreamPositions,
)
from airflow_provider_cg.core.landing.pipeline import ArrowPipeline
from airflow_provider_cg.core.landing.rows import BatchId, KeySelector, with_origin_key
from airflow_provider_cg.core.landing.sinks.base import TwoPhaseSink
from airflow_provider_cg.core.landing.stream_life import LifeChoice, origin_created
from airflow_provider_cg.core.landing.two_phase import TwoPhaseLander

log = logging.getLogger("airflow_provider_cg.landing")

MEMBERSHIP_POLL = 0.5  # seconds between looks at the group's config while consuming
MAX_REJOINS = 3  # a run whose member consumer is deleted before it landed anything joins again this often


class Progress:
    """The job's progress line, at most every ``interval`` seconds."""

    def __init__(self, summary: Summary, interval: float) -> None:
        self.summary, self.interval = summary, interval
        self.start = self.last = time.monotonic()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        s = self.summary
        rate = s.messages_read / max(now - self.start, 1e-9)
        left = max(s.target - s.messages_read, 0)
        log.info("cg progress member=%s messages_read=%d rows_written=%d rate=%.0f msg/s backlog_left=%d",
                 s.member, s.messages_read, s.rows_written, rate, left)


class MemberRun:
    """State of one member job run (one pinned client, one sink, one summary)."""

    def __init__(self, nc, sink: TwoPhaseSink, options: BatchOptions, pipeline, js_prefix: str) -> None:
        if options.member is None:  # the contract requires it unless backfilling (``backfill.py``)
            raise ConfigError("member", "required")
        self.member: str = options.member
        self.nc, self.sink, self.options, self.pipeline = nc, sink, options, pipeline
        self.summary = Summary(options.stream, options.group, options.member)
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.api = JsApi(nc, prefix=js_prefix)
        self.started = time.monotonic()
        self.progress = Progress(self.summary, options.progress_interval)
        self.taken = 0  # messages pulled and not handed back (nak) so far
        self.batch_seq = int(time.time() * 1000)
        self.dlq = DeadLetters(nc, self.api, options.stream, options.group)
        self.owner = f"{self.member}/{secrets.token_hex(8)}"  # this run, in the sink's fences
        self.lander = TwoPhaseLander(sink, self.summary, options.stream, options.group, self.member)
        self.lander.holds_pin = self.still_pinned
        self.batch_size = options.batch_size  # lowered to fit an existing consumer's max_ack_pending
        self.consumer_ack_wait = options.consumer_ack_wait(True)  # the consumer's own (it may predate this run)
        self.landing_msgs: list = []  # the consumer path's batch being landed (kept in progress)
        self.revoked: str | None = None  # why a membership change ends the current assignment
        self.pinned_consumer_created: str | None = None  # the member consumer this run is pinned on
        self.origin_key: str | None = None  # the rows' origin_stream: the key of the origin's life in the sink

    async def setup(self) -> None:
        o = self.options
        group = await self.groups.get(o.stream, o.group)
        self.config = group.config
        if not in_membership(self.config, self.member):
            raise ConfigError("member", f"{self.member!r} is not a member of group {o.group!r} on stream {o.stream!r}")
        elastic = isinstance(self.config, ElasticGroupConfig)
        self.ack_wait = o.consumer_ack_wait(elastic)
        layout = await self.groups.layout(group)
        # As orbit creates it (an orbit instance of the member then shares it through the pin);
        # an existing one is used as it is.
        self.consumer_stream, consumer = await self.groups.ensure_member_consumer(
            o.stream, o.group, self.member, ack_wait=self.ack_wait, layout=layout,
            max_ack_pending=o.max_ack_pending or (None if elastic else static_max_ack_pending(self.batch_size)),
        )
        existing = await self.api.consumer_info(self.consumer_stream, consumer)
        if existing is None:
            raise ConsumerGone(404, "member consumer deleted right after it was ensured")
        self.priority_group = priority_group_of(existing.get("config") or {}) or PRIORITY_GROUP
        self.sourced = isinstance(self.config, ElasticGroupConfig)
        self.partitions = tuple(partitioning.member_partitions(self.config, self.member))
        self.lander.partition_count = self.config.max_members
        self.filters = partitioning.member_filter_subjects(self.config, self.member)
        self.reader: PartitionReader | PartitionStreamReaders | None = None
        self.layout = layout
        self.split = layout.reads_partition_streams
        # its partitions are streams of their own: read them, whatever ``read`` says
        self.reader = layout.partition_readers(self.nc, self.consumer_stream, self.partitions, self.api.prefix)
        if self.reader is None and o.read in ("auto", "executors") and (self.sourced or self.api.can_reset_consumers()):
            read = await self.api.stream_info(self.consumer_stream)
            if (read.get("config") or {}).get("allow_direct"):  # orbit's own streams, and origins, may lack it
                self.reader = PartitionReader(self.nc, self.consumer_stream, js_prefix=self.api.prefix)
        self.slow_path: str | None = None  # why this run reads through the consumer, and the remedy
        if self.reader is None and o.read in ("auto", "executors"):
            if self.sourced or self.api.can_reset_consumers():
                self.slow_path = (f"stream {self.consumer_stream} has no direct gets (allow_direct is off): turn "
                                  f"them on (nats stream edit {self.consumer_stream} --allow-direct) for batched "
                                  "reads several times faster")
            else:
                self.slow_path = ("the server cannot move a static member's durable (nats-server 2.14+ can): "
                                  "upgrade it for batched reads several times faster")
            log.warning("cg member=%s reads through the consumer, the slow path: %s", self.member, self.slow_path)
        self.key_rules = partitioning.key_rules(self.config)
        self.keys = KeySelector(self.key_rules)
        self.client = PriorityClient(self.nc, self.consumer_stream, consumer, self.priority_group)
        # The server resets the pin timer (priority_timeout = ack_wait) only on a new pull that
        # carries the pin id, so a pull open longer than that loses the pin mid-pull: e.g. the
        # standby pull that gets pinned while waiting for a batch the backlog cannot fill.
        self.pull_expires_max = max(0.5, self.ack_wait / 2)

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> Summary:
        s = self.summary
        rejoins = 0
        try:
            while True:
                try:
                    await self._run_assignment()
                except ConsumerGone as e:
                    if s.messages_read or s.rows_written:
                        raise
                    # The member's consumer was deleted before this instance landed anything
                    # (nothing of ours is in flight): a membership change (the pinned instance
                    # re-creates it with new filters), or an inactivity threshold that ran out
                    # while this instance was starting. A member that still has partitions
                    # joins again while its standby time lasts; one that has none is revoked.
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
                if self.revoked is None:
                    return s
                if not await self._hand_over():
                    return s
                log.info("cg member=%s: continuing with partitions %s", self.member, self.partitions)
        finally:
            s.duration_s = round(time.monotonic() - self.started, 3)
            self.progress.tick(force=True)
            await self._close_assignment()

    async def _run_assignment(self) -> None:
        """One assignment of partitions: take the pin, take over, land until a limit, the end of
        the backlog, the loss of the pin, or a membership change (``self.revoked``)."""
        o, s = self.options, self.summary
        self.revoked = None
        self.pin_wait_from = time.monotonic()
        await self.setup()
        if self.origin_key is None:
            self.origin_key = self.summary.origin_key = await origin_life_key(self.api, self.sink, o)
        info = await self.client.consumer_info()
        # reading by direct gets, nothing is delivered through the consumer
        reads = ConsumerReads(self) if self.reader is None else self._direct_reads(consumer=info["name"])
        if isinstance(reads, ConsumerReads):
            reads.fit_batch_to(info)
        cfg = info.get("config") or {}
        self.consumer_ack_wait = int(cfg.get("ack_wait") or 0) / 1e9 or self.ack_wait
        self.priority_timeout = int(cfg.get("priority_timeout") or 0) / 1e9 or self.consumer_ack_wait
        self.pull_expires_max = max(0.5, min(self.consumer_ack_wait, self.priority_timeout) / 2)
        backlog = int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))
        if self.split:  # the member consumer holds only pin anchors: the backlog is the partitions'
            await self.ensure_partition_streams_current()
            backlog = sum((await self.layout.backlog(self.api, self.consumer_stream, {}, self.partitions)).values())
        s.target = self.taken + backlog
        if o.max_messages:
            s.target = min(s.target, o.max_messages)
        if backlog == 0 and not pinned_id(info):
            await self.lander.recover(self.partitions)
            s.result, s.stop_reason = (RESULT_COMMITTED if s.messages_read else RESULT_EMPTY), "empty backlog"
            return
        watcher = asyncio.create_task(self._watch_membership())
        try:
            first = await self._acquire_pin()
            if first is None:
                if self.revoked is not None:  # a standby: the pinned instance hands the consumer over
                    s.result, s.stop_reason = (RESULT_COMMITTED if s.messages_read else RESULT_REVOKED), self.revoked
                elif pinned_id(await self.client.consumer_info()):
                    s.result, s.stop_reason = RESULT_NOT_PINNED, "another instance holds the pin"
                else:
                    await self.lander.recover(self.partitions)
                    s.result, s.stop_reason = RESULT_EMPTY, "no message arrived"
                return
            s.pin_id = self.client.pin_id
            if self.split:  # the pin anchors: nothing to land
                for m in first:
                    await self.client.ack(m)
            pinned = await self.client.consumer_info()  # the consumer as this run was pinned on it
            self.pinned_consumer_created = pinned.get("created")
            log.info("cg pinned member=%s pin_id=%s owner=%s target=%d partitions=%s", self.member, s.pin_id,
                     self.owner, s.target, list(self.partitions))
            # fencing and recovery can take longer than the consumer's priority timeout or
            # inactivity threshold (orbit's: the ack wait, 5 s): keep the pin meanwhile
            keeper = asyncio.create_task(self.keep_pin_until_lost())
            try:
                landed = await self._take_over()
            finally:
                keeper.cancel()
            if isinstance(reads, DirectReads) and not await reads.positions.begin(first, pinned):
                self.slow_path = getattr(reads.positions, "declined", None) or "the durable cannot be read directly"
                log.warning("cg member=%s reads through the consumer this run, the slow path: %s", self.member,
                            self.slow_path)
                reads = ConsumerReads(self)
                reads.fit_batch_to(info)
            s.read_path = reads.read_path
            if s.read_path == "consumer" and o.read != "consumer":
                s.read_path_reason = self.slow_path
            if isinstance(reads, DirectReads):
                # the stream (elastic) or the durable's position (static), not the consumer's
                # deliveries, says what earlier holders left unacknowledged
                await reads.consume()
            else:
                held = await reads.settle_predecessors(first, landed)
                if held is None:
                    return
                await reads.consume(held)
        finally:
            watcher.cancel()
        s.result = RESULT_COMMITTED if s.messages_read else RESULT_EMPTY
        if self.revoked is None:
            await self._release_pin()

    def _direct_reads(self, consumer: str) -> DirectReads:
        """Direct gets, by the driver, or (``--read executors``) by the batch's Spark tasks."""
        positions = self._positions(consumer)
        if self.options.read == "executors":
            # imported here: its PySpark data source costs a plain driver's start-up a tenth of a second
            from airflow_provider_cg.core.landing.executor_reads import ExecutorReads

            return ExecutorReads(self, positions, self.pipeline.parallelism)
        return DirectReads(self, positions)

    def _positions(self, consumer: str) -> PartitionPositions | PartitionStreamPositions | ConsumerPosition:
        """Where a direct-get reader of this member reads from, and how it acks a range."""
        if isinstance(self.reader, PartitionStreamReaders):
            return PartitionStreamPositions(self.reader, self.partitions)
        if self.reader is None:
            raise ConsumerGroupError("no reader: the member's assignment is closed")
        if self.sourced:
            return PartitionPositions(self.reader, self.partitions, self.config.max_members, self.filters)
        only, subjects = None, list(self.filters)
        if set(self.partitions) == set(range(self.config.max_members)):  # one unfiltered scan, not one each
            only, subjects = subjects_regex(self.filters), [">"]
        return ConsumerPosition(self.reader, self.api, self.consumer_stream, consumer, subjects, only,
                                list(self.filters))

    async def _watch_membership(self) -> None:
        """Poll the group's config (whoever changes it: our operators or ``cg``, orbit's ``cg``)
        and set ``self.revoked`` when this member's filters change; the read loops then stop
        after the batch in flight has landed."""
        o = self.options
        while True:
            await asyncio.sleep(MEMBERSHIP_POLL)
            try:
                cfg = (await self.groups.get(o.stream, o.group)).config
            except GroupNotFound:
                self.revoked = "group deleted"
                return
            except Exception as e:  # a server restart, a timeout: look again later
                log.debug("cg member=%s: membership check failed (%s)", self.member, e)
                continue
            now = partitioning.member_filter_subjects(cfg, self.member) if in_membership(cfg, self.member) else []
            if sorted(now) != sorted(self.filters):
                self.revoked = f"membership changed (partitions {list(self.partitions)} -> " \
                               f"{partitioning.member_partitions(cfg, self.member) if now else []})"
                log.info("cg member=%s: %s; finishing the batch in flight", self.member, self.revoked)
                return

    async def _may_rejoin(self) -> bool:
        """Whether the member still has partitions and this run's standby time is not up."""
        o = self.options
        if time.monotonic() - self.started > o.standby_timeout:
            return False
        try:
            cfg = (await self.groups.get(o.stream, o.group)).config
        except GroupNotFound:
            return False
        return in_membership(cfg, self.member) and bool(partitioning.member_partitions(cfg, self.member))

    async def _hand_over(self) -> bool:
        """After a membership change stopped the read loops (the batch in flight landed): as
        orbit's pinned instance does, delete the member's consumer so it can be re-created
        with the new filters (the partitions it lost are then free for their new owners).
        Returns True to go on with the member's new partitions."""
        o, s = self.options, self.summary
        s.stop_reason = self.revoked or ""
        holds = not self.lander.taken_over and await self.client.holds_pin()
        consumer = self.client.consumer
        await self._close_assignment()
        if not holds:
            return False  # another instance of the member is in charge of the change
        try:
            await self.api.delete_consumer(self.consumer_stream, consumer)
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
        if self.limit_reached() not in (None, self.revoked):
            return False
        return True

    async def _close_assignment(self) -> None:
        client, reader = getattr(self, "client", None), getattr(self, "reader", None)
        self.reader = None
        if hasattr(self, "client"):
            del self.client  # a new assignment opens its own
        if client is not None:
            await client.close()
        if reader is not None:
            await reader.close()

    async def still_pinned(self) -> bool:
        """Whether no other instance can have been handed this run's messages: the member
        consumer is the one this run was pinned on (not deleted, not re-created, as an orbit
        instance does with a consumer of another config) and no other pin is set. (A pin that
        lapsed with nobody taking it, e.g. after a step-down, is no other instance's.) Asked
        before every batch's acks; when the answer cannot be had (server unreachable) it is no:
        the batch is rolled back, which is always safe before an ack."""
        client = self.client
        if client is None:
            return False
        try:
            info = await client.consumer_info()
        except Exception as e:  # noqa: BLE001 - any doubt (gone included) means: do not ack
            log.warning("cg member=%s: could not confirm the pin before the ack (%s)", self.member, e)
            return False
        if info.get("created") != self.pinned_consumer_created:
            return False
        holder = pinned_id(info)
        return holder is None or holder == client.pin_id

    async def _release_pin(self) -> None:
        """After a run that ended normally, hand the pin back at once (a standby, or the next
        scheduled run, gets it now instead of after the consumer's priority timeout), unless
        another instance holds it by now. Best effort: the timeout frees it anyway."""
        try:
            if self.lander.taken_over or not await self.client.holds_pin():
                return
            await self.client.unpin()
        except ConsumerGroupError as e:
            log.info("cg member=%s: pin not released (%s); it expires with the priority timeout", self.member, e)

    async def _take_over(self) -> set[int]:
        """As the new pin holder, before landing anything: fence the member's partitions in the
        sink and finish what earlier holders left prepared there. Returns the sequences (in the
        consumed stream) of the messages whose rows that recovery committed."""
        writes = await self.lander.take_over(self.owner, self.partitions)
        return {int(q) for w in writes for q in w.refs.get(self.consumer_stream, ())}

    async def await_landing(self, landing: asyncio.Task, held: Sequence = ()) -> None:
        """Wait for a batch to land, keeping the pin alive meanwhile (a sink write can take
        longer than the consumer's priority timeout, e.g. behind row locks), and the landing
        batch's and the next (``held``) batch's messages in progress (+WPI): an adopted
        consumer's ack wait may be short (orbit's 5 s), and they must not be redelivered."""
        interval = max(0.25, self.consumer_ack_wait / 3)
        while True:
            done, _ = await asyncio.wait({landing}, timeout=interval)
            if done:
                return landing.result()
            if not await self.client.keep_pin():
                log.warning("cg member=%s: pin moved while a batch was landing", self.member)
                continue
            for m in [*self.landing_msgs, *held]:
                await self.client.in_progress(m)

    async def _acquire_pin(self) -> list | None:
        """Pull as a standby until the server pins us (messages arrive) or the timeout passes."""
        o = self.options
        deadline = self.pin_wait_from + o.standby_timeout
        log.info("cg member=%s: waiting up to %.0fs for the pin", self.member, max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and self.revoked is None:
            expires = max(0.5, min(5.0, self.pull_expires_max, deadline - time.monotonic()))
            # reading by direct gets, the pin is all this pull is for
            want = 1 if self.reader is not None else min(self.batch_size, max(self.summary.target, 1))
            if self.split:
                await self._anchor_pin()
            try:
                msgs = await self.client.pull(want, expires=expires)
            except PinLost as e:
                if e.messages:
                    return e.messages
                continue
            except PullTransient:
                await asyncio.sleep(0.5)
                continue
            if msgs:
                return msgs
        return None

    async def _anchor_pin(self) -> None:
        """The server pins a client only when it delivers a message: with partition streams,
        make sure one small anchor waits on the member's pin subject (a standby's stays there
        until the pinned instance's pin lapses; the pinned instance acks its own)."""
        try:
            info = await self.client.consumer_info()
            if int(info.get("num_pending") or 0) + int(info.get("num_ack_pending") or 0) == 0:
                await self.nc.request(layouts.pin_subject(self.consumer_stream, self.member),
                                      b"", timeout=5.0, headers={"Cg-Pin-Anchor": self.owner})
        except Exception as e:  # noqa: BLE001 - the next round tries again
            log.debug("cg member=%s: pin anchor not published (%s)", self.member, e)

    def limit_reached(self) -> str | None:
        o, s = self.options, self.summary
        if o.max_seconds and time.monotonic() - self.started >= o.max_seconds:
            return "max_seconds"
        if o.max_bytes and s.bytes >= o.max_bytes:
            return "max_bytes"
        if self.taken >= s.target:
            return "target reached"
        return self.revoked

    async def ensure_partition_streams_current(self) -> None:
        """The member's partition streams answer, have a leader and a working mirror, or the run
        ends with a server error (exit 2, retried) naming the stream, rather than landing nothing
        from a stream that cannot serve it. A server restart or a leader election heals within
        seconds: the run waits up to its ``standby_timeout`` first, as it would for its pin."""
        deadline = time.monotonic() + self.options.standby_timeout
        while True:
            problems = await self.layout.problems(self.api, self.consumer_stream, self.partitions)
            if problems and self.layout.mirrored:  # a move back to the work queue may have stopped the mirrors
                self.layout = layouts.of(await layouts.wq_config(self.api, self.consumer_stream))
                if not self.layout.mirrored:
                    continue
            if not problems:
                return
            if time.monotonic() >= deadline:
                p, why = min(problems.items())
                raise ConsumerGroupError(
                    f"partition {p}'s stream {self.layout.partition_store(self.consumer_stream, p)} is not current: "
                    f"{why}; nothing of it can be landed until the cluster serves it again (cg status shows it)")
            log.warning("cg member=%s: partition streams not current (%s); waiting", self.member,
                        "; ".join(f"{self.layout.partition_store(self.consumer_stream, p)}: {why}"
                                  for p, why in sorted(problems.items())))
            await asyncio.sleep(1.0)

    async def keep_pin_until_lost(self) -> None:
        """Keep the member consumer's pin while reading around it; returns when it is lost."""
        interval = max(0.25, min(self.consumer_ack_wait, self.priority_timeout) / 3)
        while True:
            await asyncio.sleep(interval)
            if not await self.client.keep_pin():
                log.warning("cg member=%s: the pin moved to another instance", self.member)
                return

    # --- one batch -------------------------------------------------------------------------

    def next_batch_id(self) -> BatchId:
        o = self.options
        self.batch_seq += 1
        return BatchId(o.stream, o.group, self.member, self.batch_seq)

    def rows_of(self, table):
        """Rows as read, under the key of the origin's life (``stream_life.py``)."""
        return with_origin_key(table, self.origin_key)

    def recompute_step(self, table):
        """The lander's ``recompute`` of a batch read as ``table``: processed again under a new
        batch id (the pipeline drops the inputs another writer committed meanwhile)."""
        def recompute():
            batch_id = self.next_batch_id()
            return batch_id, self.pipeline.process(self.sink, table, batch_id)
        return recompute

async def origin_life_key(api: JsApi, sink: TwoPhaseSink, options: BatchOptions) -> str:
    """The key the origin's messages land under in ``sink`` (``stream_life.py``): checked, and a
    new life recorded, before anything is fenced, recovered or landed."""
    created = await origin_created(api, options.stream)
    return await asyncio.to_thread(sink.stream_life, options.stream, created, LifeChoice.parse(options.stream_life))


async def run_member_batch(nc, sink: TwoPhaseSink, options: BatchOptions, pipeline=None,
                           *, js_prefix: str = "$JS.API") -> Summary:
    """Consume the member's backlog as its pinned instance, land it in ``sink``; return the summary.

    ``pipeline`` (``core/landing/pipeline.py``): what happens to each batch before the sink's prepare
    (decoding and the user's transformation in Spark); default: the rows as read."""
    return await MemberRun(nc, sink, options, pipeline or ArrowPipeline(), js_prefix).run()
