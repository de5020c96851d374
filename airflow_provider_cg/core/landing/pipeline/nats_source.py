"""A PySpark data source whose tasks read planned ranges of a stream from NATS.

The member job's driver plans a batch (``direct.plan_ranges``: per partition, a sequence range
up to one cut) and keeps the protocol: the pin, the fences, the two-phase steps, the ack. The
batch's Spark job reads it through this source: each task connects to NATS, reads its ranges
with batched direct gets and yields the rows (``ROW_SCHEMA``) as Arrow record batches, so
decoding, the user's transformation and the sink's write follow in the same tasks and the
driver never holds the messages.

What the tasks need travels with the source, not in its options (which Spark shows in plans
and UIs): ``register`` makes a subclass per job that carries the NATS connection settings
(secrets included, file paths replaced by their content so that executors on other machines
can use them), pickled by value into the job's own serialized command.

A task's connection and event loop stay with its Python worker (``WorkerConnection``): Spark
reuses its workers, so a follower's tasks, batch after batch, do not connect again.

Every ``(partition, first, last)`` range is read in full: a task's retry reads the same
messages (the driver holds the pin, nothing else removes them). ``skip`` drops inputs the sink
has committed already; ``only`` (a regular expression of the member's filter subjects) drops
what else a static member's unfiltered read returns.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.jetstream.direct_gets import (
    DirectReadError,
    PartitionBatch,
    PartitionReader,
    ReadRange,
)
from airflow_provider_cg.core.landing.rows import (
    ROW_SCHEMA,
    KeySelector,
    keep_matching,
    rows_from_batches,
)
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import decode_seqs, encode_seqs
from airflow_provider_cg.core.landing.stream_life import OriginKeys

try:  # PySpark 4.0+; a driver without it never plans executor reads
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - the member job refuses --read executors first
    DataSource = DataSourceReader = object  # type: ignore[assignment,misc]
    InputPartition = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from pyspark.sql import SparkSession

    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

SOURCE_NAME = "cg_nats_ranges"
#: in the message of a task that could not read (the driver reports it as a server error)
READ_FAILED = "cg-nats-read-failed"
#: how long a task keeps retrying a read interrupted by a server restart or leader change
READ_RETRY_SECONDS = 60.0
SPARK_ROWS = ("origin_stream string not null, origin_seq bigint not null, subject string, `partition` int, "
              "key string, payload binary, payload_text string, headers string, `timestamp` timestamp, "
              "delivery_count int, `group` string, member string")
_ARROW_ROWS = pa.schema([f.with_type(pa.binary()) if f.name == "payload" else
                         f.with_type(pa.timestamp("us", tz="UTC")) if f.name == "timestamp" else f
                         for f in ROW_SCHEMA])


def batch_plan(ranges: list[ReadRange], *, stream: str, origin: str | None, group: str, member: str,
               key_rules: list, js_prefix: str, only: str | None, parallelism: int,
               skip: np.ndarray | None = None, origin_keys: OriginKeys | None = None) -> str:
    """The source's ``plan`` option: what a batch's tasks read (no secret in it). Ranges are
    split so that about ``parallelism`` tasks share the batch. ``origin_keys``: the rows'
    ``origin_stream`` by sequence (the keys of the origin's lives in the sink)."""
    per_range = max(1, -(-parallelism // max(1, len(ranges))))
    splits = [[r.partition, r.subject, r.first_seq, r.last_seq, r.messages, *([r.stream] if r.stream else [])]
              for big in ranges for r in big.split(per_range)]
    return json.dumps({
        "stream": stream, "origin": origin, "group": group, "member": member, "js_prefix": js_prefix,
        "keys": [[f, list(w)] for f, w in key_rules], "only": only,
        "splits": splits, "skip": encode_seqs(np.sort(skip)) if skip is not None and len(skip) else None,
        "origin_keys": origin_keys.to_list() if origin_keys is not None else None,
    }, separators=(",", ":"))


def warm_up_plan(parallelism: int) -> str:
    """A plan of ``parallelism`` empty ranges: tasks that read nothing (no connection either)."""
    return json.dumps({"stream": "", "origin": None, "group": "", "member": "", "js_prefix": "", "keys": [],
                       "only": None, "splits": [[0, "", 1, 0, 0]] * max(1, parallelism), "skip": None})


def register(spark: SparkSession, settings: NatsConnectionSettings) -> None:
    """Register the source for this job's session, carrying ``settings`` (see the module doc)."""
    carried = settings.portable().to_dict()
    spark.dataSource.register(type("NatsRangesOfThisJob", (NatsRangeSource,), {
        "settings": carried, "__module__": "cg_job_dynamic"}))  # not importable: pickled by value


class NatsRangeSource(DataSource):
    """``spark.read.format("cg_nats_ranges").option("plan", batch_plan(...)).load()``."""

    settings: dict | None = None

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SPARK_ROWS

    def reader(self, schema: Any) -> NatsRangeReader:
        return NatsRangeReader(json.loads(self.options["plan"]), type(self).settings or {})


class NatsRangeReader(DataSourceReader):
    def __init__(self, plan: dict, settings: dict) -> None:
        self.plan, self.settings = plan, settings

    def partitions(self) -> list:
        return [InputPartition(split) for split in self.plan["splits"]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_split(self.plan, self.settings, partition.value)


class WorkerConnection:
    """This Python worker's NATS connection and event loop, kept across the tasks it runs. Between
    tasks nothing runs the loop, so the connection answers no ping: one idle longer than
    ``IDLE_LIMIT`` (well under the server's ping interval and ping count) is replaced rather
    than trusted, as is one whose read failed, or one for other settings."""

    IDLE_LIMIT = 30.0

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.nc: NATS | None = None
        self.key: str | None = None
        self.used = 0.0  # when a task last finished with it (monotonic)
        self.connects = 0  # connections opened by this worker

    def event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None or self.loop.is_closed():
            self.loop = asyncio.new_event_loop()
            atexit.register(self.close)
        return self.loop

    def close(self) -> None:
        """Close the connection and the loop (at the worker's exit: its client's tasks end cleanly)."""
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed():
            loop.run_until_complete(self.drop())
            loop.close()

    async def get(self, settings: dict, name: str) -> NATS:
        """The worker's connection for ``settings``: kept, or new."""
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        key = hashlib.sha256(json.dumps([settings, name], sort_keys=True, default=str).encode()).hexdigest()
        if self.nc is not None:  # let its client see what came while no task ran (a closed socket)
            for _ in range(3):
                await asyncio.sleep(0)
        if (self.nc is not None and self.key == key and self.nc.is_connected
                and time.monotonic() - self.used < self.IDLE_LIMIT):
            return self.nc
        await self.drop()
        nc = self.nc = await NatsConnectionSettings.from_mapping({**settings, "name": name}).connect()
        self.key = key
        self.connects += 1
        return nc

    def done(self) -> None:
        """A task finished with the connection (it stays for the next)."""
        self.used = time.monotonic()

    async def drop(self) -> None:
        nc, self.nc, self.key = self.nc, None, None
        if nc is not None:
            try:
                await nc.close()
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - closing a broken connection (nats-py
                pass  # lets its own cancelled reconnect surface here; no task of ours is cancelled)


WORKER = WorkerConnection()


def read_split(plan: dict, settings: dict, split: list) -> Iterator[pa.RecordBatch]:
    """One task: the split's messages as rows (after ``skip`` and ``only``), one server answer
    at a time, so Spark works on an answer's rows while the next is read."""
    rng = ReadRange(*split)
    if rng.last_seq < rng.first_seq:
        return
    keys = KeySelector(plan["keys"])
    origin = OriginKeys.from_list(plan.get("origin_keys"))
    skip = decode_seqs(plan["skip"]) if plan["skip"] else None
    loop = WORKER.event_loop()
    chunks = _read(plan, settings, rng)
    try:
        while True:
            try:
                batch = loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                break
            if plan["only"] and not keep_matching([batch], plan["only"]):
                continue
            table, _ = rows_from_batches([batch], group=plan["group"], member=plan["member"], keys=keys,
                                         origin=plan["origin"])
            if origin is not None:
                table = origin.apply(table)
            if skip is not None:
                seqs = table.column("origin_seq").to_numpy()
                idx = np.clip(np.searchsorted(skip, seqs), 0, len(skip) - 1)
                table = table.filter(pa.array(skip[idx] != seqs))
            yield from table.cast(_ARROW_ROWS, safe=False).to_batches(max_chunksize=8192)  # Spark keeps µs
    finally:
        loop.run_until_complete(chunks.aclose())
        WORKER.done()


async def _read(plan: dict, settings: dict, rng: ReadRange) -> AsyncGenerator[PartitionBatch, None]:
    """The range's answers, on the worker's connection; a read interrupted by a restart or a
    leader change goes on from where it stopped, on a new connection, for up to
    ``READ_RETRY_SECONDS``."""
    deadline = time.monotonic() + READ_RETRY_SECONDS
    seq, got = rng.first_seq, 0
    while True:
        try:
            nc = await WORKER.get(settings, f"cg-read-{plan['member']}")
            reader = PartitionReader(nc, rng.stream or plan["stream"], js_prefix=plan["js_prefix"])
            try:
                async for chunk in reader.range_chunks(rng.subject, seq, rng.last_seq, rng.messages - got):
                    seq, got = chunk.last_seq + 1, got + len(chunk)
                    yield chunk
                return
            finally:
                await reader.close()
        except Exception as e:
            await WORKER.drop()  # not trusted again
            if not server_away(e) or time.monotonic() > deadline:
                raise RuntimeError(f"{READ_FAILED}: {rng.stream or plan['stream']} {rng.subject} "
                                   f"[{rng.first_seq}, {rng.last_seq}]: {type(e).__name__}: {e}") from None
        await asyncio.sleep(0.5)


def server_away(e: BaseException) -> bool:
    """Whether a task's read failed because the server is away for a moment (a restart, a leader
    change: worth reading again from where it stopped), not because of an answer or a refusal
    that no retry changes (credentials, TLS, a deleted stream)."""
    from nats.errors import ConnectionClosedError, NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from airflow_provider_cg.core.errors import NatsConnectError, ServerUnavailable

    if isinstance(e, NatsConnectError):
        return e.reason in ("unreachable", "timeout")
    if isinstance(e, DirectReadError):
        return e.retryable
    return isinstance(e, ServerUnavailable | NatsTimeout | NoRespondersError | ConnectionClosedError | OSError |
                      ConnectionError | TimeoutError)
