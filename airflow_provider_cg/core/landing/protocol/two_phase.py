"""The two-phase steps of landing one batch, written once for live batches and backfills.

    fence (once per writer) -> recover -> prepare -> mark acking -> ack -> commit

The rule for ending a batch (docs/architecture.md): roll back only when it is certain that no
ack took effect (the acking mark was never written, or the consumer was gone before acking
began); otherwise commit. The sink drops rows whose ``(origin_stream, origin_seq)`` it
already has, so committing a message that comes back is a no-op, while rolling back after an
ack that took effect would lose it.

Writers of the same inputs (live members, backfills, replays) are ordered by the sink: a write
of a transformation's output whose inputs another writer committed meanwhile is refused
(``InputsTaken``) before any ack, rolled back, and computed again without them (``recompute``).

Before any of it the origin is checked (``origin_guard.py``): each write records the origin's
last message it read (its mark), and a batch is marked acking only while the origin still holds
the table's highest mark; an origin that went back rolls the batch back (nothing was acked).

A live member run lands with a fence (its partitions, taken when it got the pin) and an
``ack`` step (a double ack per message, or one purge per partition); a backfill lands with no
fence and no ack (it never acknowledges anything: its messages are read again on a rerun).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.landing.contract import Summary
from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.pipeline.processing import ProcessedBatch, partition_ranges
from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard, OriginWentBack
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.lake.spark_staging import StagedFiles
from airflow_provider_cg.core.landing.sinks.routing import RoutedRows
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    CommitResult,
    Fence,
    FencedOut,
    InputsTaken,
    PreparedWrite,
    PreparedWriteLost,
    SinkError,
    SinkLockTimeout,
    TwoPhaseSink,
    WriteState,
)
from airflow_provider_cg.core.landing.stream_life import OriginMark

log = logging.getLogger("airflow_provider_cg.landing")

#: ``ack()`` of a batch: send its acks, return how many stay unconfirmed
AckStep = Callable[[], Awaitable[int]]
#: ``recompute()`` of a batch whose inputs another writer committed meanwhile: a new batch id and
#: the batch processed again (the pipeline drops the inputs committed by then)
RecomputeStep = Callable[[], tuple[BatchId, ProcessedBatch]]
#: how often in a row a batch is computed again without taking any input out (other writers
#: taking its inputs shrink it each time; this bounds a recompute that does not see them)
MAX_RECOMPUTES = 5


def _input_count(processed: ProcessedBatch) -> int:
    return sum(len(v) for v in (processed.input_keys or {}).values())


def recover_writes(sink: TwoPhaseSink, stream: str, group: str, member: str, summary: Summary,
                   partitions: tuple[int, ...] = (), partition_count: int | None = None) -> list:
    """Finish prepared writes that earlier runs left behind: ``member``'s, and (with
    ``partitions``, after fencing them) any member's that touch them, e.g. a dropped member's.

    Commit those whose acks may have been sent (``acking``); roll back the others: with no ack
    ever sent, none can have taken effect. ``abort_unless_acking`` is atomic against a zombie's
    ``mark_acking``: if its mark came first, the write is committed instead. Returns the
    writes committed here (their ``refs`` say which messages they covered)."""
    committed, aborted = [], []
    for prepared in sink.recover(stream, group, member, partitions, partition_count):
        if prepared.acking or sink.abort_unless_acking(prepared) is WriteState.PREPARED:
            try:
                res = sink.commit(prepared)
            except PreparedWriteLost:  # its own run rolled it back meanwhile (never acked)
                aborted.append(prepared.gid)
                continue
            committed.append(prepared)
            summary.rows_written += res.rows_written  # an earlier run read (and counted) its messages
            for name, r in getattr(res, "routes", {}).items():
                summary.route(name)["rows_written"] += r.rows_written
        else:
            aborted.append(prepared.gid)
    summary.recovered_committed += len(committed)
    summary.recovered_aborted += len(aborted)
    if committed or aborted:
        log.info("cg recovery member=%s committed=%d rolled_back=%d (committed %s; rolled back %s)", member,
                 len(committed), len(aborted), [w.gid for w in committed], aborted)
    return committed


def written_columns(rows: Any) -> list[list[str]] | None:
    """[name, Arrow type] of a batch's rows as prepared (an Arrow table, or the files Spark
    staged); None for a batch without rows."""
    if isinstance(rows, pa.Table):
        return [[f.name, str(f.type)] for f in rows.schema] if rows.num_rows else None
    if isinstance(rows, StagedFiles) and rows.columns:
        return [list(c) for c in rows.columns]
    return None


def _landed_inputs(inputs: pa.Table, input_keys: dict[str, np.ndarray] | None) -> pa.Table:
    """The inputs (rows as read) whose effect a transformed batch lands: those it records."""
    if input_keys is None or inputs.num_rows == 0:
        return inputs
    seqs = np.concatenate([np.asarray(q, np.int64) for q in input_keys.values()]) if input_keys else \
        np.zeros(0, np.int64)
    keep = np.isin(inputs.column("origin_seq").to_numpy(), seqs)
    return inputs if keep.all() else inputs.filter(pa.array(keep))


def _count_routes(s: Summary, rows: RoutedRows, inputs: pa.Table, result: CommitResult) -> None:
    """A routed batch in the summary: each route's counts and ranges, and the inputs landed in
    any table as the batch's own."""
    every: dict[str, np.ndarray] = {}
    per_route = getattr(result, "routes", {})
    for name, part in rows.parts.items():
        counts = s.route(name)
        if name in per_route:
            counts["rows_written"] += per_route[name].rows_written
            counts["duplicates_skipped"] += per_route[name].duplicates_skipped
        landed = _landed_inputs(inputs, part.landed)
        counts["messages_landed"] += landed.num_rows if part.landed else 0
        if not part.landed:
            continue
        for p, first, last, n in partition_ranges(landed):
            s.count_partition(p, first, last, n, into=counts["partitions"])
        for st, q in part.landed.items():
            every[st] = np.union1d(every.get(st, np.zeros(0, np.int64)), q)
    for p, first, last, n in partition_ranges(_landed_inputs(inputs, every)) if every else ():
        s.count_partition(p, first, last, n)


