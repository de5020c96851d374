"""What happens to a batch between its reading from NATS and the sink's prepare.

``ArrowPipeline``: a job without Spark work (raw payloads, or text decoded by the driver):
the rows as read, minus poison rows.

``SparkPipeline``: the batch becomes one Spark DataFrame, once; decoding, the user's
transformation and the computing of the sink's prepared data run in Spark tasks, in one
Spark job per batch (``TwoPhaseSink.stage``: the Parquet sink's files are written by the
tasks; PostgreSQL's prepared transaction needs the rows in the driver). The reasons of
poison rows come back with that same job (an observed metric), so a good batch is decoded
once. Exactly-once is kept per *input* message: inputs already committed are dropped before
the DataFrame is built, and the sink records the keys of the batch's good inputs with its
output. The driver keeps the NATS work, the protocol and the commit. No Airflow import.

Records the sink refuses are taken out of the batch on every path (``bad_records.py``): in
Spark they are found in the same job that stages the batch; the rare batch that has some is
discarded and computed again with their messages marked poison, so no other row of theirs
lands either. Inputs a table holds already are dropped first (``held_inputs.py``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.landing.pipeline.bad_records import (
    MAX_REFUSAL_ROUNDS,
    InputNumbers,
    marked_poison,
    observe_refusals,
    origins,
    refuse,
    refused_inputs,
    refusing,
)
from airflow_provider_cg.core.landing.pipeline.decode import ERROR, SparkDecoder
from airflow_provider_cg.core.landing.pipeline.held_inputs import TableInputs, excluding, nothing_staged
from airflow_provider_cg.core.landing.rows import BatchId, row_table
from airflow_provider_cg.core.landing.sinks.routing import RoutedRows, RoutedSink, RoutePart
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    SinkError,
    TwoPhaseSink,
    keys_by_stream,
)
from airflow_provider_cg.core.landing.stream_life import OriginKeys
from airflow_provider_cg.core.landing.transform import BATCH_VIEW, BatchContext, TransformError, load_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

log = logging.getLogger("airflow_provider_cg.pipeline")

ROW = "_cg_row"  # a row's index in the batch as read, carried through Spark for poison reasons
#: how long after the batch's Spark job its poison metric may take to arrive; a transformation
#: whose result does not read the batch never delivers it
OBSERVATION_TIMEOUT = 60.0
_CONSTANT_CANDIDATES = ("origin_stream", "group", "member", "payload_text")  # string columns


@dataclass
class ProcessedBatch:
    """A batch ready for the sink's prepare."""

    rows: Any  # an Arrow table, or what the sink's ``stage`` made of a DataFrame
    bad: dict[int, str]  # poison rows: index in the batch as read -> why
    input_keys: dict[str, np.ndarray] | None = None  # the inputs ``rows`` stand for (Spark)
    skipped: int = 0  # inputs committed already, dropped before processing


#: an input's partition (0 to 65,535: ``config.MAX_PARTITIONS``) in the low bits of the number
#: the tasks report for it, its origin sequence in the others (up to 2**47)
_PARTITION_BITS = 16
_POISON_FIELDS = ("origin_stream", "origin_seq", "subject", "payload", "headers", ERROR)
_POISON_SCHEMA = pa.schema([("origin_stream", pa.string()), ("origin_seq", pa.int64()), ("subject", pa.string()),
                            ("payload", pa.binary()), ("headers", pa.string()), (ERROR, pa.string())])


@dataclass
class RangesRead:
    """What a batch's Spark tasks read (``SparkPipeline.process_ranges``), as its job reports it."""

    inputs: pa.Table  # partition, origin_seq of each message read (inputs committed already excepted)
    poison: pa.Table  # the raw messages of the poison rows (``_POISON_SCHEMA``), for the dead-letter stream
    messages: int  # read, inputs committed already excepted (``ProcessedBatch.skipped`` counts those)
    bytes: int


