"""Parquet data files of a bounded size, in row order: the one writer of the lake sinks' files.

The driver (``LakeSink``, rows landed as read) and Spark's tasks (``TaskFileWriter``, a
batch Spark computed) write through ``SizedParquetFiles``, so ``target_file_size`` holds for every
file the job writes, whoever writes it. A file's size is only known once its row groups are
encoded, and a task sees its rows as a stream it cannot hold whole; so rows go in as row groups
of about an eighth of the target, each one's encoded size teaches the writer how many bytes a
row takes (compression included), and a file is closed before the next row group would take it
past the target. A file then ends within one row group's misestimate of the target, and memory
holds one file at most. A single row larger than the target is a file of its own.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.lake.storage import Storage
    from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning

#: how a failed write of a data file reads inside the PythonException Spark raises in the driver:
#: the sink's storage failing, not the user's transformation (so: transient, exit 2, not 1)
WRITE_FAILED = "cg-sink: writing a data file failed"
#: columns written with dictionary encoding, and (unless every column is) with statistics
DICT_COLUMNS = ("origin_stream", "subject", "key", "group", "member", "headers")
STATS_COLUMNS = ("origin_stream", "origin_seq", "subject", "partition", "key", "timestamp", "group", "member")

#: row groups are about this share of the target: small enough that a misestimate of one stays
#: a few per cent of a file, large enough for readers (16 MiB row groups at a 128 MiB target)
ROW_GROUP_SHARE = 8
#: room kept for the footer (row-group and column metadata, statistics)
FOOTER_RESERVE = 16 << 10


class SizedParquetFiles:
    """Rows in, Parquet files of at most about ``target`` bytes out (``None``: one file),
    in the order the rows came. ``add`` and ``finish`` yield each finished file as
    ``(bytes, rows)``. ``options`` are ``pyarrow.parquet.ParquetWriter``'s (compression,
    dictionary columns, statistics)."""

    def __init__(self, schema: pa.Schema, target: int | None, **options: Any) -> None:
        self.schema, self.target, self.options = schema, target, options
        self._writer: pq.ParquetWriter | None = None
        self._buf = io.BytesIO()
        self._rows = 0
        # encoded bytes per Arrow byte, learnt from the row groups written (1.0 until then:
        # incompressible data encodes at about its Arrow size)
        self._encoded, self._arrow = 0, 0

    def add(self, data: pa.Table | pa.RecordBatch) -> Iterator[tuple[bytes, int]]:
        n = data.num_rows
        if n == 0:
            return
        if not self.target:
            self._write(data)
            return
        at = 0
        while at < n:
            room = self.target - FOOTER_RESERVE - self._buf.tell()
            take = self._rows_within(data, at, min(self.target / ROW_GROUP_SHARE, room) / self._ratio())
            if self._rows and take == 0:  # not even the next row fits: the file is full
                yield self._close()
                continue
            take = max(take, 1)
            piece = data.slice(at, take)
            before = self._buf.tell()
            self._write(piece)
            self._encoded += self._buf.tell() - before
            self._arrow += max(piece.nbytes, 1)
            at += take
            if self._buf.tell() + FOOTER_RESERVE >= self.target:
                yield self._close()

    @staticmethod
    def _rows_within(data: pa.Table | pa.RecordBatch, at: int, budget: float) -> int:
        """How many rows from ``at`` take at most ``budget`` Arrow bytes (a slice's ``nbytes`` is
        the bytes its rows reference, so rows of any size are counted as they are)."""
        lo, hi = 0, data.num_rows - at
        if data.slice(at, hi).nbytes <= budget:
            return hi
        while lo < hi:  # the largest count within the budget
            mid = (lo + hi + 1) // 2
            if data.slice(at, mid).nbytes <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def finish(self) -> Iterator[tuple[bytes, int]]:
        """The last file (if any rows are open)."""
        if self._rows:
            yield self._close()

    def files(self, data: pa.Table | pa.RecordBatch) -> list[tuple[bytes, int]]:
        """All of ``data`` as files (the driver's case: the rows are at hand)."""
        return [*self.add(data), *self.finish()]

    def _ratio(self) -> float:
        return self._encoded / self._arrow if self._arrow else 1.0

    def _write(self, data: pa.Table | pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._buf, self.schema, **self.options)
        if isinstance(data, pa.RecordBatch):
            self._writer.write_batch(data)
        else:
            self._writer.write_table(data)
        self._rows += data.num_rows

    def _close(self) -> tuple[bytes, int]:
        assert self._writer is not None
        self._writer.close()
        out = (self._buf.getvalue(), self._rows)
        self._writer, self._buf, self._rows = None, io.BytesIO(), 0
        return out


def data_file_options(schema: pa.Schema, compression: str, all_statistics: bool) -> dict:
    """``ParquetWriter`` options of a lake sink's data files: the row columns dictionary-encoded,
    statistics for every column (the table formats read them) or the key columns only."""
    names = set(schema.names)
    return {
        "compression": compression,
        "use_dictionary": [c for c in DICT_COLUMNS if c in names],
        "write_statistics": True if all_statistics else [c for c in STATS_COLUMNS if c in names],
        "coerce_timestamps": "us",
        "allow_truncated_timestamps": True,
    }


def _utc(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pa.timestamp(t.unit, "UTC")
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_utc(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_utc(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_utc(t.value_type)))
    return t


def utc_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every zoned timestamp labelled ``UTC``. Arrow keeps instants in UTC
    whatever the label, so this changes no value; Spark labels them with its session zone
    (``Etc/UTC``, ``Europe/Paris``), which a Delta table refuses and readers would disagree on."""
    return pa.schema([f.with_type(_utc(f.type)) for f in schema], metadata=schema.metadata)


def warm_up_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` of a Spark job's warm-up (``SparkPipeline.warm_up``): the Python worker
    that runs it starts, and imports what writing a batch's files needs (pyarrow's Parquet
    writer, the storage), before the first batch rather than in it: about 3-5 s of a small
    machine's first batch. Writes into memory only; yields ("", rows) per batch, the shape of
    ``TaskFileWriter``'s output."""
    from airflow_provider_cg.core.landing.sinks.lake import storage  # noqa: F401 - the first batch's import, paid now

    for batch in batches:
        schema = utc_schema(batch.schema)
        files = SizedParquetFiles(schema, None, **data_file_options(schema, "snappy", True))
        rows = sum(n for _, n in files.files(batch.cast(schema)))
        yield pa.record_batch({"file": pa.array([""]), "rows": pa.array([rows], pa.int64())})


class TaskFileWriter:
    """Runs in Spark's Python workers (``mapInArrow``): writes each task's rows as Parquet files
    under the write's staging -- per partition of a partitioned table, each at most
    ``target`` bytes (``SizedParquetFiles``) -- and yields (file, rows) of each as it is
    written. The store is rebuilt in the worker from the location and the worker's environment,
    so no credential travels in a task. A file is named by the Spark partition it holds and its
    place among the task's files, so a batch's files list (and are committed) in the order of
    its input: per-key order within a batch, for rows one per input."""

    def __init__(self, location: str, folder: str, compression: str,
                 partitioning: Partitioning | None = None, *,
                 target: int | None = None, all_statistics: bool = True) -> None:
        self.location, self.folder, self.compression = location, folder, compression
        self.partitioning, self.target, self.all_statistics = partitioning, target, all_statistics

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import secrets

        from pyspark import TaskContext

        task = TaskContext.get()
        prefix = f"{self.folder}/part-{task.partitionId() if task else 0:05d}"
        writers: dict = {}  # partition key -> SizedParquetFiles
        target_schema = None
        store, written = None, 0
        for batch in itertools.chain(batches, [None]):  # None: the end, every open file is finished
            if batch is None:
                done = [f for w in writers.values() for f in w.finish()]
            elif batch.num_rows == 0:
                continue
            else:
                if target_schema is None:
                    target_schema = utc_schema(batch.schema)
                batch = batch if batch.schema == target_schema else batch.cast(target_schema)
                done = []
                for part in [batch] if self.partitioning is None else self.partitioning.split(batch):
                    key = None if self.partitioning is None else tuple(self.partitioning.first_values(part))
                    w = writers.get(key)
                    if w is None:
                        options = data_file_options(target_schema, self.compression, self.all_statistics)
                        w = writers[key] = SizedParquetFiles(target_schema, self.target, **options)
                    done += list(w.add(part))
            for data, rows in done:
                if store is None:
                    store = self._open_storage()
                name = f"{prefix}-{written:04d}-{secrets.token_hex(8)}.parquet"
                written += 1
                try:
                    store.write(name, data)
                except FileNotFoundError:
                    # the write's staging folder was removed (an instance that took the member over
                    # recovered it): say so to the driver instead of failing the task, whose stack
                    # trace Spark would print for a case the protocol handles
                    yield pa.record_batch({"file": pa.array([""]), "rows": pa.array([-1], pa.int64())})
                    return
                except Exception as e:  # noqa: BLE001 - any storage failure; the message says which
                    first = (str(e).splitlines() or [""])[0][:300]
                    raise OSError(f"{WRITE_FAILED} ({type(e).__name__}: {first})") from None
                yield pa.record_batch({"file": pa.array([name.rsplit("/", 1)[-1]]), "rows": pa.array([rows], pa.int64())})

    def _open_storage(self) -> Storage:
        from airflow_provider_cg.core.landing.sinks.lake.storage import open_storage

        try:
            return open_storage(self.location, fsync=True)
        except Exception as e:  # noqa: BLE001 - the worker cannot reach the storage
            first = (str(e).splitlines() or [""])[0][:300]
            raise OSError(f"{WRITE_FAILED} ({type(e).__name__}: {first})") from None
