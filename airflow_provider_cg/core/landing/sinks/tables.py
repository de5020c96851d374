"""What the Delta and Iceberg sinks share: schema rules, file statistics, where a table lives.

Schemas evolve as users change their transformations: a column the table lacks is added
(nullable); a column whose type differs from the table's, or a required column the batch
lacks, is refused with ``SchemaMismatch`` naming the column -- in ``prepare``, before any
message is acknowledged (the job exits 1: retrying cannot help).
"""

from __future__ import annotations

import abc
import io
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.sinks.base import SchemaMismatch, SinkError
from airflow_provider_cg.core.landing.sinks.lake import DatasetCorrupt, LakeSink
from airflow_provider_cg.core.landing.sinks.parquet_files import utc_schema

__all__ = ["APP_ID", "DataFile", "SchemaMismatch", "TableConflict", "TableSink", "file_stats", "new_columns",
           "stats_json", "utc_schema"]

APP_ID = "airflow-provider-cg"
"""The Delta app-transaction id (and Iceberg property prefix) that records log positions."""


def _norm(t: pa.DataType) -> str:
    """A type as the table formats see it (string/large/view kinds and timestamp units alike)."""
    if pa.types.is_dictionary(t):
        return _norm(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or t == pa.binary_view():
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{_norm(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_norm(f.type)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<{_norm(t.key_type)},{_norm(t.item_type)}>"
    return str(t)


def new_columns(table: pa.Schema, batch: pa.Schema) -> list[pa.Field]:
    """The batch's columns the table lacks (to add, nullable); ``SchemaMismatch`` for a column
    whose type differs or a required table column the batch lacks."""
    added = []
    for f in batch:
        idx = table.get_field_index(f.name)
        if idx < 0:
            added.append(f.with_nullable(True))
            continue
        want = table.field(idx)
        if _norm(want.type) != _norm(f.type):
            raise SchemaMismatch(f.name, f"is {_norm(f.type)} in this batch but {_norm(want.type)} in the table "
                                         "(changing a column's type is not an additive change)")
    for f in table:
        if not f.nullable and batch.get_field_index(f.name) < 0:
            raise SchemaMismatch(f.name, "is required by the table but missing from this batch")
    return added


def file_stats(data: bytes | None = None, *, metadata: pq.FileMetaData | None = None) -> tuple[int, dict]:
    """(rows, Delta-style stats) of a Parquet file: numRecords, and min/max/nullCount of its
    top-level integer and string columns (what readers skip files by, e.g. origin_seq)."""
    if metadata is None and data is None:
        raise ValueError("file_stats needs the file's bytes or its metadata")
    md = metadata if metadata is not None else pq.read_metadata(io.BytesIO(data or b""))
    schema = md.schema.to_arrow_schema()
    leaves = {md.schema.column(i).path: i for i in range(len(md.schema))}
    mins, maxs, nulls = {}, {}, {}
    for f in schema:
        if f.name not in leaves or not (pa.types.is_integer(f.type) or pa.types.is_string(f.type)
                                        or pa.types.is_large_string(f.type)):
            continue
        col = leaves[f.name]
        lo: Any = None
        hi: Any = None
        n_null = 0
        ok = True
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(col).statistics
            if st is None or not st.has_min_max:
                if md.row_group(rg).num_rows:
                    ok = False
                n_null += st.null_count if st is not None and st.has_null_count else 0
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            n_null += st.null_count if st.has_null_count else 0
        if ok and lo is not None:
            if isinstance(lo, bytes):
                lo, hi = lo.decode("utf-8", "replace"), hi.decode("utf-8", "replace")
            if isinstance(lo, str) and (len(lo) > 32 or len(hi) > 32):
                continue  # long strings: no bounds (a truncated max would be wrong)
            mins[f.name], maxs[f.name] = lo, hi
        nulls[f.name] = n_null
    stats = {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return md.num_rows, stats


def stats_json(stats: dict) -> str:
    return json.dumps(stats, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class DataFile:
    """A committed record's data file as a table commit adds it."""

    path: str
    size: int
    stats: dict  # Delta-style statistics (``file_stats``)
    metadata: pq.FileMetaData
    partition: list | None  # the partition values of its rows (``Partitioning.first_values``)


class TableSink(LakeSink):
    """A lake sink whose publish is one transaction of a table format per committed record,
    in log order: a record is published once the table's recorded position reaches it.

    Subclasses read that position (``published_through``), the table's schema, and commit
    one record's files (``commit_files``) so that the position and the files land together
    -- or raise ``TableConflict`` when another writer committed first (the caller re-reads)."""

    ALL_STATISTICS = True

    @abc.abstractmethod
    def published_through(self) -> int:
        """The highest log position the table holds (0 if none or no table yet)."""

    @abc.abstractmethod
    def table_schema(self) -> pa.Schema | None:
        """The table's current schema (None if there is no table yet)."""

    def merge_rows(self, record: dict, latest: pa.Table) -> None:
        """One table transaction that merges ``latest`` (``MergeSpec.latest``) by key and
        records ``record['pos']`` (``TableConflict`` when another writer committed first)."""
        raise SinkError(f"{type(self).__name__} has no merge")

    @abc.abstractmethod
    def commit_files(self, record: dict, files: list[DataFile], schema: pa.Schema) -> None:
        """One table transaction: add ``files``, record ``record['pos']``, add ``schema``'s new
        columns; create the table from ``schema`` (and the partitioning) if there is none."""

    # -- schema ---------------------------------------------------------------------------

    def storable(self, table: pa.Table) -> pa.Table:
        target = utc_schema(table.schema)
        return table if target == table.schema else table.cast(target)

    def check_schema(self, schema: pa.Schema) -> None:
        if self.partitioning is not None:
            self.partitioning.check_schema(utc_schema(schema))
        if self.merge is not None:
            self.merge.check_schema(schema)
        current = self.table_schema()
        if current is not None:
            new_columns(current, schema)

    def partition_of(self, path: str) -> list | None:
        """A published data file's partition values (from its first row; ``None``: unpartitioned)."""
        if self.partitioning is None:
            return None
        f = pq.ParquetFile(self.store.filesystem().open_input_file(self.store.file_path(path)))
        first = f.read_row_group(0, columns=self.partitioning.columns).slice(0, 1)
        return self.partitioning.first_values(first)

    # -- publish in log order -------------------------------------------------------------

    def publish(self, record: dict) -> None:
        target = record["pos"]
        with self._lock:
            for _ in range(1000):
                done = self.published_through()
                if done >= target:
                    break
                pending = sorted((r for r in self._log.commits.values() if done < r["pos"] <= target and r["files"]),
                                 key=lambda r: r["pos"])
                if not pending:
                    break  # records without files have nothing to show
                nxt = pending[0]
                if self.merge is not None:
                    try:
                        self.merge_rows(nxt, self.merge.latest(self._staged_rows(nxt)))
                    except TableConflict:
                        continue
                    self.store.delete_tree(self.staging(nxt["gid"]))
                    continue
                self.copy_files(nxt)
                files, schema = [], None
                for f in nxt["files"]:
                    data_md = pq.read_metadata(self.store.filesystem().open_input_file(self.store.file_path(f["path"])))
                    _, stats = file_stats(metadata=data_md)
                    files.append(DataFile(f["path"], self.store.size(f["path"]), stats, data_md,
                                          self.partition_of(f["path"])))
                    s = data_md.schema.to_arrow_schema()
                    schema = s if schema is None else pa.unify_schemas([schema, s])
                try:
                    self.commit_files(nxt, files, schema)
                except TableConflict:
                    continue  # another writer committed first: re-read where the table stands
                self.store.delete_tree(self.staging(nxt["gid"]))
            else:
                raise SinkError(f"could not publish log position {target}: too many concurrent commits")
            self.store.delete_tree(self.staging(record["gid"]))


    def roll_forward(self, commits: list[dict]) -> None:
        self.publish(commits[-1])  # publishes every record before it, in log order

    def _staged_rows(self, record: dict) -> pa.Table:
        """A committed record's rows, read from its staging (a merge publishes them, not the files)."""
        tables = []
        for f in record["files"]:
            try:
                tables.append(self._read_parquet(f["staged"]))
            except FileNotFoundError:
                raise DatasetCorrupt(f"staged rows of {record['gid']} are missing before its merge was "
                                     "published") from None
        return pa.concat_tables(tables, promote_options="default")


class TableConflict(SinkError):
    """Another writer committed to the table first; re-read and try again."""
