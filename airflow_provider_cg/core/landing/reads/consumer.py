"""Reading a member through its consumer: pulls as the pinned client, a double ack per message.

Static groups always read this way (nothing is ever removed from an origin stream), elastic
groups when asked to (``read="consumer"``) or when their work-queue stream has no direct gets.
A new pin holder first waits until every message the consumer still has unacknowledged is in
its hands (earlier holders' in-flight messages come back after their ack wait), then lands in
stream order; batch k+1 is pulled while batch k goes through the two-phase steps. Poison
messages are nak'd while they have deliveries left, then dead-lettered and acked.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.client import PriorityClient
from airflow_provider_cg.core.jetstream.protocol import AckOutcome, ConsumerGone, PinLost, PullTransient
from airflow_provider_cg.core.landing.contract import ACK_TIMEOUT
from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.modes import StopReason
from airflow_provider_cg.core.landing.pipeline.processing import ProcessedBatch
from airflow_provider_cg.core.landing.protocol.dead_letters import dead_letter_headers
from airflow_provider_cg.core.landing.reads.reading import MemberReading
from airflow_provider_cg.core.landing.rows import build_rows

log = logging.getLogger("airflow_provider_cg.landing")


class ConsumerReads:
    """The consumer read path of one member run (``member.MemberRun``), given its
    ``MemberReading``: the pin, the lander, the stop rule and the summary are the run's. A
    ``reads.registry.Reader``."""

    read_path = "consumer"  # what the summary reports

    def __init__(self, reading: MemberReading) -> None:
        self.r = reading
        self.batch_size = reading.batch_size  # lowered to fit an existing consumer's max_ack_pending
        self.landing_msgs: list = []  # the batch being landed (kept in progress while the next one waits)
        self.idle_checks = 0  # empty pulls answered by "still pending" (bounded)
        self.fit_batch_to(reading.consumer_info)

    def pin_pull(self, target: int) -> int:
        return min(self.batch_size, max(target, 1))

    async def begin(self, first: list, pinned: dict) -> str | None:
        return None  # the consumer knows every delivery

    async def land(self, first: list, landed: set[int]) -> bool:
        held = await self.settle_predecessors(first, landed)
        if held is None:
            return False
        await self.consume(held)
        return True

    async def settle_predecessors(self, held: list, landed: set[int]) -> list | None:
        """Reading through the consumer: wait until every unacknowledged message of the
        consumer is in ``held``; returns them (None: the pin moved on meanwhile, or the
        predecessors' messages never came back).

        The server moves the pin without waiting for the old holder's unacked messages; they
        come back to the pin holder only when their ack wait expires. Landing the newer
        messages first would break per-key order, so this pulls (which also keeps the pin)
        until the consumer's ack-pending count is all ours, keeping ours alive with +WPI.
        Messages whose rows recovery just committed are acked at once: they are landed, and
        an earlier holder's late ack of them must not be mistaken for progress."""
        r, s = self.r, self.r.summary
        client = r.pin.client
        done = [m for m in held if m.stream_seq in landed] if landed else []  # one pull: no repeats
        if done:
            await client.ack_sync_many(done, timeout=min(ACK_TIMEOUT, 10.0))
            r.stop.took(len(done))
            held = [m for m in held if m.stream_seq not in landed]
        ack_wait = r.pin.consumer_ack_wait
        deadline = time.monotonic() + 3 * ack_wait + 30
        refreshed = time.monotonic()
        waited = False
        while True:
            foreign = int((await client.consumer_info()).get("num_ack_pending", 0)) - len(held)
            if foreign <= 0:
                break
            if not waited:
                log.info("cg member=%s: %d messages still in flight at an earlier instance; waiting for them "
                         "(up to the consumer's ack wait, %.1fs) before landing", r.member, foreign, ack_wait)
                waited = True
            if time.monotonic() > deadline:
                s.stop_reason = f"{foreign} messages of an earlier instance did not come back"
                return None
            if time.monotonic() - refreshed > ack_wait / 3:
                for m in held:
                    await client.in_progress(m)
                refreshed = time.monotonic()
            try:
                more = await client.pull(max(1, foreign), expires=min(1.0, r.pin.pull_expires_max))
            except PinLost:
                s.stop_reason = StopReason.PIN_LOST_WAITING
                return None
            except PullTransient:
                await asyncio.sleep(0.5)
                continue
            held = _latest_deliveries(held + more)
        if waited:
            log.info("cg member=%s: earlier instances' messages are back; %d held", r.member, len(held))
        return held

    async def consume(self, first: list) -> None:
        """Pull batch k+1 while batch k is landed (prepare, ack, commit) in the background."""
        r, s = self.r, self.r.summary
        client = r.pin.client
        landing: asyncio.Task | None = None
        end: StopReason | None
        msgs, end = first, None  # end: why the pulls ended (the pin, the consumer, the backlog)
        transient_deadline = None
        try:
            while True:
                if msgs:
                    r.stop.took(len(msgs), functools.partial(_payload_bytes, msgs))
                    if landing is not None:
                        await r.pin.await_landing(landing, functools.partial(self._in_progress, msgs))
                    if not client.is_pinned and end is None:
                        end = StopReason.PIN_LOST  # lost while the last batch landed: leave these to the new holder
                    elif not r.lander.taken_over:  # else leave them unacked to the new pin holder
                        landing = asyncio.create_task(self._land(msgs, consumer_gone=end is StopReason.CONSUMER_DELETED))
                r.progress.tick()  # also while a follower waits for messages
                if end is not None and landing is not None:
                    await r.pin.await_landing(landing, self._in_progress)  # its outcome may say why we stop
                    landing = None
                if r.lander.taken_over:
                    s.stop_reason = StopReason.TAKEN_OVER
                    break
                if end is not None:
                    s.stop_reason = end
                    break
                reason = r.stop.reason()
                if reason is StopReason.TARGET_REACHED and landing is not None:
                    # The batch still landing may nak poison messages back (``taken`` drops):
                    # they are part of the target and must come back here, to be dead-lettered
                    # once out of deliveries, not be left behind in the stream.
                    await r.pin.await_landing(landing, self._in_progress)
                    landing = None
                    reason = r.stop.reason()
                if reason:
                    s.stop_reason = reason
                    break
                want = r.stop.wanted(self.batch_size)
                try:
                    await r.stop.pace()  # a follower's batch: what arrives within its commit interval
                    expires = r.options.commit_interval if r.stop.following else r.options.idle_timeout
                    msgs = await client.pull(want, expires=min(expires, r.pin.pull_expires_max))
                    r.stop.read_found(len(msgs), want)
                    transient_deadline = None
                    if not msgs and r.stop.following:
                        self.idle_checks = 0  # a follower waits for what comes (its rule says until when)
                    elif not msgs and not await self._backlog_left():
                        end = StopReason.BACKLOG_DRAINED
                except PinLost as e:
                    msgs, end = e.messages, StopReason.PIN_LOST
                except ConsumerGone as e:
                    msgs, end = e.messages, StopReason.CONSUMER_DELETED
                except PullTransient as e:  # server restart, leadership change: keep trying a while
                    msgs = e.messages
                    transient_deadline = transient_deadline or time.monotonic() + max(r.assignment.ack_wait, 30.0)
                    if time.monotonic() > transient_deadline:
                        raise
                    log.warning("cg pull interrupted (%s); retrying", e)
                    await asyncio.sleep(0.5)
        finally:
            if landing is not None:
                await r.pin.await_landing(landing, self._in_progress)

    def _in_progress(self, held: Sequence = ()) -> list:
        """The messages to keep in progress: the landing batch's, and ``held``, the next one's."""
        return [*self.landing_msgs, *held]

    async def _backlog_left(self) -> bool:
        """After a pull came back empty: is anything still pending for us? A slow server can
        let one short pull expire while messages remain; the consumer's own count decides."""
        if self.idle_checks >= 3:
            return False
        self.idle_checks += 1
        try:
            info = await self.r.pin.client.consumer_info()
        except Exception:
            return False
        return int(info.get("num_pending", 0)) > 0

    async def _land(self, msgs: list, consumer_gone: bool = False) -> None:
        """One batch read through the consumer: its rows, then the two-phase steps with a
        double ack per message (partition by partition)."""
        r = self.r
        self.landing_msgs = msgs
        table = build_rows(msgs, group=r.options.group, member=r.member, keys=r.assignment.keys,
                           sourced=r.assignment.elastic)
        if not _in_stream_order(msgs):  # right after a takeover or a redelivery
            msgs = sorted(_latest_deliveries(msgs), key=lambda m: m.stream_seq)
            table = build_rows(msgs, group=r.options.group, member=r.member, keys=r.assignment.keys,
                               sourced=r.assignment.elastic)
        table = r.rows_of(table)
        lo, hi = pc.min_max(table.column("partition")).values()
        one_partition = lo == hi
        batch_id = r.next_batch_id()
        if consumer_gone:  # nothing is acked: the rows only go through prepare and abort
            processed = ProcessedBatch(table, {})
        else:  # fails the batch (no ack sent) if the user's transformation fails
            processed = await asyncio.to_thread(r.pipeline.process, r.sink, table, batch_id)
        inputs = table
        if processed.bad:
            msgs, rows = await self._handle_poison(table, msgs, processed.bad)
            inputs = table.take(pa.array(rows, pa.int64()))  # typed: the list may be empty
        if not msgs:
            await asyncio.to_thread(r.sink.discard, processed.rows)
            return

        async def ack() -> int:
            acked: list = []
            outcomes: list[AckOutcome] = []
            for part in [msgs] if one_partition else _by_partition(msgs):
                outcomes += await r.pin.client.ack_sync_many(part, timeout=min(ACK_TIMEOUT, 10.0))
                acked += part
                failpoint("mid_ack")
            return await _resolve_acks(r.pin.client, r.api, r.assignment.consumer_stream, r.assignment.elastic,
                                       acked, outcomes, time.monotonic() + ACK_TIMEOUT)

        refs = np.fromiter((m.stream_seq for m in msgs), np.int64, len(msgs))
        await r.lander.land(batch_id, processed, inputs, {r.assignment.consumer_stream: refs}, ack, len(msgs),
                            sum(len(m.data) for m in msgs), abort=consumer_gone, recompute=r.recompute_step(inputs))

    async def _handle_poison(self, table: pa.Table, msgs: list, bad: dict[int, str]) -> tuple[list, list[int]]:
        """Nak poison messages that have deliveries left; dead-letter the others (then ack them
        with the batch). ``table``: the batch's rows as read. Returns the messages to ack and
        their rows' indexes."""
        r, s = self.r, self.r.summary
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
            elif m.num_delivered >= r.options.max_deliver:
                origin, seq = origin_streams[i].as_py(), origin_seqs[i].as_py()
                await r.dlq.publish(partitioning.strip_partition(m.subject)[1], m.data, dead_letter_headers(
                    user_headers[i].as_py(), err, origin, seq, r.member, deliveries=m.num_delivered))
                s.dead_lettered += 1
                ack_msgs.append(m)
                ack_rows.append(i)
            else:
                await r.pin.client.nak(m)
                r.stop.gave_back(1)  # it comes back and is counted again
        return ack_msgs, ack_rows  # dead-lettered ones are acked with the batch but have no output row

    def fit_batch_to(self, info: dict) -> None:
        """Keep a batch (and the next one pulled while it lands) within the consumer's
        max_ack_pending: an existing consumer keeps the limit it was created with (by an
        earlier run with a smaller batch size), and a pull for more than it may deliver waits
        until its expiry for messages that cannot come."""
        limit = int((info.get("config") or {}).get("max_ack_pending") or 0)
        if limit > 0 and self.batch_size > max(1, limit // 2):
            log.warning("cg batch size %d > half the consumer's max_ack_pending %d; using %d",
                        self.batch_size, limit, max(1, limit // 2))
            self.batch_size = max(1, limit // 2)


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


def _payload_bytes(msgs: list) -> int:
    """The payload bytes of pulled messages (``StopRule.took``, under a byte budget)."""
    return sum(len(m.data) for m in msgs)
