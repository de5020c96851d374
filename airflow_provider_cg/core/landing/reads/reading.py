"""What a reader of one member run is given (``MemberReading``): the run's parts a read path
needs, explicit and narrow. A reader (``reads/direct.py``, ``reads/executors.py``, ``reads/consumer.py``)
changes none of the run's state: it counts what it takes in the stop rule, keeps the pin
through ``pin``, and lands through the lander."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pyarrow as pa

from airflow_provider_cg.core.groups.config import GroupConfig
from airflow_provider_cg.core.groups.layouts import Layout
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.landing.contract import BatchOptions, Summary
from airflow_provider_cg.core.landing.pipeline.processing import Pipeline, ProcessedBatch
from airflow_provider_cg.core.landing.protocol.dead_letters import DeadLetters
from airflow_provider_cg.core.landing.protocol.two_phase import RecomputeStep, TwoPhaseLander
from airflow_provider_cg.core.landing.reads.pin import Pin
from airflow_provider_cg.core.landing.reads.stop_rule import StopRule
from airflow_provider_cg.core.landing.rows import BatchId, KeySelector
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink
from airflow_provider_cg.core.landing.stream_life import OriginKeys

log = logging.getLogger("airflow_provider_cg.landing")


class Progress:
    """The job's progress line, at most every ``interval`` seconds; ``also`` is called with it
    (the run's progress board, ``board.py``). ``rate`` is the messages read since the line
    before, per second (what the run does now), ``run_rate`` over the whole run; ``waiting``
    names what the run waits on while it reads nothing (the pin, the take-over, the table);
    ``lag`` the member's backlog as the server counted it last (the board reads it), shown as
    ``lag=`` when known; ``busy`` what the run waits on when the reader names nothing (Spark's
    warm-up, which a follower's first batch waits for)."""

    def __init__(self, summary: Summary, interval: float, also: Callable[[], None] | None = None,
                 lag: Callable[[], int | None] | None = None, busy: Callable[[], str | None] | None = None) -> None:
        self.summary, self.interval, self.also, self.lag, self.busy = summary, interval, also, lag, busy
        self.start = self.last = time.monotonic()
        self.read_at_last = 0
        self.waiting: str | None = None

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        s = self.summary
        rate = (s.messages_read - self.read_at_last) / max(now - self.last, 1e-9)
        run_rate = s.messages_read / max(now - self.start, 1e-9)
        self.last, self.read_at_last = now, s.messages_read
        left = max(s.target - s.messages_read, 0)
        tables = (f" table_commits={s.table_commits} table_conflicts={s.table_conflicts}"
                  if s.table_commits or s.table_conflicts else "")
        what = self.waiting or (self.busy() if self.busy is not None else None)
        waiting = f" waiting={what}" if what else ""
        lag = self.lag() if self.lag is not None else None
        lag_now = f" lag={lag}" if lag is not None else ""
        log.info("cg progress member=%s messages_read=%d rows_written=%d rate=%.0f msg/s run_rate=%.0f msg/s "
                 "backlog_left=%d%s%s%s", s.member, s.messages_read, s.rows_written, rate, run_rate, left, lag_now,
                 tables, waiting)
        if self.also is not None and not force:
            self.also()

    async def keep_talking(self) -> None:
        """A line every ``interval`` from the run's start to its end, whatever it waits on
        (the readers tick too, between their steps; the line is never more frequent)."""
        while True:
            await asyncio.sleep(max(0.2, self.interval / 4))
            self.tick()


class BatchIds:
    """The ids of a run's batches (``BatchId``): one sequence for the whole run, starting at
    the run's start time in milliseconds, so a later run's batches sort after an earlier's."""

    def __init__(self, stream: str, group: str, member: str) -> None:
        self.stream, self.group, self.member = stream, group, member
        self.seq = int(time.time() * 1000)

    def next(self) -> BatchId:
        self.seq += 1
        return BatchId(self.stream, self.group, self.member, self.seq)


@dataclass(frozen=True)
class Assignment:
    """The member's partitions as one ``MemberRun.setup`` found them (a membership change makes
    the next one): its member consumer, and how its messages are keyed and acknowledged."""

    config: GroupConfig
    layout: Layout  # as found (the run's current one may change: ``ensure_partition_streams_current``)
    consumer_stream: str  # the member consumer's stream: the group's work queue (elastic), or the origin
    consumer: str
    priority_group: str
    ack_wait: float
    elastic: bool  # the consumer's stream is the group's work queue (sourced from the origin), not the origin
    partition_streams: bool  # the partitions are streams of their own (``layouts/partition_streams.py``)
    partitions: tuple[int, ...]
    filters: tuple[str, ...]  # the member consumer's filter subjects
    key_rules: list
    keys: KeySelector


@dataclass
class MemberReading:
    """One assignment of a member run, as its reader sees it (see the module docstring)."""

    options: BatchOptions
    member: str
    summary: Summary
    progress: Progress
    pin: Pin
    stop: StopRule
    lander: TwoPhaseLander
    sink: TwoPhaseSink
    pipeline: Pipeline
    dlq: DeadLetters
    api: JsApi
    assignment: Assignment
    origin: OriginKeys  # where the origin's messages land, by sequence (``stream_life.py``)
    batch_size: int
    batch_ids: BatchIds
    #: the member consumer's info as the run found it (a consumer reader keeps to its limits)
    consumer_info: dict
    #: the member's partition streams answer, or the run ends with exit 2 naming one
    ensure_current: Callable[[], Awaitable[None]]
    #: a partition stream that lost messages made again from its log (``layouts/partition_streams.py``)
    rebuild_partition: Callable[[int], Awaitable[None]]

    def next_batch_id(self) -> BatchId:
        return self.batch_ids.next()

    def rows_of(self, table: pa.Table) -> pa.Table:
        """Rows as read, under the keys of the origin's lives (``stream_life.py``)."""
        return self.origin.apply(table)

    def recompute_step(self, table: pa.Table) -> RecomputeStep:
        """The lander's ``recompute`` of a batch read as ``table``: processed again under a new
        batch id (the pipeline drops the inputs another writer committed meanwhile)."""
        def recompute() -> tuple[BatchId, ProcessedBatch]:
            batch_id = self.next_batch_id()
            return batch_id, self.pipeline.process(self.sink, table, batch_id)
        return recompute
