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
import json
import logging
import secrets
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound, JetStreamApiError
from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups.admin import PRIORITY_GROUP, ConsumerGroups, priority_group_of
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, in_membership
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.direct import (
    ALL,
    DirectReadError,
    PartitionBatch,
    PartitionReader,
)
from airflow_provider_cg.core.jetstream.protocol import AckOutcome, ConsumerGone, PinLost, PullTransient
from airflow_provider_cg.core.landing.contract import (
    ACK_TIMEOUT,
    RESULT_COMMITTED,
    RESULT_EMPTY,
    RESULT_NOT_PINNED,
    RESULT_REVOKED,
    BatchOptions,
    Summary,
)
from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.pipeline import ArrowPipeline, ProcessedBatch
from airflow_provider_cg.core.landing.rows import BatchId, KeySelector, build_rows, rows_from_batches
from airflow_provider_cg.core.landing.sinks.base import TwoPhaseSink
from airflow_provider_cg.core.landing.two_phase import TwoPhaseLander

log = logging.getLogger("airflow_provider_cg.landing")

MEMBERSHIP_POLL = 0.5  # seconds between looks at the group's config while consuming


class _Progress:
    def __init__(self, summary: Summary, interval: float) -> None:
        self.summary, self.interval = summary, interval
        self.start = self.last = time.monotonic()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        s = self.summary
        rate = s.consumed / max(now - self.start, 1e-9)
        left = max(s.target - s.consumed, 0)
        log.info("cg progress member=%s consumed=%d committed=%d rate=%.0f msg/s backlog_left=%d",
                 s.member, s.consumed, s.committed, rate, left)


class DeadLetters:
    """The dead-letter stream ``<stream>-<group>-dlq``; poison messages keep their error."""

    def __init__(self, nc, api: JsApi, stream: str, group: str, replicas: int = 1) -> None:
        self.nc, self.api = nc, api
        self.name = f"{stream}-{group}-dlq"
        self.prefix = f"cg.dlq.{stream}.{group}"
        self.replicas = replicas
        self._ready = False

    async def _ensure(self) -> None:
        if self._ready:
            return
        cfg = {"name": self.name, "subjects": [f"{self.prefix}.>"], "retention": "limits",
               "storage": "file", "num_replicas": self.replicas, "duplicate_window": 3600 * 10**9}
        try:
            await self.api.add_stream(cfg)
        except ConsumerGroupError as e:
            if getattr(e, "err_code", 0) != 10058:  # already exists
                raise
        self._ready = True

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        await self._ensure()
        js = self.nc.jetstream()
        await js.publish(f"{self.prefix}.{subject}", data, headers=headers, stream=self.name)


async def _resolve_acks(client: PriorityClient, api: JsApi, consumer_stream: str, is_work_queue: bool,
                        msgs: list, outcomes: list[AckOutcome], deadline: float) -> int:
    """Turn unknown ack outcomes into known ones where possible; return how many stay unknown.

    A work-queue stream deletes an acked message, so "gone" means acked. Re-sending an ack
    is idempotent, so unknown ones are re-acked until ``deadline``.
    """
    unknown = [m for m, o in zip(msgs, outcomes, strict=True) if not o.acked]
    while unknown and time.monotonic() < deadline:
        try:  # the stream check too: a server restart makes it time out like the re-ack
            if is_work_queue:
                still = []
                for m in unknown:
                    if await api.get_msg(consumer_stream, m.stream_seq) is not None:
                        still.append(m)
                unknown = still
                if not unknown:
                    break
            again = await client.ack_sync_many(unknown, timeout=max(1.0, min(5.0, deadline - time.monotonic())))
            unknown = [m for m, o in zip(unknown, again, strict=True) if not o.acked]
        except Exception as e:  # server away: wait for the reconnect
            log.warning("re-ack failed (%s); retrying", type(e).__name__)
            await asyncio.sleep(0.5)
    return len(unknown)