class Pipeline(Protocol):
    """What a run asks of a batch's processing between read and prepare: ``ArrowPipeline``
    (the rows as read) or ``SparkPipeline`` (decoded and transformed in Spark)."""

    #: set once ``warm_up`` has run (a follower's successor waits warm before it says it is ready)
    warm: threading.Event

    def start_warm_up(self) -> None: ...

    def process(self, sink: TwoPhaseSink, table: pa.Table, batch_id: BatchId) -> ProcessedBatch: ...


class ArrowPipeline:
    """The rows as read (``decode``: the driver-side text decoder, or none), minus poison rows
    and the rows the sink refuses."""

    def __init__(self, decode: Callable[[pa.Table], tuple[pa.Table, dict[int, str]]] | None = None, *,
                 bad_records: str = "dead-letter") -> None:
        self.decode, self.bad_records = decode, bad_records
        self.warm = threading.Event()

    def start_warm_up(self) -> None:
        """``warm_up`` in the background, while the job waits for its pin and its messages."""
        threading.Thread(target=self.warm_up, daemon=True, name="cg-warm-up").start()

    def warm_up(self) -> None:
        """Pay this process's one-time costs of a batch before a follower's first messages: one
        made-up direct-get answer made into rows, decoded and written as Parquet into memory.
        Most of it is pyarrow importing pandas on its first conversion (about 0.25 s of CPU
        here), which the first batch of each follower otherwise waits for. Nothing is landed;
        the user's code never sees the row; a failure only loses the head start."""
        from airflow_provider_cg.core.jetstream.direct_gets import PartitionBatch
        from airflow_provider_cg.core.landing.rows import KeySelector, rows_from_batches

        started = time.monotonic()
        try:
            block = (b"NATS/1.0\r\nNats-Stream-Source: cg-warm-up 1\r\nNats-Stream: cg-warm-up\r\n"
                     b"Nats-Subject: 0.warm-up\r\nNats-Sequence: 1\r\n"
                     b"Nats-Time-Stamp: 2026-01-01T00:00:00Z\r\n\r\n")
            table, _ = rows_from_batches([PartitionBatch(0, [block], [b"{}"], 1)], group="cg-warm-up",
                                         member="cg-warm-up", keys=KeySelector([]))
            if self.decode is not None:
                table, _ = self.decode(table)
            pq.write_table(table, pa.BufferOutputStream())
        except Exception as e:  # noqa: BLE001 - only a head start; the first batch reports real failures
            log.debug("cg warm-up did not finish: %s", e)
            return
        finally:
            self.warm.set()
        log.debug("cg warmed up in %.2f s", time.monotonic() - started)

    def process(self, sink: TwoPhaseSink, table: pa.Table, batch_id: BatchId) -> ProcessedBatch:
        bad: dict[int, str] = {}
        if self.decode is not None and table.num_rows:
            table, bad = self.decode(table)
        refused = {i: why for i, why in sink.refusals(table).items() if i not in bad}
        if refused:
            rows = sorted(refused)
            refuse(self.bad_records, dict(zip(origins(table, rows), (refused[i] for i in rows), strict=True)))
            bad.update(refused)
        if bad:
            keep = np.ones(table.num_rows, dtype=bool)
            keep[list(bad)] = False
            table = table.filter(pa.array(keep))
        if isinstance(sink, RoutedSink):  # each route's rows, recorded as landed by its table
            return ProcessedBatch(sink.split_rows(table), bad)
        return ProcessedBatch(table, bad)


