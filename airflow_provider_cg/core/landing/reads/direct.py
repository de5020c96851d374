"""Reading a member by direct gets, acknowledging each landed batch as one range.

The member consumer is kept only as the exclusivity token (its pin is held by pulls that take
no message, ``jetstream/direct_gets.py`` says why). Batch k+1 is read while batch k lands, and its
processing (Spark) may start while batch k finishes its two-phase steps; its own steps start
only after batch k committed. A poison message goes to the dead-letter stream at once (a
direct get is no delivery) and is acked with its range. Where the member is and how a range
is acknowledged depends on the group:

- elastic (``PartitionPositions``): the work-queue stream holds only what is not yet acked, so
  each partition is read from its first message in stream order (an earlier holder's
  unacknowledged messages land before newer ones) and a landed range goes with one filtered
  purge per partition;
- static (``ConsumerPosition``): nothing is ever removed from the origin stream; the member's
  durable consumer says where it is. Its filter subjects are read from there up to a common
  cut, and a landed batch moves the durable past the cut (``$JS.API.CONSUMER.RESET``), so the
  durable's position stays right for orbit's tools and for the consumer read path.
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

from airflow_provider_cg.core.errors import ConsumerGroupError, JetStreamApiError
from airflow_provider_cg.core.jetstream import tasks
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.direct_gets import (
    ALL,
    DirectReadError,
    PartitionBatch,
    PartitionReader,
    PartitionStreamLost,
    PartitionStreamReaders,
    ReadRange,
    plan_ranges,
    subject_filter,
)
from airflow_provider_cg.core.landing.contract import ACK_TIMEOUT
from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.modes import StopReason
from airflow_provider_cg.core.landing.pipeline.processing import ProcessedBatch
from airflow_provider_cg.core.landing.protocol.dead_letters import dead_letter_headers
from airflow_provider_cg.core.landing.reads.reading import MemberReading
from airflow_provider_cg.core.landing.rows import keep_matching, rows_from_batches

log = logging.getLogger("airflow_provider_cg.landing")


class PartitionPositions:
    """An elastic member's place in its work-queue stream: the next sequence to read per
    partition (the whole stream, unfiltered, when every partition is the member's)."""

    origin = None  # rows name their origin from the sourcing header
    only = None  # every message read is the member's
    declined: str | None = None  # (never: the stream holds what is unacknowledged)

    def __init__(self, reader: PartitionReader | PartitionStreamReaders, partitions: Sequence[int], max_members: int,
                 filters: list[str]) -> None:
        self.reader = reader
        owns_all = set(partitions) == set(range(max_members))
        self.starts = {ALL: 0} if owns_all else {p: 0 for p in partitions}
        # a partition with one filter subject is read by it rather than by ``<p>.>`` (faster)
        by_partition: dict[int, list[str]] = {}
        for f in filters:
            by_partition.setdefault(int(f.split(".", 1)[0]), []).append(f)
        self.subjects = {p: fs[0] for p, fs in by_partition.items() if len(fs) == 1}

    async def begin(self, first: list, info: dict) -> bool:
        """Right after the pin: nothing to settle (the stream holds what is unacknowledged)."""
        return True

    async def read(self, count: int) -> tuple[list[PartitionBatch], None]:
        batches = await self.reader.read_partitions(self.starts, count, subjects=self.subjects)
        for b in batches:
            self.starts[b.partition] = b.last_seq + 1
        return batches, None

    async def plan(self, count: int, last_seq: int | None = None) -> tuple[list[ReadRange], int]:
        """The next batch as ranges for Spark tasks to read (``reads/executors.py``), each
        partition up to one cut (at most ``last_seq``, default the stream's last now); the next
        batch starts after it."""
        starts = {p: (self._subject(p), s) for p, s in self.starts.items()}
        ranges, cut = await plan_ranges(self.reader, starts, count,
                                        await self.reader.last_seq() if last_seq is None else last_seq)
        if ranges:
            self.starts = {p: cut + 1 for p in self.starts}
        return ranges, cut

    def where(self) -> dict[int, int]:
        """The next sequence to read, per partition (``ALL``: the whole stream)."""
        return dict(self.starts)

    def place(self, where: dict[int, int]) -> None:
        """Read on from ``where`` (``where()``'s): a partition it does not name from its first."""
        self.starts = {p: int(where.get(p, 0)) for p in self.starts}

    def ranges_between(self, start: dict[int, int], end: dict[int, int]) -> list[ReadRange]:
        """The ranges from ``start`` up to (not including) ``end``, per partition of ``end``
        (a partition ``start`` does not name: from its first message)."""
        return [ReadRange(p, self._subject(p), max(1, start.get(p, 0)), e - 1, e - max(1, start.get(p, 0)),
                          self._stream(p)) for p, e in end.items() if e - 1 >= max(1, start.get(p, 0))]

    def _subject(self, partition: int) -> str:
        return self.subjects.get(partition) or subject_filter(partition)

    def _stream(self, partition: int) -> str | None:
        return None

    async def ack(self, batches: list[PartitionBatch] | list[ReadRange], _cut: int | None) -> int:
        """One filtered purge per partition; returns how many messages' acks are unknown."""
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


class PartitionStreamPositions(PartitionPositions):
    """An elastic member's place in its partition streams (``groups/layouts/``): as in the
    work queue, but each partition is a stream of its own, read unfiltered from its first
    message, and a landed range is purged from the partition log and then from the stream
    (``PartitionStreamReaders``); the sequences are the log's, so rows and acks are as in the
    work queue."""

    reader: PartitionStreamReaders

    def __init__(self, readers: PartitionStreamReaders, partitions: Sequence[int]) -> None:
        self.reader = readers
        self.starts = {p: 0 for p in partitions}
        self.subjects = {p: subject_filter(ALL) for p in partitions}

    def _stream(self, partition: int) -> str | None:
        return self.reader.streams[partition]

    async def behind(self) -> list[int]:
        """The partitions whose log holds messages from where they are read that their streams
        do not hold yet (a mirror catching up, a stream being rebuilt): not drained."""
        if self.reader.without_log:
            return []
        found = await asyncio.gather(*(self.reader.api.next_msg(self.reader.log, max(s, 1), f"{p}.>")
                                       for p, s in self.starts.items()))
        return [p for p, head in zip(self.starts, found, strict=True) if head is not None]


class ConsumerPosition:
    """A static member's place in its origin stream: its durable consumer's, one sequence for
    all of its partitions. ``subjects`` are what is read: the member's filter subjects, or ``>``
    when it holds every partition, with ``only`` (a regular expression of its filter subjects)
    dropping what else the stream stores. Why: nats-server serves a next-by-subject read
    filtered by a subject with a leading wildcard (``*.orders.*``) about 10x slower than an
    unfiltered one (it matches the filter against every subject it knows, per message), and
    reading each partition's ``<p>.<filter>`` scans the stream once per partition."""

    def __init__(self, reader: PartitionReader, api: JsApi, stream: str, consumer: str, subjects: list[str],
                 only: str | None, filters: list[str] | None = None) -> None:
        self.reader, self.api, self.stream, self.consumer = reader, api, stream, consumer
        self.subjects, self.only = subjects, only
        self.filters = filters or subjects  # what is the member's: counted when planning
        self.origin = stream
        self.next_seq = 0
        self.declined: str | None = None  # why begin() chose the consumer path, with the remedy

    async def begin(self, first: list, info: dict) -> bool:
        """Right after the pin, with ``first`` the message(s) the pinning pull took: start at
        the first of them when nothing else is in flight on the durable (else False: an earlier
        holder's deliveries are settled through the consumer, which knows them). The durable is
        moved back onto that message at once, so that nothing of this run stays delivered on
        it: if the run dies, the next one finds the durable as clean as this one did."""
        seqs = [m.stream_seq for m in first]
        delivered = int((info.get("delivered") or {}).get("stream_seq") or 0)
        if int(info.get("num_ack_pending") or 0) > len(first) or delivered > max(seqs):
            self.declined = (f"earlier deliveries are in flight on durable {self.consumer} (an earlier instance's); "
                             "they settle this run, the next run reads by direct gets")
            log.info("cg: earlier deliveries are in flight on durable %s", self.consumer)
            return False
        self.next_seq = min(seqs)
        try:
            await self.api.reset_consumer(self.stream, self.consumer, self.next_seq)
        except JetStreamApiError as e:  # e.g. a durable made with another deliver policy refuses it
            self.declined = (f"durable {self.consumer} cannot be moved ({e.description}); recreate it with "
                             "deliver_policy all (delete it: the job creates it as the group expects)")
            log.info("cg: durable %s cannot be moved (%s); reading through it", self.consumer, e)
            return False
        return True

    async def read(self, count: int) -> tuple[list[PartitionBatch], int]:
        while True:
            batches, cut = await self.reader.read_through(self.subjects, self.next_seq, count)
            self.next_seq = cut + 1
            if not batches or self.only is None:
                return batches, cut
            mine = await asyncio.to_thread(keep_matching, batches, self.only)
            if mine:  # else only others' messages so far: read on (the next ack moves past them)
                return mine, cut

    async def plan(self, count: int, last_seq: int | None = None) -> tuple[list[ReadRange], int]:
        """The next batch as ranges of the member's subjects up to one cut (at most
        ``last_seq``, default the stream's last now), for Spark tasks to read
        (``reads/executors.py``); the next batch starts after the cut."""
        starts = {i: (subject, self.next_seq) for i, subject in enumerate(self.filters)}
        ranges, cut = await plan_ranges(self.reader, starts, count,
                                        await self.reader.last_seq() if last_seq is None else last_seq)
        if ranges:
            self.next_seq = cut + 1
        if ranges and self.subjects != self.filters:  # counted by filter, read unfiltered (see above)
            ranges = [ReadRange(ALL, self.subjects[0], min(r.first_seq for r in ranges), cut,
                                sum(r.messages for r in ranges))]
        return ranges, cut

    def where(self) -> dict[int, int]:
        """The next sequence to read (one for all the member's subjects: ``ALL``)."""
        return {ALL: self.next_seq}

    def place(self, where: dict[int, int]) -> None:
        self.next_seq = int(where.get(ALL, self.next_seq))

    def ranges_between(self, start: dict[int, int], end: dict[int, int]) -> list[ReadRange]:
        """The ranges of the member's subjects from ``start`` up to (not including) ``end``."""
        first, last = max(1, start.get(ALL, 0)), end.get(ALL, 0) - 1
        if last < first:
            return []
        if self.subjects != self.filters:
            return [ReadRange(ALL, self.subjects[0], first, last, last - first + 1)]
        return [ReadRange(i, f, first, last, last - first + 1) for i, f in enumerate(self.filters)]

    async def ack(self, batches: list[PartitionBatch] | list[ReadRange], cut: int | None) -> int:
        """Move the durable past ``cut`` (what ``read`` and ``plan`` returned: never None here);
        returns how many messages' acks are unknown."""
        if cut is None:
            raise ConsumerGroupError("a durable's read has a cut")
        deadline = asyncio.get_running_loop().time() + ACK_TIMEOUT
        while True:
            try:
                await self.api.reset_consumer(self.stream, self.consumer, cut + 1, timeout=min(ACK_TIMEOUT, 10.0))
                failpoint("mid_ack")
                return 0
            except Exception as e:  # the move may or may not have taken effect: look
                log.warning("cg move of %s past %d: %s; checking", self.consumer, cut, e)
                try:
                    info = await self.api.consumer_info(self.stream, self.consumer)
                    if info is not None and int((info.get("ack_floor") or {}).get("stream_seq") or 0) >= cut:
                        return 0
                except Exception:  # noqa: BLE001 - server away: try again until the deadline
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    return sum(len(b) for b in batches)
                await asyncio.sleep(0.5)


#: where a direct-get reader reads the member's messages from, and how it acks a range
Positions = PartitionPositions | PartitionStreamPositions | ConsumerPosition


class DirectReads:
    """The direct-get read path of one member run (``member.MemberRun``), given its
    ``MemberReading``: a ``reads.registry.Reader``."""

    read_path = "direct"  # what the summary reports

    def __init__(self, reading: MemberReading, positions: Positions) -> None:
        self.r = reading
        self.positions = positions
        self.batch_size = reading.batch_size
        self._behind_since: float | None = None

    def pin_pull(self, target: int) -> int:
        return 1  # reading by direct gets, the pin is all this pull is for

    async def begin(self, first: list, pinned: dict) -> str | None:
        if await self.positions.begin(first, pinned):
            return None
        return self.positions.declined or "the durable cannot be read directly"

    async def land(self, first: list, landed: set[int]) -> bool:
        """The stream (elastic) or the durable's position (static), not the consumer's
        deliveries, says what earlier holders left unacknowledged: nothing to settle first."""
        # as the pin holder: a partition stream its server lost is made again first
        if self.r.assignment.partition_streams:
            await self.r.ensure_current()
        await self.consume()
        return True

    async def _streams_behind(self) -> bool:
        """Nothing read from the partition streams, but a partition's log holds what its stream
        does not yet (its mirror catching up, a rebuilt stream filling): wait a moment rather
        than call the backlog drained. A stream still behind after the standby timeout ends the
        run (exit 2, retried) naming it."""
        behind = await self.positions.behind() if isinstance(self.positions, PartitionStreamPositions) else []
        if not behind:
            self._behind_since = None
            return False
        now = time.monotonic()
        self._behind_since = self._behind_since or now
        if now - self._behind_since > self.r.options.standby_timeout:
            p = behind[0]
            raise ConsumerGroupError(f"partition {p}'s stream has not received what its log holds for "
                                     f"{now - self._behind_since:.0f}s (its mirror does not move: cg status shows it)")
        await asyncio.sleep(0.2)
        return True

    async def consume(self) -> None:
        """Read the member's partitions by direct gets, batch k+1 while batch k lands; the
        pin is kept by pulls that take no message. Batch k+1's processing (Spark) may start
        while batch k finishes its two-phase steps; its own steps wait for batch k's."""
        r, s = self.r, self.r.summary
        keeper = asyncio.create_task(r.pin.keep_until_lost())
        landing: asyncio.Task | None = None
        transient_deadline = None
        try:
            while True:
                if r.lander.taken_over:
                    s.stop_reason = StopReason.TAKEN_OVER
                    break
                if keeper.done() or not await r.pin.client.keep_pin():  # also notices a step-down at once
                    s.stop_reason = StopReason.PIN_LOST
                    break
                reason = r.stop.reason()
                if reason:
                    s.stop_reason = reason
                    break
                try:
                    await r.stop.pace()  # a follower's batch: what arrives within its commit interval
                    wanted = r.stop.wanted(r.batch_size)
                    batches, cut = await self._next(wanted)
                    r.stop.read_found(sum(len(b) for b in batches), wanted)
                    transient_deadline = None
                except PartitionStreamLost as e:  # nothing newer of it lands before what it lost
                    if landing is not None:
                        await r.pin.await_landing(landing)
                        landing = None
                    await r.rebuild_partition(e.partition)
                    continue
                except DirectReadError as e:
                    transient_deadline = transient_deadline or time.monotonic() + max(r.assignment.ack_wait, 30.0)
                    if not e.retryable or time.monotonic() > transient_deadline:
                        raise
                    log.warning("cg read interrupted (%s); retrying", e)
                    await asyncio.sleep(0.5)
                    continue
                if not batches:  # drained, unless by a successor while this instance stalled
                    if landing is not None:
                        await r.pin.await_landing(landing)
                        landing = None
                    # nothing read: an empty partition stream, or one that cannot serve
                    if r.assignment.partition_streams:
                        await r.ensure_current()
                        if await self._streams_behind():
                            continue
                    r.progress.tick()  # a follower's line (and board) while it waits
                    if await r.stop.waits_for_more():  # a follower: new messages, in a moment
                        continue
                    s.stop_reason = StopReason.BACKLOG_DRAINED if await r.pin.holds() else StopReason.PIN_LOST
                    break
                r.stop.took(sum(len(b) for b in batches), functools.partial(_payload_bytes, batches))
                previous, landing = landing, None
                if not r.lander.taken_over and not keeper.done():
                    landing = asyncio.create_task(self._land(batches, cut, after=previous))
                if previous is not None:
                    await r.pin.await_landing(previous)
                r.progress.tick()
        finally:
            if landing is not None:
                await r.pin.await_landing(landing)
            await tasks.stop(keeper)

    async def _next(self, count: int) -> tuple[list[Any], int | None]:
        """The next batch to land: the messages read (``PartitionBatch``), or for the executor
        path the ranges planned (``ReadRange``); and the cut it ends at."""
        return await self.positions.read(count)

    async def _land(self, batches: list[Any], cut: int | None, after: asyncio.Task | None = None) -> None:
        """One batch read by direct gets: its rows and processing, then (once the batch
        ``after`` has landed) the two-phase steps with the ack of the range read. Nothing of
        it is prepared if ``after`` failed or was taken over."""
        r, positions = self.r, self.positions
        batch_id = r.next_batch_id()  # in read order: the landing tasks start in the order they were made

        def rows_and_output() -> tuple[pa.Table, np.ndarray, ProcessedBatch]:  # one hand-off to a worker thread per batch, not one per step
            table, refs = rows_from_batches(batches, group=r.options.group, member=r.member, keys=r.assignment.keys,
                                            origin=positions.origin)
            table = r.rows_of(table)
            return table, refs, r.pipeline.process(r.sink, table, batch_id)

        table, refs, processed = await asyncio.to_thread(rows_and_output)
        if not await self._previous_landed(after, processed):
            return
        if processed.bad:
            await self._dead_letter(table, processed.bad)

        async def ack() -> int:
            return await positions.ack(batches, cut)

        await r.lander.land(batch_id, processed, table, {r.assignment.consumer_stream: refs}, ack, len(refs),
                            sum(len(d) for b in batches for d in b.data), recompute=r.recompute_step(table))

    async def _previous_landed(self, after: asyncio.Task | None, processed: ProcessedBatch) -> bool:
        """Wait for the batch before this one (``after``) to land. If it failed or a successor
        took over, this one's processed output is discarded and it goes no further (False)."""
        if after is None:
            return True
        await asyncio.wait({after})
        if after.cancelled() or after.exception() is not None or self.r.lander.taken_over:
            await asyncio.to_thread(self.r.sink.discard, processed.rows)
            return False
        return True

    async def _dead_letter(self, table: pa.Table, bad: dict[int, str]) -> None:
        """Direct reads: a decode failure goes to the dead-letter stream at once (a direct get
        is no delivery; decoding again would fail again), with the message's own headers, and
        is acknowledged with its range."""
        s = self.r.summary
        s.poison_deliveries += len(bad)
        cols = table.select(["origin_stream", "origin_seq", "subject", "payload", "headers"]).to_pylist()
        for i, err in bad.items():
            row = cols[i]
            origin, seq = row["origin_stream"], row["origin_seq"]
            await self.r.dlq.publish(row["subject"], row["payload"], dead_letter_headers(
                row["headers"], err, origin, seq, self.r.member))
            s.dead_lettered += 1


def _payload_bytes(batches: list[Any]) -> int | None:
    """The payload bytes of a batch read in the driver (None: planned ranges, read by Spark)."""
    if not batches or not isinstance(batches[0], PartitionBatch):
        return None
    return sum(len(d) for b in batches for d in b.data)
