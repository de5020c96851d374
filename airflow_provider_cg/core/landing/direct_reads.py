"""Reading an elastic member by direct gets, partition by partition, acked by filtered purges.

The member consumer is kept only as the exclusivity token (its pin is held by pulls that take
no message, ``jetstream/direct.py`` says why); each partition is read from its first message in
stream order, so an earlier holder's unacknowledged messages land before newer ones. Batch k+1
is read while batch k lands, and its processing (Spark) may start while batch k finishes its
two-phase steps; its own steps start only after batch k committed. A poison message goes to the
dead-letter stream at once (a direct get is no delivery) and is acked with its range.
"""

from __future__ import annotations

import asyncio
import logging
import time

from airflow_provider_cg.core.jetstream.direct import ALL, DirectReadError, PartitionBatch
from airflow_provider_cg.core.landing.contract import ACK_TIMEOUT
from airflow_provider_cg.core.landing.dead_letters import dead_letter_headers
from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.rows import rows_from_batches

log = logging.getLogger("airflow_provider_cg.landing")


class DirectReads:
    """The direct-get read path of one member run (``member.MemberRun``)."""

    def __init__(self, run) -> None:
        self.run = run
        self.reader = run.reader

    async def consume(self) -> None:
        """Read the member's partitions by direct gets, batch k+1 while batch k lands; the
        pin is kept by pulls that take no message. Batch k+1's processing (Spark) may start
        while batch k finishes its two-phase steps; its own steps wait for batch k's."""
        s = self.run.summary
        # next sequence to read per partition; the whole stream if every partition is ours
        owns_all = set(self.run.partitions) == set(range(self.run.config.max_members))
        starts = {ALL: 0} if owns_all else {p: 0 for p in self.run.partitions}
        keeper = asyncio.create_task(self.run.keep_pin_until_lost())
        landing: asyncio.Task | None = None
        transient_deadline = None
        try:
            while True:
                if self.run.lander.taken_over:
                    s.stop_reason = "taken over by another instance"
                    break
                if keeper.done() or not await self.run.client.keep_pin():  # also notices a step-down at once
                    s.stop_reason = "pin lost"
                    break
                reason = self.run.limit_reached()
                if reason:
                    s.stop_reason = reason
                    break
                try:
                    batches = await self.reader.read_partitions(starts, min(self.run.batch_size, s.target - self.run.taken))
                    transient_deadline = None
                except DirectReadError as e:
                    transient_deadline = transient_deadline or time.monotonic() + max(self.run.ack_wait, 30.0)
                    if not e.retryable or time.monotonic() > transient_deadline:
                        raise
                    log.warning("cg read interrupted (%s); retrying", e)
                    await asyncio.sleep(0.5)
                    continue
                if not batches:  # drained, unless by a successor while this instance stalled
                    if landing is not None:
                        await self.run.await_landing(landing)
                        landing = None
                    s.stop_reason = "backlog drained" if await self.run.client.holds_pin() else "pin lost"
                    break
                for b in batches:
                    starts[b.partition] = b.last_seq + 1
                    self.run.taken += len(b)
                previous, landing = landing, None
                if not self.run.lander.taken_over and not keeper.done():
                    landing = asyncio.create_task(self._land_direct(batches, after=previous))
                if previous is not None:
                    await self.run.await_landing(previous)
                self.run.progress.tick()
        finally:
            if landing is not None:
                await self.run.await_landing(landing)
            keeper.cancel()

    async def _land_direct(self, batches: list[PartitionBatch], after: asyncio.Task | None = None) -> None:
        """One batch read by direct gets: its rows and processing, then (once the batch
        ``after`` has landed) the two-phase steps with one purge per partition as the ack of
        the range read. Nothing of it is prepared if ``after`` failed or was taken over."""
        o = self.run.options
        table, refs = await asyncio.to_thread(rows_from_batches, batches, group=o.group, member=o.member,
                                              keys=self.run.keys)
        batch_id = self.run.next_batch_id()
        processed = await asyncio.to_thread(self.run.pipeline.process, self.run.sink, table, batch_id)
        if after is not None:
            await asyncio.wait({after})
            if after.cancelled() or after.exception() is not None or self.run.lander.taken_over:
                await asyncio.to_thread(self.run.sink.discard, processed.rows)
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

        await self.run.lander.land(batch_id, processed, table, {self.run.consumer_stream: refs}, ack, len(refs),
                               sum(len(d) for b in batches for d in b.data))

    async def _dead_letter(self, table, bad: dict[int, str]) -> None:
        """Direct reads: a decode failure goes to the dead-letter stream at once (a direct get
        is no delivery; decoding again would fail again), with the message's own headers, and
        is acknowledged with its range."""
        o, s = self.run.options, self.run.summary
        s.poison_deliveries += len(bad)
        cols = table.select(["origin_stream", "origin_seq", "subject", "payload", "headers"]).to_pylist()
        for i, err in bad.items():
            row = cols[i]
            origin, seq = row["origin_stream"], row["origin_seq"]
            await self.run.dlq.publish(row["subject"], row["payload"], dead_letter_headers(
                row["headers"], err, origin, seq, o.member))
            s.dead_lettered += 1