class SparkPipeline:
    """Decode and transform a batch in Spark; see the module docstring.

    ``function`` (``package.module:function``) is called with the batch's good rows as a
    DataFrame and a :class:`BatchContext`; ``sql`` runs over the temporary view ``batch``.
    Neither: the decoded rows land as they are."""

    def __init__(self, session: Callable[[], Any], decoder: SparkDecoder, *, function: str | None = None,
                 sql: str | None = None, bad_records: str = "dead-letter") -> None:
        """``session`` returns the job's SparkSession; it is called on the first batch (a run that
        finds nothing to land never starts Spark's context: about 2.5 s here)."""
        if function and sql:
            raise ConfigError("transform", "give either a function (package.module:function) or a SQL statement")
        if sql is not None and not sql.strip():
            raise ConfigError("transform_sql", "must not be empty")
        self._session = session
        self._spark: SparkSession | None = None
        self.decoder = decoder
        self.fn = load_function(function) if function else None
        self.sql = sql
        self.bad_records = bad_records
        self._one_at_a_time = threading.Lock()  # the view ``batch`` is the session's: one batch at a time
        self._batch_came = False  # a batch came: a warm-up still waiting runs no job of its own
        self.warm = threading.Event()

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            spark = self._session()
            # the batch goes to the executors as partitions of the job's data, not as a local
            # relation that the driver's optimizer would decode row by row
            spark.conf.set("spark.sql.execution.arrow.localRelationThreshold", "0")
            # readable by pyarrow, pandas and PostgreSQL tools like the driver-written files
            spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            self._spark = spark
        return self._spark

    @property
    def parallelism(self) -> int:
        """Tasks a batch read by executors is split in."""
        return self.spark.sparkContext.defaultParallelism

    def process(self, sink: TwoPhaseSink, table: pa.Table, batch_id: BatchId) -> ProcessedBatch:
        self._batch_came = True
        with self._one_at_a_time:
            _ = self.spark  # started before any column is built (PySpark's functions need its context)
            return self._process(sink, table, batch_id)

    def _process(self, sink: TwoPhaseSink, table: pa.Table, batch_id: BatchId) -> ProcessedBatch:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        held = TableInputs.of(sink, table)
        drop = held.everywhere
        skipped = int(drop.sum())
        rows = np.flatnonzero(~drop)
        fresh = table.filter(pa.array(~drop)) if skipped else table
        if fresh.num_rows == 0:
            return ProcessedBatch(nothing_staged(sink, fresh), {}, {}, skipped)
        extra = held.extra_keys(table)
        at = InputNumbers(fresh, rows)
        refused: dict[int, str] = {}  # inputs whose rows the sink refused: poison (their index as read)
        for _ in range(MAX_REFUSAL_ROUNDS):
            decoded = marked_poison(self.decoder.apply(self._frame(fresh, rows)), F.col(ROW), refused)
            observation = None
            if self.decoder.can_fail or refused:
                observation = Observation(f"cg_poison_{batch_id.uid}_{batch_id.batch_seq}_{secrets.token_hex(2)}")
                decoded = decoded.observe(observation, F.collect_list(
                    F.when(F.col(ERROR).isNotNull(), F.struct(F.col(ROW), F.col(ERROR)))).alias("bad"))
                decoded = decoded.where(F.col(ERROR).isNull())
            good = decoded.drop(ERROR, ROW)
            ranges = {p: (first, last) for p, first, last, _ in partition_ranges(fresh)}
            ctx = BatchContext(batch_id.stream, batch_id.group, batch_id.member, batch_id.gid, tuple(sorted(ranges)),
                               ranges)
            staged, observations = self._outputs(sink, batch_id, good, ctx, extra)
            metrics = self._collect(sink, staged, observation, *observations)
            found = refused_inputs(metrics, at, refused)
            if not found:
                break
            sink.discard(staged)
            for origin, why in refuse(self.bad_records, found).items():
                refused[at[origin]] = why
            log.info("cg batch %s: the sink refuses %d of its records (%s); computing it without their messages",
                     batch_id.gid, len(found), next(iter(found.values())))
        else:
            raise ConsumerGroupError(f"batch {batch_id.gid}: its sink keeps refusing records after "
                                     f"{MAX_REFUSAL_ROUNDS} rounds")
        bad = {int(r[0]): str(r[1]) for r in metrics.get("bad") or ()}
        keep = np.ones(fresh.num_rows, dtype=bool)
        if bad:
            keep[np.searchsorted(rows, np.fromiter(bad, np.int64, len(bad)))] = False
        good_inputs = fresh.filter(pa.array(keep)) if bad else fresh
        if isinstance(staged, RoutedRows) and isinstance(sink, RoutedSink):
            self._record_inputs(sink, staged, good_inputs, extra)
            return ProcessedBatch(staged, bad, None, skipped)
        keys: dict[str, np.ndarray] | None = {s: np.asarray(q, dtype=np.int64)
                                               for s, q in keys_by_stream(good_inputs).items()}
        if not self._transforms(staged):
            keys = None  # decoded rows in the driver are one per message: the sink dedupes them as rows
        return ProcessedBatch(staged, bad, keys, skipped)

    def _transforms(self, staged: object) -> bool:
        """Whether a staged result stands for its inputs (a transformation's output, or files
        Spark wrote) rather than being one row per message the sink dedupes as rows."""
        return not (self.fn is None and self.sql is None and isinstance(staged, pa.Table))

    def _record_inputs(self, sink: RoutedSink, staged: RoutedRows, good_inputs: pa.Table,
                       extra: dict[str, dict[str, np.ndarray]]) -> None:
        """What each route's table records as landed: routed by a column, every good input of
        the batch it does not hold; routed by subject, those of its subjects."""
        routes = sink.routes
        takes = routes.split(good_inputs) if routes.route_by is None else None
        for name, part in staged.parts.items():
            inputs = good_inputs if takes is None else good_inputs.filter(pa.array(takes[name]))
            keys = {st: np.sort(np.asarray(q, dtype=np.int64)) for st, q in keys_by_stream(inputs).items()}
            for st, q in (extra.get(name) or {}).items():
                if st in keys:
                    keys[st] = np.setdiff1d(keys[st], q)
            keys = {st: q for st, q in keys.items() if len(q)}
            if self._transforms(part.rows):
                part.input_keys, part.landed = keys, keys
            else:
                part.input_keys = None
                part.landed = {st: np.sort(q) for st, q in keys_by_stream(part.rows).items()}

    def start_warm_up(self) -> None:
        """``warm_up`` in the background, while the job waits for its pin and its first
        messages; the first batch waits for it (one Spark job at a time)."""
        threading.Thread(target=self.warm_up, daemon=True, name="cg-warm-up").start()

    def warm_up(self) -> None:
        """Start the session and run, on made-up rows, the Spark job a batch runs, so that a
        follower's first batch does not pay for its first time: the JVM loading and compiling
        the classes of the batch's plan (decoding, the poison rows' observation, a SQL
        transformation), and the Python workers that write a batch's files starting and
        importing pyarrow's writer (here about 10 s of session and first job when quiet, 15-20 s
        beside a publisher and the server; the Python workers alone cost the first batch 5 s).
        The rows are decoded as a batch is; a SQL transformation (a query: it has no effect)
        runs over them, a function never sees them; the output is written into the workers'
        memory, nothing on disk. A batch that comes first (a backlog) does that job itself:
        the warm-up then only starts the session."""
        with self._one_at_a_time:
            try:
                _ = self.spark  # before any column is built, as in process() (its start is logged there)
                started = time.monotonic()
                if self._batch_came:
                    log.info("cg Spark warm-up skipped (a batch came first)")
                    return
                self._warm_up_job()
            except Exception as e:  # noqa: BLE001 - only a head start; the first batch reports real failures
                log.info("cg Spark warm-up did not finish (%s); the first batch starts Spark", type(e).__name__)
                log.debug("cg Spark warm-up", exc_info=True)
                return
            finally:
                self.warm.set()
        log.info("cg Spark warmed up in %.1f s", time.monotonic() - started)

    def _warm_up_job(self) -> None:
        """A batch's Spark job on one made-up row per task slot (a Python worker each), then a
        SQL transformation's over them. The observation is not waited for (a transformation
        that does not read the batch never delivers it)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from airflow_provider_cg.core.landing.sinks.lake.parquet_files import warm_up_task

        n = max(1, self.parallelism)
        sample = row_table(n, origin_stream=["cg-warm-up"] * n, origin_seq=list(range(n)),
                           subject=["0.warm-up"] * n, partition=[0] * n, key=[None] * n, payload=[b"{}"] * n,
                           timestamp=[0] * n, group="cg-warm-up", member="cg-warm-up")
        frame = self.decoder.apply(self._frame(sample, np.arange(n, dtype=np.int64)))
        observation = Observation(f"cg_warm_up_{secrets.token_hex(4)}")
        frame = frame.observe(observation, F.collect_list(
            F.when(F.col(ERROR).isNotNull(), F.struct(F.col(ROW), F.col(ERROR)))).alias("bad"))
        # every row, poison or not: each task slot's Python worker gets one
        frame.drop(ROW).repartition(n).mapInArrow(warm_up_task, "file string, rows long").collect()
        if self.sql is not None and _is_query(self.sql):
            frame.where(F.col(ERROR).isNull()).drop(ERROR, ROW).createOrReplaceTempView(BATCH_VIEW)
            self.spark.sql(self.sql).mapInArrow(warm_up_task, "file string, rows long").collect()

    def read_in_tasks(self, settings: NatsConnectionSettings) -> None:
        """Let this job's batches be read by its Spark tasks, connecting with ``settings``."""
        from airflow_provider_cg.core.landing.pipeline.nats_source import register, warm_up_plan

        register(self.spark, settings)
        # the first job through the source starts Python workers on the executors (about 5 s on
        # a small machine): start them now, while the driver waits for the pin and takes over
        threading.Thread(target=self._warm_up, args=(warm_up_plan(self.parallelism),), daemon=True,
                         name="cg-warm-up").start()

    def _warm_up(self, plan: str) -> None:
        from airflow_provider_cg.core.landing.pipeline.nats_source import SOURCE_NAME

        with self._one_at_a_time:
            try:
                frame = self.spark.read.format(SOURCE_NAME).option("plan", plan).load()
                self.decoder.apply(frame).write.format("noop").mode("overwrite").save()
            except Exception as e:  # noqa: BLE001 - only a head start; the first batch reports real failures
                log.debug("warm-up of the tasks' Python workers failed: %s", e)

    def process_ranges(self, sink: TwoPhaseSink, plan: Callable[[np.ndarray | None], str], origin: OriginKeys,
                       batch_id: BatchId, partitions: tuple[int, ...]) -> tuple[ProcessedBatch, RangesRead]:
        """A batch that Spark's tasks read themselves (``nats_source.py``): ``plan(skip)`` is
        the source's plan minus the inputs in ``skip``. The inputs read come back with the
        batch's Spark job (an observed metric), and are checked against the sink's committed
        ones only then; in the rare batch that holds some (a batch committed whose ack did not
        take effect), or records the sink refuses, the staged result is dropped and the batch
        computed again without them (the refused ones marked poison; with routes, inputs one
        table holds are left out of that table's share only). ``origin``: the keys the inputs
        land under, by sequence (``stream_life.py``)."""
        self._batch_came = True
        with self._one_at_a_time:
            skip = np.zeros(0, np.int64)
            extra: dict[str, dict[str, np.ndarray]] = {}  # per route, inputs only its table holds
            refused: dict[int, str] = {}  # origin_seq -> why: poison rows of the next computation
            retries = 0
            while True:
                staged, read, found, routed_inputs = self._read_ranges(
                    sink, plan(skip if len(skip) else None), batch_id, partitions, origin, refused, extra)
                if found:
                    sink.discard(staged)
                    if retries >= MAX_REFUSAL_ROUNDS:
                        raise ConsumerGroupError(f"batch {batch_id.gid}: its sink keeps refusing records")
                    for (_, seq), why in refuse(self.bad_records, found).items():
                        refused[seq] = why
                    retries += 1
                    continue
                seqs = read.inputs.column("origin_seq").to_numpy()
                held = TableInputs.of_seqs(sink, origin, seqs)
                everywhere = held.everywhere
                more = held.extra_keys_of(origin, seqs, extra)
                if not everywhere.any() and not more:
                    break
                sink.discard(staged)
                if retries >= 3:
                    raise ConsumerGroupError(f"batch {batch_id.gid}: inputs keep turning up committed while it is "
                                             "computed (another writer of the same messages?)")
                retries += 1
                skip = np.union1d(skip, seqs[everywhere])
                for name, committed in more.items():
                    theirs = extra.setdefault(name, {})
                    for st, q in committed.items():
                        theirs[st] = np.union1d(theirs.get(st, np.zeros(0, np.int64)), q)
                log.info("cg batch %s: %d of its inputs are committed already; computing it without them",
                         batch_id.gid, int(everywhere.sum()) + sum(len(q) for k in more.values() for q in k.values()))
            bad = {i: str(e) for i, e in enumerate(read.poison.column(ERROR).to_pylist())}
            poisoned = read.poison.column("origin_seq").to_numpy()
            good = np.setdiff1d(seqs, poisoned) if bad else np.sort(seqs)
            if isinstance(staged, RoutedRows):
                for name, part in staged.parts.items():
                    mine = good if routed_inputs is None else np.setdiff1d(routed_inputs[name], poisoned)
                    theirs = extra.get(name) or {}
                    kept = {k: np.setdiff1d(q, theirs.get(k, np.zeros(0, np.int64)))
                            for k, q in origin.split(mine).items()}
                    keys = {k: q for k, q in kept.items() if len(q)}
                    part.input_keys = keys if self._transforms(part.rows) else None
                    part.landed = keys if self._transforms(part.rows) else \
                        {st: np.sort(q) for st, q in keys_by_stream(part.rows).items()}
                return ProcessedBatch(staged, bad, None, len(skip)), read
            landed = {k: q for k, q in origin.split(good).items() if len(q)} if self._transforms(staged) else None
            return ProcessedBatch(staged, bad, landed, len(skip)), read

    def _read_ranges(self, sink: TwoPhaseSink, plan: str, batch_id: BatchId, partitions: tuple[int, ...],
                     origin: OriginKeys, refused: dict[int, str], extra: dict[str, dict[str, np.ndarray]]
                     ) -> tuple[Any, RangesRead, dict[tuple[str, int], str], dict[str, np.ndarray] | None]:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from airflow_provider_cg.core.landing.pipeline.nats_source import SOURCE_NAME

        frame = self.spark.read.format(SOURCE_NAME).option("plan", plan).load()
        decoded = marked_poison(self.decoder.apply(frame), F.col("origin_seq"), refused)
        observation = Observation(f"cg_read_{batch_id.uid}_{batch_id.batch_seq}_{secrets.token_hex(2)}")
        routes = sink.routes if isinstance(sink, RoutedSink) else None
        per_route = []
        if routes is not None and routes.route_by is None:  # routed by subject: each route's inputs
            per_route = [F.to_json(F.collect_list(F.when(routes.takes(r.name), F.col("origin_seq")))).alias(f"in_{i}")
                         for i, r in enumerate(routes.routes)]
        decoded = decoded.observe(
            observation,
            # one number per input (its sequence and partition), the cheapest list to gather
            F.to_json(F.collect_list(F.shiftleft(F.col("origin_seq"), _PARTITION_BITS)
                                     + F.coalesce(F.col("partition"), F.lit(0))))
             .alias("inputs"),
            F.coalesce(F.sum(F.length("payload")), F.lit(0)).alias("bytes"),
            F.collect_list(F.when(F.col(ERROR).isNotNull(), F.struct(*_POISON_FIELDS))).alias("bad"),
            *per_route)
        good = decoded.where(F.col(ERROR).isNull()).drop(ERROR)
        ctx = BatchContext(batch_id.stream, batch_id.group, batch_id.member, batch_id.gid, partitions)
        staged, observations = self._outputs(sink, batch_id, good, ctx, extra)
        metrics = self._collect(sink, staged, observation, *observations)
        packed = np.asarray(json.loads(metrics["inputs"] or "[]"), dtype=np.int64)
        inputs = pa.table({"partition": pa.array(packed & ((1 << _PARTITION_BITS) - 1), pa.int32()),
                           "origin_seq": pa.array(packed >> _PARTITION_BITS)})
        bad = [r.asDict() for r in metrics.get("bad") or ()]
        poison = pa.Table.from_pylist(bad, schema=_POISON_SCHEMA) if bad else _POISON_SCHEMA.empty_table()
        read = RangesRead(inputs, poison, len(packed), int(metrics["bytes"] or 0))
        found = {}
        if metrics.get("refused"):
            at = {(origin.key_of(int(q)), int(q)): int(q) for q in inputs.column("origin_seq").to_pylist()}
            found = refused_inputs(metrics, at, refused)
        routed_inputs = None
        if per_route and routes is not None:
            routed_inputs = {r.name: np.sort(np.asarray(json.loads(metrics[f"in_{i}"] or "[]"), dtype=np.int64))
                             for i, r in enumerate(routes.routes)}
        return staged, read, found, routed_inputs

    def _frame(self, fresh: pa.Table, rows: np.ndarray) -> DataFrame:
        """The batch as a DataFrame: columns equal on every row (the origin stream, group,
        member; an unused ``payload_text``) are not shipped to the JVM but added there."""
        from pyspark.sql import functions as F

        constant = {}
        for name in _CONSTANT_CANDIDATES:
            if name not in fresh.column_names:
                continue
            col = fresh.column(name)
            if col.null_count == fresh.num_rows:
                constant[name] = F.lit(None).cast("string")
            elif col.null_count == 0 and len(pc.unique(col)) == 1:
                constant[name] = F.lit(col[0].as_py())
        shipped = fresh.drop_columns(list(constant)).append_column(ROW, pa.array(rows, pa.int64()))
        frame = self.spark.createDataFrame(shipped)
        if not constant:
            return frame
        return frame.select(*[constant[n].alias(n) if n in constant else F.col(n) for n in fresh.column_names],
                            F.col(ROW))

    def _transform(self, good: DataFrame, ctx: BatchContext) -> DataFrame:
        from pyspark.sql import DataFrame

        fn, sql = self.fn, self.sql
        if fn is None and sql is None:
            return good
        try:
            if fn is not None:
                out = fn(good, ctx)
            elif sql is not None:
                good.createOrReplaceTempView(BATCH_VIEW)
                out = self.spark.sql(sql)
        except Exception as e:  # the user's code or SQL (analysis errors surface here)
            raise _spark_failure(e) from e
        if not isinstance(out, DataFrame):
            raise TransformError(f"transform: returned {type(out).__name__}, not a Spark DataFrame")
        return out

    def _outputs(self, sink: TwoPhaseSink, batch_id: BatchId, good: DataFrame, ctx: BatchContext,
                 extra: dict[str, dict[str, np.ndarray]]) -> tuple[Any, list]:
        """The batch's output staged in the sink -- one Spark job, or one per route of a routed
        sink -- and the observations of the rows the sink refuses. ``extra``: per route, the
        inputs its table holds that the others do not (left out of its share only)."""
        if not isinstance(sink, RoutedSink):
            out, refusals = refusing(sink, self._transform(good, ctx), batch_id)
            return self._stage(sink, batch_id, out), [refusals]
        routes, observations = sink.routes, []
        unrouted = sink.input_refusal_column(good.columns)  # routed by subject: a message no route takes
        if unrouted is not None:
            good, seen = observe_refusals(good, unrouted, batch_id)
            observations.append(seen)
        several = len(routes.routes) > 1
        if several and routes.route_by is None:
            good = good.persist()  # decoded (and read) once for the routes' transformations
        shared = None  # routed by a column: the transformation computed once for every route
        parts: dict[str, RoutePart] = {}
        try:
            for route in routes.routes:
                mine = extra.get(route.name)
                if routes.route_by is None:
                    source = good.where(routes.takes(route.name))
                    if mine:
                        source = excluding(source, mine)
                    base = self._transform(source, dataclasses.replace(ctx, route=route.name))
                elif mine or shared is None:
                    base = self._transform(excluding(good, mine) if mine else good, ctx)
                    why = sink.refusal_column(base.columns)  # a row whose column names no route
                    if why is not None:
                        base, seen = observe_refusals(base, why, batch_id)
                        observations.append(seen)
                    if not mine:
                        shared = base = base.persist() if several else base
                else:
                    base = shared
                out = base.where(routes.takes(route.name)) if routes.route_by is not None else base
                out, refusals = refusing(sink.sinks[route.name], out, batch_id)
                observations.append(refusals)
                staged = self._stage(sink.sinks[route.name], sink.part_batch(batch_id, route.name), out)
                parts[route.name] = RoutePart(staged, None, {})
        except BaseException:
            sink.discard(RoutedRows(parts))
            raise
        finally:
            for cached in (shared, good if several and routes.route_by is None else None):
                if cached is not None:
                    cached.unpersist()
        return RoutedRows(parts), observations

    def _stage(self, sink: TwoPhaseSink, batch_id: BatchId, out: DataFrame) -> Any:
        """Run one Spark job of the batch (``sink.stage``): its result, or the failure as the job
        reports it (the sink's storage, NATS, the user's transformation)."""
        from airflow_provider_cg.core.landing.pipeline.nats_source import READ_FAILED

        try:
            return sink.stage(batch_id, out)
        except (SinkError, ConnectionError, OSError):
            raise  # the sink's storage in the driver (its staging on an object store away): exit 2
        except Exception as e:  # in the user's code, in the tasks' reads, or in Spark itself
            if READ_FAILED in str(e):  # NATS, not the data: a server error (exit 2)
                text = str(e)
                raise ConsumerGroupError(text[text.index(READ_FAILED):].splitlines()[0][:500]) from None
            if self.fn is None and self.sql is None:
                raise ConsumerGroupError(f"Spark failed computing the batch: {_first_line(e)}") from e
            raise _spark_failure(e) from e

    def _collect(self, sink: TwoPhaseSink, staged: object, *observations: Observation | None) -> dict:
        """The observed metrics of the batch's Spark jobs (the staged result is discarded when
        they cannot be had)."""
        try:
            metrics: dict = {}
            for observation in observations:
                if observation is not None:
                    got = self._observed(observation)
                    for k, v in got.items():  # several routes' refusals add up
                        metrics[k] = [*metrics[k], *v] if k == "refused" and k in metrics else v
            return metrics
        except BaseException:
            sink.discard(staged)
            raise

    @staticmethod
    def _observed(observation: Observation) -> dict:
        # Observation.get blocks until the metric arrives, which it never does when the
        # transformation's result does not read the batch at all
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cg-observation")
        try:
            return pool.submit(lambda: observation.get).result(timeout=OBSERVATION_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise TransformError("transform: its result does not read the batch (it must be computed from "
                                 "the DataFrame it is given)") from None
        finally:
            pool.shutdown(wait=False)


def _is_query(sql: str) -> bool:
    """Whether a SQL transformation is a query (runs nothing by itself when planned): the
    warm-up runs only those over its made-up rows."""
    words = sql.lstrip().split(None, 1)
    return bool(words) and words[0].upper().lstrip("(") in ("SELECT", "WITH", "FROM", "VALUES", "TABLE")


def _first_line(e: Exception) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:500]}"