class TwoPhaseLander:
    """Lands batches of one writer into ``sink``, counting into ``summary``.

    ``fence`` is set once the writer holds its member's pin (``take_over``); every write it
    prepares carries it, so a newer pin holder's fence refuses its acking mark. ``taken_over``
    turns true when that happens (or when another run rolled back one of its writes): nothing
    of the batch was acked, and the writer must stop.

    ``holds_pin``, when set, is asked right before a batch's acks are sent: an instance that is
    not ours (orbit's, which our fences do not stop) may have been pinned meanwhile and been
    delivered the same messages, so a writer that lost the pin rolls the batch back instead of
    acknowledging and committing what the other may process too.

    ``origin``, when set, records each batch's origin mark and checks the origin before each
    acking mark (``origin_guard.py``)."""

    def __init__(self, sink: TwoPhaseSink, summary: Summary, stream: str, group: str, member: str) -> None:
        self.sink, self.summary = sink, summary
        self.stream, self.group, self.member = stream, group, member
        self.fence: Fence | None = None
        self.taken_over = False
        self.holds_pin: Callable[[], Awaitable[bool]] | None = None
        self.partition_count: int | None = None  # the group's max_members, for fences and recovery
        self.origin: OriginGuard | None = None

    async def take_over(self, owner: str, partitions: tuple[int, ...]) -> list:
        """As the new pin holder, before landing anything: fence the member's partitions, then
        finish what earlier holders left prepared there. Returns the writes recovery committed."""
        self.fence = Fence(owner, partitions, self.partition_count)
        await asyncio.to_thread(self.sink.fence, self.stream, self.group, self.fence)
        return await self.recover(partitions)

    async def recover(self, partitions: tuple[int, ...] = ()) -> list:
        return await asyncio.to_thread(recover_writes, self.sink, self.stream, self.group, self.member,
                                       self.summary, partitions, self.partition_count)

    def count_publishing(self) -> None:
        """The sink's table commits so far into the summary (``Summary.table_commits``)."""
        counts = self.sink.publish_counts()
        s = self.summary
        s.table_commits = counts.get("table_commits", 0)
        s.records_published = counts.get("records_published", 0)
        s.table_conflicts = counts.get("table_conflicts", 0)

    async def finish(self) -> None:
        """At the end of a run: wait until what it committed is published (a table's group
        commit), then count it."""
        await asyncio.to_thread(self.sink.flush)
        self.count_publishing()

    async def discard(self, processed: ProcessedBatch) -> None:
        await asyncio.to_thread(self.sink.discard, processed.rows)

    async def land(self, batch_id: BatchId, processed: ProcessedBatch, inputs: pa.Table,
                   refs: dict[str, np.ndarray],
                   ack: AckStep | None, n_msgs: int, n_bytes: int, abort: bool = False,
                   recompute: RecomputeStep | None = None) -> bool:
        """prepare -> mark acking -> ``ack()`` -> commit; returns whether the batch committed.

        ``inputs``: the batch's rows as read (what the summary counts per partition); ``refs``:
        per consumed stream, the sequences a recovery needs. ``abort``: the consumer is gone
        before any ack was sent, so none can take effect: roll the write back and leave the
        messages for the re-created consumer. ``recompute``: how to compute the batch again
        when the sink refuses it because another writer committed some of its inputs."""
        stalled = 0  # recomputes in a row that took no input out
        mark, checked = None, None
        if self.origin is not None and not abort:
            # the table's mark checked while this batch's own mark is read: one round trip
            checked = asyncio.create_task(self.origin.check())
            try:
                mark = await self.origin.mark_of(inputs)
            except OriginWentBack:
                checked.cancel()
                await asyncio.to_thread(self.sink.discard, processed.rows)
                raise
        while True:
            prepared = None
            try:
                prepared = await self._prepare(batch_id, processed, refs, mark)
                failpoint("after_prepare")
                if abort:
                    await asyncio.to_thread(self.sink.abort, prepared)
                    return False
                await self._check_origin(prepared, checked)
                checked = None  # (a batch computed again is checked again)
                prepared = await asyncio.to_thread(self.sink.mark_acking, prepared)
                break
            except InputsTaken as e:
                taken = e
            except (FencedOut, PreparedWriteLost) as e:
                return await self._stop(batch_id, prepared, e)
            # another writer (a backfill, a replay) committed some inputs since the batch was
            # computed: nothing was acked; roll back and compute it again without them
            if prepared is not None:
                await asyncio.to_thread(self.sink.abort, prepared)
            else:
                await asyncio.to_thread(self.sink.discard, processed.rows)
            if recompute is None or stalled == MAX_RECOMPUTES:
                raise SinkError(f"batch {batch_id.gid}: {taken}; other writers keep taking its inputs")
            log.info("cg batch %s: %s; computing it again without them", batch_id.gid, taken)
            self.summary.recomputed += 1
            before = _input_count(processed)
            batch_id, processed = await asyncio.to_thread(recompute)
            # Each recompute drops the inputs taken meanwhile, so a batch shrinks until it holds
            # only inputs no other writer has (at worst none: it lands nothing, acks its messages
            # and the run goes on); the bound is on recomputes that take nothing out
            stalled = 0 if _input_count(processed) < before else stalled + 1
        return await self._ack_and_commit(batch_id, prepared, processed, inputs, ack, n_msgs, n_bytes)

    async def _check_origin(self, prepared: PreparedWrite, checked: asyncio.Task | None) -> None:
        """Before the acking mark: the origin still holds what the table landed (``checked``:
        the check started with the batch, done again if the connection was made again since),
        else the write is rolled back (no ack was sent) and ``OriginWentBack`` raised."""
        if self.origin is None:
            return
        try:
            await self.origin.confirm(checked)
        except OriginWentBack:
            await asyncio.to_thread(self.sink.abort, prepared)
            raise

    async def _stop(self, batch_id: BatchId, prepared: PreparedWrite | None, e: Exception) -> bool:
        """Another instance took the member over: nothing of the batch was acked; stop."""
        if prepared is None:
            # Stalled mid-prepare; the new pin holder's recovery removed the staging. No ack
            # was sent: the messages go to the new pin holder.
            log.warning("cg batch %s was removed by another instance while preparing; stopping", batch_id.gid)
            self.taken_over = True
            return False
        # A newer pin holder fenced our partitions, or this run stalled (suspended past the
        # ack wait) and the new holder's recovery rolled this write back. No ack was sent:
        # the messages are the new holder's. Stop, and roll back what may still hold row
        # locks in the sink (a write half-prepared when that recovery ran).
        if isinstance(e, FencedOut):
            log.warning("cg batch %s: fenced out by a newer instance of the member; stopping", batch_id.gid)
        else:
            log.warning("cg batch %s was rolled back by another instance; stopping", batch_id.gid)
        self.taken_over = True
        await asyncio.to_thread(self.sink.abort, prepared)
        return False

    async def _ack_and_commit(self, batch_id: BatchId, prepared: PreparedWrite, processed: ProcessedBatch,
                              inputs: pa.Table,
                              ack: AckStep | None, n_msgs: int, n_bytes: int) -> bool:
        s = self.summary
        if ack is not None:
            if self.holds_pin is not None and not await self.holds_pin():
                log.warning("cg batch %s: the member's pin moved to another instance before the ack; rolling "
                            "back (no ack was sent, the messages stay for the pin holder)", batch_id.gid)
                self.taken_over = True
                await asyncio.to_thread(self.sink.abort, prepared)
                return False
            s.unconfirmed_acks += await ack()
        failpoint("before_commit")
        result = await asyncio.to_thread(self.sink.commit, prepared)
        self.count_publishing()
        s.batches += 1
        s.batch_ids.append(batch_id.gid)
        s.rows_written += result.rows_written
        s.duplicates_skipped += processed.skipped + result.duplicates_skipped
        s.messages_read += n_msgs
        s.bytes += n_bytes
        # per partition what this batch landed (an asset event's ranges: a run that read inputs
        # again after a recovery does not announce them twice); rows are deduplicated by the sink
        if isinstance(processed.rows, RoutedRows):  # per route, what its table recorded
            _count_routes(s, processed.rows, inputs, result)
            for name, part in processed.rows.parts.items():
                s.route(name)["columns"] = written_columns(part.rows) or s.route(name).get("columns")
                if (where := self.sink.route_location(name)) is not None:
                    s.route(name)["table_location"] = where
            return True
        s.columns = written_columns(processed.rows) or s.columns
        s.table_location = self.sink.table_location
        for p, first, last, n in partition_ranges(_landed_inputs(inputs, processed.input_keys)):
            s.count_partition(p, first, last, n)
        return True

    async def _prepare(self, batch_id: BatchId, processed: ProcessedBatch,
                       refs: dict[str, Any], mark: OriginMark | None = None) -> PreparedWrite:
        """``sink.prepare`` under the fence. A lock timeout means rows are held by another
        prepared write; if a run we fenced out prepared it after our recovery, it can never be
        acked: finish such writes (recovery rolls them back) and try again."""
        extra = {} if processed.input_keys is None else {"input_keys": processed.input_keys}
        for attempt in range(3):
            try:
                return await asyncio.to_thread(self.sink.prepare, batch_id, processed.rows, message_refs=refs,
                                               fence=self.fence, origin_mark=mark, **extra)
            except SinkLockTimeout:
                if attempt == 2 or self.fence is None:
                    raise
                log.warning("cg batch %s waited on rows locked by another prepared write; finishing writes of "
                            "fenced-out instances and retrying", batch_id.gid)
                await self.recover(self.fence.partitions)
        raise AssertionError("unreachable: the last attempt raises")
