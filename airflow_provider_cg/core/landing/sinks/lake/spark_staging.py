"""A batch whose output Spark computed lands by Spark's own tasks: they write its Parquet files
into the write's staging directory (``SPARK_DIR``) at the table's file size, and the driver
lists them (``StagedFiles``) and prepares the write from them (``LakeSink.prepare``)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.lake.parquet_files import WRITE_FAILED, TaskFileWriter
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    PreparedWriteLost,
    SchemaMismatch,
    SinkError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SPARK_DIR = "spark"  # inside a write's staging directory: the files Spark tasks wrote


@dataclass(frozen=True)
class StagedFiles:
    """A batch's output written by Spark tasks into its staging directory (``stage``)."""

    gid: str
    #: (path relative to the staging directory, rows) of each non-empty part file
    files: tuple[tuple[str, int], ...]
    #: (name, Arrow type) of the files' columns (none without a file)
    columns: tuple[tuple[str, str], ...] = ()


def stage_frame(sink: Any, batch_id: BatchId, frame: DataFrame) -> StagedFiles:
    """Spark tasks write the batch's Parquet files straight into the write's staging of ``sink``
    (a ``LakeSink``, on local disk or the object store), each at most ``target_file_size``
    (``TaskFileWriter``); the driver only lists them."""
    staging = sink.staging(batch_id.gid)
    try:
        sink.store.start_dir(staging)
    except FileExistsError:
        raise SinkError(f"batch {batch_id.gid} is already prepared") from None
    sink.store.ensure_dir(f"{staging}/{SPARK_DIR}")  # tasks write into it, and never create it
    try:
        check_frame(sink, frame)
    except SchemaMismatch:
        sink.store.delete_tree(staging)
        raise
    writer = TaskFileWriter(sink.store.location, f"{staging}/{SPARK_DIR}", sink.compression, sink.partitioning,
                            target=sink.target_file_size, all_statistics=sink.ALL_STATISTICS)
    if sink.partitioning is not None:
        # one task per partition value: one file per partition per commit (or several of the
        # target size), not one per task and partition; rows in origin order within each
        frame = frame.repartition(*sink.partitioning.columns)
        if "origin_seq" in frame.columns:
            frame = frame.sortWithinPartitions(*(c for c in ("origin_stream", "origin_seq") if c in frame.columns))
    try:
        out = frame.mapInArrow(writer, "file string, rows long").collect()
    except Exception as e:
        if not sink.store.dir_exists(staging):
            raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while Spark wrote it") from None
        sink.store.delete_tree(staging)
        text = str(e)
        if WRITE_FAILED in text:
            detail = text[text.index(WRITE_FAILED):].splitlines()[0]
            raise SinkError(f"Spark tasks could not write the batch's files: {detail}") from None
        raise
    if any(int(r["rows"]) < 0 for r in out):  # a task found the staging folder gone
        raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while Spark wrote it")
    files = tuple(sorted((f"{SPARK_DIR}/{r['file']}", int(r["rows"])) for r in out))
    if files and not sink.store.exists(f"{staging}/{files[0][0]}"):
        sink.store.delete_tree(staging)  # the tasks wrote to their own disks: never commit a batch for it
        raise SinkError(f"Spark's output for {batch_id.gid} is not in {sink.store.location} as the driver sees "
                        "it (is the lake on a filesystem mounted at the same path on the driver and the "
                        "executors?)")
    columns: tuple[tuple[str, str], ...] = ()
    if files:
        schema = pq.read_schema(io.BytesIO(sink.store.read(f"{staging}/{files[0][0]}")))
        try:
            sink.check_schema(schema)
        except SchemaMismatch:
            sink.store.delete_tree(staging)
            raise
        columns = tuple((f.name, str(f.type)) for f in schema)
    return StagedFiles(batch_id.gid, files, columns)

def check_frame(sink: Any, frame: DataFrame) -> None:
    """The partition and merge columns of a Spark batch, before its tasks write anything."""
    if sink.merge is not None:
        sink.merge.check_schema(pa.schema([pa.field(c, pa.null()) for c in frame.columns]))
    if sink.partitioning is None:
        return
    missing = [c for c in sink.partitioning.columns if c not in frame.columns]
    if missing:
        raise SchemaMismatch(missing[0], f"is a partition column (partition_by {sink.partitioning}) "
                                         "but not in this batch")
    try:
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(frame.select(*sink.partitioning.columns).schema)
    except Exception:  # noqa: BLE001 - a type Arrow lacks: the files' own check follows
        return
    sink.partitioning.check_schema(schema)