def _spark_failure(e: Exception) -> TransformError:
    return e if isinstance(e, TransformError) else TransformError(f"transform: {_first_line(e)}")


def partition_ranges(table: pa.Table) -> list[tuple[int, int, int, int]]:
    """(partition, first origin seq, last origin seq, rows) for each partition of a batch, by
    partition. Counted with numpy over the partition numbers (small integers): this runs on
    the event loop once per batch, where Arrow's ``group_by`` (an execution plan per call)
    cost a follower's small batches 0.5-0.7 ms each."""
    if table.num_rows == 0:
        return []
    partition, seq = table.column("partition"), table.column("origin_seq")
    if not partition.null_count and not seq.null_count:
        numbers, seqs = partition.to_numpy().astype(np.intp), seq.to_numpy()
        low = int(numbers.min())
        numbers -= low
        if int(numbers.max()) < 1 << 16:
            counts = np.bincount(numbers)
            first = np.full(len(counts), np.iinfo(np.int64).max)
            last = np.full(len(counts), np.iinfo(np.int64).min)
            np.minimum.at(first, numbers, seqs)
            np.maximum.at(last, numbers, seqs)
            return [(int(i) + low, int(first[i]), int(last[i]), int(counts[i])) for i in np.flatnonzero(counts)]
    grouped = table.group_by("partition").aggregate(  # not rows of this package's readers
        [("origin_seq", "min"), ("origin_seq", "max"), ("origin_seq", "count")])
    return sorted((int(r["partition"]), int(r["origin_seq_min"]), int(r["origin_seq_max"]), int(r["origin_seq_count"]))
                  for r in grouped.to_pylist())