class MemberRun:
    """State of one member job run (one pinned client, one sink, one summary)."""

    def __init__(self, nc, sink: TwoPhaseSink, options: BatchOptions, pipeline, js_prefix: str) -> None:
        self.nc, self.sink, self.options, self.pipeline = nc, sink, options, pipeline
        self.summary = Summary(options.stream, options.group, options.member)
        self.groups = ConsumerGroups(nc, js_prefix=js_prefix)
        self.api = JsApi(nc, prefix=js_prefix)
        self.started = time.monotonic()
        self.progress = _Progress(self.summary, options.progress_interval)
        self.taken = 0  # messages pulled and not handed back (nak) so far
        self.idle_checks = 0  # empty pulls answered by "still pending" (bounded)
        self.batch_seq = int(time.time() * 1000)
        self.dlq = DeadLetters(nc, self.api, options.stream, options.group)
        self.owner = f"{options.member}/{secrets.token_hex(8)}"  # this run, in the sink's fences
        self.lander = TwoPhaseLander(sink, self.summary, options.stream, options.group, options.member)
        self.batch_size = options.batch_size  # lowered to fit an existing consumer's max_ack_pending
        self.consumer_ack_wait = options.consumer_ack_wait(True)  # the consumer's own (it may predate this run)
        self.landing_msgs: list = []  # the consumer path's batch being landed (kept in progress)
        self.revoked: str | None = None  # why a membership change ends the current assignment

    async def setup(self) -> None:
        o = self.options
        group = await self.groups.get(o.stream, o.group)
        self.config = group.config
        if not in_membership(self.config, o.member):
            raise ConfigError("member", f"{o.member!r} is not a member of group {o.group!r} on stream {o.stream!r}")
        elastic = isinstance(self.config, ElasticGroupConfig)
        self.ack_wait = o.consumer_ack_wait(elastic)
        # As orbit creates it (an orbit instance of the member then shares it through the pin);
        # an existing one is used as it is.
        self.consumer_stream, consumer = await self.groups.ensure_member_consumer(
            o.stream, o.group, o.member, ack_wait=self.ack_wait,
            **({} if elastic else {"max_ack_pending": max(3 * self.batch_size, 1000)}),
        )
        existing = await self.api.consumer_info(self.consumer_stream, consumer)
        if existing is None:
            raise ConsumerGone(404, "member consumer deleted right after it was ensured")
        self.priority_group = priority_group_of(existing.get("config") or {}) or PRIORITY_GROUP
        self.sourced = isinstance(self.config, ElasticGroupConfig)
        self.partitions = tuple(partitioning.member_partitions(self.config, o.member))
        self.filters = partitioning.member_filter_subjects(self.config, o.member)
        self.reader: PartitionReader | None = None
        if self.sourced and o.read == "auto":
            wq = await self.api.stream_info(self.consumer_stream)
            if (wq.get("config") or {}).get("allow_direct"):  # orbit's own streams may lack it
                self.reader = PartitionReader(self.nc, self.consumer_stream, js_prefix=self.api.prefix)
        self.keys = KeySelector(partitioning.key_rules(self.config))
        self.client = PriorityClient(self.nc, self.consumer_stream, consumer, self.priority_group)
        # The server resets the pin timer (priority_timeout = ack_wait) only on a new pull that
        # carries the pin id, so a pull open longer than that loses the pin mid-pull: e.g. the
        # standby pull that gets pinned while waiting for a batch the backlog cannot fill.
        self.pull_expires_max = max(0.5, self.ack_wait / 2)

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> Summary:
        o, s = self.options, self.summary
        try:
            while True:
                await self._run_assignment()
                if self.revoked is None:
                    return s
                if not await self._hand_over():
                    return s
                log.info("cg member=%s: continuing with partitions %s", o.member, self.partitions)
        except ConsumerGone as e:
            if s.consumed or s.committed:
                raise
            # A membership change deleted the member's consumer before this instance landed
            # anything (typically while it waited as a standby): nothing of ours is in flight.
            s.result, s.stop_reason = RESULT_REVOKED, f"member consumer deleted ({e.description})"
            log.info("cg member=%s: %s", o.member, s.stop_reason)
            return s
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
        info = await self.client.consumer_info()
        if self.reader is None:  # reading by direct gets, nothing is delivered through the consumer
            self._fit_batch_to(info)
        cfg = info.get("config") or {}
        self.consumer_ack_wait = int(cfg.get("ack_wait") or 0) / 1e9 or self.ack_wait
        self.priority_timeout = int(cfg.get("priority_timeout") or 0) / 1e9 or self.consumer_ack_wait
        self.pull_expires_max = max(0.5, min(self.consumer_ack_wait, self.priority_timeout) / 2)
        backlog = int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))
        s.target = self.taken + backlog
        if o.max_messages:
            s.target = min(s.target, o.max_messages)
        if backlog == 0 and not _pinned_id(info):
            await self.lander.recover(self.partitions)
            s.result, s.stop_reason = (RESULT_COMMITTED if s.consumed else RESULT_EMPTY), "empty backlog"
            return
        watcher = asyncio.create_task(self._watch_membership())
        try:
            first = await self._acquire_pin()
            if first is None:
                if self.revoked is not None:  # a standby: the pinned instance hands the consumer over
                    s.result, s.stop_reason = (RESULT_COMMITTED if s.consumed else RESULT_REVOKED), self.revoked
                elif _pinned_id(await self.client.consumer_info()):
                    s.result, s.stop_reason = RESULT_NOT_PINNED, "another instance holds the pin"
                else:
                    await self.lander.recover(self.partitions)
                    s.result, s.stop_reason = RESULT_EMPTY, "no message arrived"
                return
            s.pin_id = self.client.pin_id
            log.info("cg pinned member=%s pin_id=%s owner=%s target=%d partitions=%s", o.member, s.pin_id,
                     self.owner, s.target, list(self.partitions))
            # fencing and recovery can take longer than the consumer's priority timeout or
            # inactivity threshold (orbit's: the ack wait, 5 s): keep the pin meanwhile
            keeper = asyncio.create_task(self._keep_pin())
            try:
                landed = await self._take_over()
            finally:
                keeper.cancel()
            if self.reader is not None:
                # the stream, not the consumer, holds what earlier holders left unacknowledged
                await self._consume_direct()
            else:
                held = await self._settle_predecessors(first, landed)
                if held is None:
                    return
                await self._consume(held)
        finally:
            watcher.cancel()
        s.result = RESULT_COMMITTED if s.consumed else RESULT_EMPTY
        if self.revoked is None:
            await self._release_pin()

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
                log.debug("cg member=%s: membership check failed (%s)", o.member, e)
                continue
            now = partitioning.member_filter_subjects(cfg, o.member) if in_membership(cfg, o.member) else []
            if sorted(now) != sorted(self.filters):
                self.revoked = f"membership changed (partitions {list(self.partitions)} -> " \
                               f"{partitioning.member_partitions(cfg, o.member) if now else []})"
                log.info("cg member=%s: %s; finishing the batch in flight", o.member, self.revoked)
                return

    async def _hand_over(self) -> bool:
        """After a membership change stopped the read loops (the batch in flight landed): as
        orbit's pinned instance does, delete the member's consumer so it can be re-created
        with the new filters (the partitions it lost are then free for their new owners).
        Returns True to go on with the member's new partitions."""
        o, s = self.options, self.summary
        s.stop_reason = self.revoked
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
        if cfg is None or not in_membership(cfg, o.member) or not partitioning.member_partitions(cfg, o.member):
            if not s.consumed:
                s.result = RESULT_REVOKED
            return False
        if self._limit_reached() not in (None, self.revoked):
            return False
        return True

    async def _close_assignment(self) -> None:
        client, reader = getattr(self, "client", None), getattr(self, "reader", None)
        self.client = self.reader = None
        if client is not None:
            await client.close()
        if reader is not None:
            await reader.close()

    async def _release_pin(self) -> None:
        """After a run that ended normally, hand the pin back at once (a standby, or the next
        scheduled run, gets it now instead of after the consumer's priority timeout), unless
        another instance holds it by now. Best effort: the timeout frees it anyway."""
        try:
            if self.lander.taken_over or not await self.client.holds_pin():
                return
            await self.client.unpin()
        except ConsumerGroupError as e:
            log.info("cg member=%s: pin not released (%s); it expires with the priority timeout", self.options.member, e)

    def _fit_batch_to(self, info: dict) -> None:
        """Keep a batch (and the next one pulled while it lands) within the consumer's
        max_ack_pending: an existing consumer keeps the limit it was created with (by an
        earlier run with a smaller batch size), and a pull for more than it may deliver waits
        until its expiry for messages that cannot come."""
        limit = int((info.get("config") or {}).get("max_ack_pending") or 0)
        if limit > 0 and self.batch_size > max(1, limit // 2):
            log.warning("cg batch size %d > half the consumer's max_ack_pending %d; using %d",
                        self.batch_size, limit, max(1, limit // 2))
            self.batch_size = max(1, limit // 2)

    async def _take_over(self) -> set[int]:
        """As the new pin holder, before landing anything: fence the member's partitions in the
        sink and finish what earlier holders left prepared there. Returns the sequences (in the
        consumed stream) of the messages whose rows that recovery committed."""
        writes = await self.lander.take_over(self.owner, self.partitions)
        return {int(q) for w in writes for q in w.refs.get(self.consumer_stream, ())}

    async def _settle_predecessors(self, held: list, landed: set[int]) -> list | None:
        """Reading through the consumer: wait until every unacknowledged message of the
        consumer is in ``held``; returns them (None: the pin moved on meanwhile, or the
        predecessors' messages never came back).

        The server moves the pin without waiting for the old holder's unacked messages; they
        come back to the pin holder only when their ack wait expires. Landing the newer
        messages first would break per-key order, so this pulls (which also keeps the pin)
        until the consumer's ack-pending count is all ours, keeping ours alive with +WPI.
        Messages whose rows recovery just committed are acked at once: they are landed, and
        an earlier holder's late ack of them must not be mistaken for progress."""
        o, s = self.options, self.summary
        done = [m for m in held if m.stream_seq in landed] if landed else []  # one pull: no repeats
        if done:
            await self.client.ack_sync_many(done, timeout=min(ACK_TIMEOUT, 10.0))
            self.taken += len(done)
            held = [m for m in held if m.stream_seq not in landed]
        ack_wait = self.consumer_ack_wait
        deadline = time.monotonic() + 3 * ack_wait + 30
        refreshed = time.monotonic()
        waited = False
        while True:
            foreign = int((await self.client.consumer_info()).get("num_ack_pending", 0)) - len(held)
            if foreign <= 0:
                break
            if not waited:
                log.info("cg member=%s: %d messages still in flight at an earlier instance; waiting for them "
                         "(up to the consumer's ack wait, %.1fs) before landing", o.member, foreign, ack_wait)
                waited = True
            if time.monotonic() > deadline:
                s.stop_reason = f"{foreign} messages of an earlier instance did not come back"
                return None
            if time.monotonic() - refreshed > ack_wait / 3:
                for m in held:
                    await self.client.in_progress(m)
                refreshed = time.monotonic()
            try:
                more = await self.client.pull(max(1, foreign), expires=min(1.0, self.pull_expires_max))
            except PinLost:
                s.stop_reason = "pin lost while waiting for an earlier instance's messages"
                return None
            except PullTransient:
                await asyncio.sleep(0.5)
                continue
            held = _latest_deliveries(held + more)
        if waited:
            log.info("cg member=%s: earlier instances' messages are back; %d held", o.member, len(held))
        return held

    async def _await_landing(self, landing: asyncio.Task, held: list = ()) -> None:
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
                log.warning("cg member=%s: pin moved while a batch was landing", self.options.member)
                continue
            for m in [*self.landing_msgs, *held]:
                await self.client.in_progress(m)

    async def _acquire_pin(self) -> list | None:
        """Pull as a standby until the server pins us (messages arrive) or the timeout passes."""
        o = self.options
        deadline = self.pin_wait_from + o.standby_timeout
        log.info("cg member=%s: waiting up to %.0fs for the pin", o.member, max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and self.revoked is None:
            expires = max(0.5, min(5.0, self.pull_expires_max, deadline - time.monotonic()))
            # reading by direct gets, the pin is all this pull is for
            want = 1 if self.reader is not None else min(self.batch_size, max(self.summary.target, 1))
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

    def _limit_reached(self) -> str | None:
        o, s = self.options, self.summary
        if o.max_seconds and time.monotonic() - self.started >= o.max_seconds:
            return "max_seconds"
        if o.max_bytes and s.bytes >= o.max_bytes:
            return "max_bytes"
        if self.taken >= s.target:
            return "target reached"
        return self.revoked

    async def _consume(self, first: list) -> None:
        """Pull batch k+1 while batch k is landed (prepare, ack, commit) in the background."""
        o, s = self.options, self.summary
        landing: asyncio.Task | None = None
        msgs, end = first, None
        transient_deadline = None
        try:
            while True:
                if msgs:
                    self.taken += len(msgs)
                    if landing is not None:
                        await self._await_landing(landing, held=msgs)
                    if not self.client.is_pinned and end is None:
                        end = "pin"  # lost while the last batch landed: leave these to the new holder
                    elif not self.lander.taken_over:  # else leave them unacked to the new pin holder
                        landing = asyncio.create_task(self._land(msgs, consumer_gone=(end == "gone")))
                    self.progress.tick()
                if end is not None and landing is not None:
                    await self._await_landing(landing)  # its outcome may say why we stop
                    landing = None
                if self.lander.taken_over:
                    s.stop_reason = "taken over by another instance"
                    break
                if end is not None:
                    s.stop_reason = {"pin": "pin lost", "gone": "consumer deleted", "idle": "backlog drained"}[end]
                    break
                reason = self._limit_reached()
                if reason == "target reached" and landing is not None:
                    # The batch still landing may nak poison messages back (``taken`` drops):
                    # they are part of the target and must come back here, to be dead-lettered
                    # once out of deliveries, not be left behind in the stream.
                    await self._await_landing(landing)
                    landing = None
                    reason = self._limit_reached()
                if reason:
                    s.stop_reason = reason
                    break
                want = min(self.batch_size, s.target - self.taken)
                try:
                    msgs = await self.client.pull(want, expires=min(o.idle_timeout, self.pull_expires_max))
                    transient_deadline = None
                    if not msgs and not await self._backlog_left():
                        end = "idle"
                except PinLost as e:
                    msgs, end = e.messages, "pin"
                except ConsumerGone as e:
                    msgs, end = e.messages, "gone"
                except PullTransient as e:  # server restart, leadership change: keep trying a while
                    msgs = e.messages
                    transient_deadline = transient_deadline or time.monotonic() + max(self.ack_wait, 30.0)
                    if time.monotonic() > transient_deadline:
                        raise
                    log.warning("cg pull interrupted (%s); retrying", e)
                    await asyncio.sleep(0.5)
        finally:
            if landing is not None:
                await self._await_landing(landing)

    async def _consume_direct(self) -> None:
        """Read the member's partitions by direct gets, batch k+1 while batch k lands; the
        pin is kept by pulls that take no message. Batch k+1's processing (Spark) may start
        while batch k finishes its two-phase steps; its own steps wait for batch k's."""
        s = self.summary
        # next sequence to read per partition; the whole stream if every partition is ours
        owns_all = set(self.partitions) == set(range(self.config.max_members))
        starts = {ALL: 0} if owns_all else {p: 0 for p in self.partitions}
        keeper = asyncio.create_task(self._keep_pin())
        landing: asyncio.Task | None = None
        transient_deadline = None
        try:
            while True:
                if self.lander.taken_over:
                    s.stop_reason = "taken over by another instance"
                    break
                if keeper.done() or not await self.client.keep_pin():  # also notices a step-down at once
                    s.stop_reason = "pin lost"
                    break
                reason = self._limit_reached()
                if reason:
                    s.stop_reason = reason
                    break
                try:
                    batches = await self.reader.read_partitions(starts, min(self.batch_size, s.target - self.taken))
                    transient_deadline = None
                except DirectReadError as e:
                    transient_deadline = transient_deadline or time.monotonic() + max(self.ack_wait, 30.0)
                    if not e.retryable or time.monotonic() > transient_deadline:
                        raise
                    log.warning("cg read interrupted (%s); retrying", e)
                    await asyncio.sleep(0.5)
                    continue
                if not batches:  # drained, unless by a successor while this instance stalled
                    if landing is not None:
                        await self._await_landing(landing)
                        landing = None
                    s.stop_reason = "backlog drained" if await self.client.holds_pin() else "pin lost"
                    break
                for b in batches:
                    starts[b.partition] = b.last_seq + 1
                    self.taken += len(b)
                previous, landing = landing, None
                if not self.lander.taken_over and not keeper.done():
                    landing = asyncio.create_task(self._land_direct(batches, after=previous))
                if previous is not None:
                    await self._await_landing(previous)
                self.progress.tick()
        finally:
            if landing is not None:
                await self._await_landing(landing)
            keeper.cancel()

    async def _keep_pin(self) -> None:
        """Keep the member consumer's pin while reading around it; returns when it is lost."""
        interval = max(0.25, min(self.consumer_ack_wait, self.priority_timeout) / 3)
        while True:
            await asyncio.sleep(interval)
            if not await self.client.keep_pin():
                log.warning("cg member=%s: the pin moved to another instance", self.options.member)
                return

    async def _backlog_left(self) -> bool:
        """After a pull came back empty: is anything still pending for us? A slow server can
        let one short pull expire while messages remain; the consumer's own count decides."""
        if self.idle_checks >= 3:
            return False
        self.idle_checks += 1
        try:
            info = await self.client.consumer_info()
        except Exception:
            return False
        return int(info.get("num_pending", 0)) > 0

    # --- one batch -------------------------------------------------------------------------

    async def _land(self, msgs: list, consumer_gone: bool = False) -> None:
        """One batch read through the consumer: its rows, then the two-phase steps with a
        double ack per message (partition by partition)."""
        o = self.options
        self.landing_msgs = msgs
        table = build_rows(msgs, group=o.group, member=o.member, keys=self.keys, sourced=self.sourced)
        if not _in_stream_order(msgs):  # right after a takeover or a redelivery
            msgs = sorted(_latest_deliveries(msgs), key=lambda m: m.stream_seq)
            table = build_rows(msgs, group=o.group, member=o.member, keys=self.keys, sourced=self.sourced)
        lo, hi = pc.min_max(table.column("partition")).values()
        one_partition = lo == hi
        batch_id = self._next_batch_id()
        if consumer_gone:  # nothing is acked: the rows only go through prepare and abort
            processed = ProcessedBatch(table, {})
        else:  # fails the batch (no ack sent) if the user's transformation fails
            processed = await asyncio.to_thread(self.pipeline.process, self.sink, table, batch_id)
        inputs = table
        if processed.bad:
            msgs, rows = await self._handle_poison(table, msgs, processed.bad)
            inputs = table.take(pa.array(rows, pa.int64()))  # typed: the list may be empty
        if not msgs:
            await asyncio.to_thread(self.sink.discard, processed.rows)
            return

        async def ack() -> int:
            acked, outcomes = [], []
            for part in [msgs] if one_partition else _by_partition(msgs):
                outcomes += await self.client.ack_sync_many(part, timeout=min(ACK_TIMEOUT, 10.0))
                acked += part
                failpoint("mid_ack")
            return await _resolve_acks(self.client, self.api, self.consumer_stream, self.sourced, acked, outcomes,
                                       time.monotonic() + ACK_TIMEOUT)

        refs = np.fromiter((m.stream_seq for m in msgs), np.int64, len(msgs))
        await self.lander.land(batch_id, processed, inputs, {self.consumer_stream: refs}, ack, len(msgs),
                               sum(len(m.data) for m in msgs), abort=consumer_gone)

    async def _land_direct(self, batches: list[PartitionBatch], after: asyncio.Task | None = None) -> None:
        """One batch read by direct gets: its rows and processing, then (once the batch
        ``after`` has landed) the two-phase steps with one purge per partition as the ack of
        the range read. Nothing of it is prepared if ``after`` failed or was taken over."""
        o = self.options
        table, refs = await asyncio.to_thread(rows_from_batches, batches, group=o.group, member=o.member,
                                              keys=self.keys)
        batch_id = self._next_batch_id()
        processed = await asyncio.to_thread(self.pipeline.process, self.sink, table, batch_id)
        if after is not None:
            await asyncio.wait({after})
            if after.cancelled() or after.exception() is not None or self.lander.taken_over:
                await asyncio.to_thread(self.sink.discard, processed.rows)
                return
        if processed.bad:
            await self._dead_letter(table, processed.bad)

        async def ack() -> int:
            unknown = 0
            for b in batches:
                try:
                    await self.reader.purge_through(b.partition, b.last_seq, timeout=min(ACK_TIMEOUT, 10.0))
                except Exception as e:  # the purge may or may not have taken effect
                    log.warning("cg purge of partition %d through %d: %s; checking", b.partition, b.last_seq, e)
                    deadline = asyncio.get_running_loop().time() + ACK_TIMEOUT
                    if not await self.reader.acked_through(b.partition, b.last_seq, deadline):
                        unknown += len(b)
                failpoint("mid_ack")
            return unknown

        await self.lander.land(batch_id, processed, table, {self.consumer_stream: refs}, ack, len(refs),
                               sum(len(d) for b in batches for d in b.data))

    def _next_batch_id(self) -> BatchId:
        o = self.options
        self.batch_seq += 1
        return BatchId(o.stream, o.group, o.member, self.batch_seq)

    async def _dead_letter(self, table, bad: dict[int, str]) -> None:
        """Direct reads: a decode failure goes to the dead-letter stream at once (a direct get
        is no delivery; decoding again would fail again), with the message's own headers, and
        is acknowledged with its range."""
        o, s = self.options, self.summary
        s.poison_deliveries += len(bad)
        cols = table.select(["origin_stream", "origin_seq", "subject", "payload", "headers"]).to_pylist()
        for i, err in bad.items():
            row = cols[i]
            origin, seq = row["origin_stream"], row["origin_seq"]
            await self.dlq.publish(row["subject"], row["payload"], dead_letter_headers(
                row["headers"], err, origin, seq, o.member))
            s.dead_lettered += 1

    async def _handle_poison(self, table, msgs: list, bad: dict[int, str]) -> tuple[list, list[int]]:
        """Nak poison messages that have deliveries left; dead-letter the others (then ack them
        with the batch). ``table``: the batch's rows as read. Returns the messages to ack and
        their rows' indexes."""
        o, s = self.options, self.summary
        ack_msgs, ack_rows = [], []
        s.poison_deliveries += len(bad)
        origin_streams = table.column("origin_stream")
        origin_seqs = table.column("origin_seq")
        user_headers = table.column("headers")
        for i, m in enumerate(msgs):
            err = bad.get(i)
            if err is None:
                ack_msgs.append(m)
                ack_rows.append(i)
            elif m.num_delivered >= o.max_deliver:
                origin, seq = origin_streams[i].as_py(), origin_seqs[i].as_py()
                await self.dlq.publish(partitioning.strip_partition(m.subject)[1], m.data, dead_letter_headers(
                    user_headers[i].as_py(), err, origin, seq, o.member, deliveries=m.num_delivered))
                s.dead_lettered += 1
                ack_msgs.append(m)
                ack_rows.append(i)
            else:
                await self.client.nak(m)
                self.taken -= 1  # it comes back and is counted again
        return ack_msgs, ack_rows  # dead-lettered ones are acked with the batch but have no output row


def dead_letter_headers(own_json: str | None, error: str, origin: str, seq: int, member: str,
                        deliveries: int | None = None) -> dict[str, str]:
    """A dead-lettered message's headers: its own (from the row's ``headers`` JSON), then why
    and where from (``Cg-*``), and a ``Nats-Msg-Id`` that makes a republish after a crash a
    duplicate the dead-letter stream drops."""
    own = json.loads(own_json) if own_json else {}
    hdrs = {k: (v if isinstance(v, str) else ",".join(v)) for k, v in own.items()}
    hdrs.update({"Cg-Error": error[:1024], "Cg-Origin-Stream": origin, "Cg-Origin-Seq": str(seq),
                 "Cg-Member": member, "Nats-Msg-Id": f"{origin}:{seq}"})
    if deliveries is not None:
        hdrs["Cg-Deliveries"] = str(deliveries)
    return hdrs


async def run_member_batch(nc, sink: TwoPhaseSink, options: BatchOptions, pipeline=None,
                           *, js_prefix: str = "$JS.API") -> Summary:
    """Consume the member's backlog as its pinned instance, land it in ``sink``; return the summary.

    ``pipeline`` (``core/landing/pipeline.py``): what happens to each batch before the sink's prepare
    (decoding and the user's transformation in Spark); default: the rows as read."""
    return await MemberRun(nc, sink, options, pipeline or ArrowPipeline(), js_prefix).run()


def _by_partition(msgs: list) -> list[list]:
    """The batch split by partition (the subject's first token), each part in batch order."""
    parts: dict[str, list] = {}
    for m in msgs:
        parts.setdefault(m.subject[: m.subject.find(".")], []).append(m)
    return list(parts.values())


def _latest_deliveries(msgs: list) -> list:
    """One message per stream sequence (the latest delivery: its ack subject is current)."""
    latest: dict[int, Any] = {}
    for m in msgs:
        old = latest.get(m.stream_seq)
        if old is None or m.num_delivered >= old.num_delivered:
            latest[m.stream_seq] = m
    return list(latest.values()) if len(latest) != len(msgs) else msgs


def _in_stream_order(msgs: list) -> bool:
    """Whether the batch is in strictly increasing stream-sequence order (per partition, that is
    per-key order). Call after ``build_rows``, which caches each message's parsed ack subject."""
    seqs = np.fromiter((m.stream_seq for m in msgs), np.int64, len(msgs))
    return len(seqs) < 2 or bool(np.all(seqs[1:] > seqs[:-1]))


def _pinned_id(info: dict) -> str | None:
    for g in info.get("priority_groups") or []:
        if g.get("pinned_client_id"):
            return g["pinned_client_id"]
    return None
