"""Reading a member's batches in Spark's tasks (``--read executors``).

The driver plans each batch without reading it (``direct.plan_ranges``: per partition, or per
filter subject of a static member, a sequence range up to one cut, counted by the server) and
keeps everything that needs the pin: the fences, recovery, the two-phase steps and the ack
(the purges, or the durable's move) of the ranges. The batch's Spark job reads the ranges
from NATS in its tasks (``nats_source.py``), decodes, transforms and stages the result in the
sink; the inputs it read, their bytes and the poison rows' raw messages come back with that
job. So a member's throughput grows with its executors, not with its driver.

Exactly-once is kept as on the other read paths: the committed inputs are dropped (checked
once the job reports what it read; a batch that holds some is computed again without them),
the sink records the batch's inputs with its output, per-key order holds because batch k+1's
two-phase steps wait for batch k's commit, and poison messages go to the dead-letter stream
and are acknowledged with their range.
"""

from __future__ import annotations

import asyncio

import numpy as np

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.jetstream.direct_gets import ALL, ReadRange
from airflow_provider_cg.core.landing.pipeline.nats_source import batch_plan
from airflow_provider_cg.core.landing.pipeline.processing import ProcessedBatch, SparkPipeline
from airflow_provider_cg.core.landing.reads.direct import ConsumerPosition, DirectReads, Positions
from airflow_provider_cg.core.landing.reads.reading import MemberReading
from airflow_provider_cg.core.landing.rows import BatchId


class ExecutorReads(DirectReads):
    """The executor read path of one member run (``member.MemberRun``); the loop, the pin
    keeping and the order of the two-phase steps are the direct-get path's."""

    read_path = "executors"  # what the summary reports

    def __init__(self, reading: MemberReading, positions: Positions) -> None:
        super().__init__(reading, positions)
        if not isinstance(reading.pipeline, SparkPipeline):  # (the contract refuses executors without Spark)
            raise ConfigError("read", "executors are Spark's (drop no_spark)")
        self.pipeline = reading.pipeline
        self.parallelism = max(1, self.pipeline.parallelism)

    async def _next(self, count: int) -> tuple[list[ReadRange], int | None]:
        return await self.positions.plan(count)

    def _plan(self, ranges: list[ReadRange], skip: np.ndarray | None) -> str:
        r = self.r
        return batch_plan(ranges, stream=r.assignment.consumer_stream, origin=self.positions.origin,
                          group=r.options.group, member=r.member, key_rules=r.assignment.key_rules, js_prefix=r.api.prefix,
                          only=self.positions.only, parallelism=self.parallelism, skip=skip,
                          origin_keys=r.origin)

    async def _land(self, ranges: list[ReadRange], cut: int | None, after: asyncio.Task | None = None) -> None:
        r, positions = self.r, self.positions
        if cut is None:  # (a plan always has one)
            raise ConsumerGroupError("a planned batch has a cut")
        origin = r.origin
        batch_id = r.next_batch_id()
        partitions = r.assignment.partitions if any(rg.partition == ALL for rg in ranges) or \
            isinstance(positions, ConsumerPosition) else tuple(sorted({rg.partition for rg in ranges}))
        processed, read = await asyncio.to_thread(self.pipeline.process_ranges, r.sink,
                                                  lambda skip: self._plan(ranges, skip), origin, batch_id,
                                                  partitions)
        if not await self._previous_landed(after, processed):
            return
        if processed.bad:
            await self._dead_letter(read.poison, processed.bad)

        async def ack() -> int:
            return await positions.ack(ranges, cut)

        # the ranges read, as recovery's refs: besides the member's messages they cover only
        # other partitions' or subjects' sequences, which its consumer is never delivered
        first = min(rg.first_seq for rg in ranges)
        refs = np.arange(first, cut + 1, dtype=np.int64)
        def recompute() -> tuple[BatchId, ProcessedBatch]:
            new_id = r.next_batch_id()
            return new_id, self.pipeline.process_ranges(r.sink, lambda skip: self._plan(ranges, skip),
                                                       origin, new_id, partitions)[0]

        await r.lander.land(batch_id, processed, read.inputs, {r.assignment.consumer_stream: refs}, ack,
                              read.messages + processed.skipped, read.bytes, recompute=recompute)
