"""Delta Lake tables, on local disk or S3-compatible object storage, exactly once.

The lake protocol (``lake_sink.py``) decides what is committed; each committed batch is then
published in one Delta commit (``deltalake``, delta-rs) with every other record ready then
(``tables.py``'s group commit), adding all of their files and carrying the app transaction
``(airflow-provider-cg, <last log position>)``. Records are published in log order, so the
table's app-transaction version says exactly which batches it holds: a publisher reads it,
publishes the records after it, and when another publisher got there first, delta-rs refuses the second commit of the same app transaction
(``ConcurrentTransaction``) and the loser re-reads. Commits of other writers (OPTIMIZE,
VACUUM, a user's appends) rebase as usual. Data files are written by Spark tasks (or the
driver) into the protocol's staging and copied to ``data/`` at publish, so a VACUUM with
any retention never deletes a prepared write's files, and compaction or log checkpoints
change nothing the protocol reads.

On an object store, Delta's commits need a conditional put: S3 and MinIO support it
(``conditional_put=etag`` is set for an S3-compatible endpoint).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.lake.storage import (
    ObjectStorage,
    ObjectStoreSettings,
    open_storage,
)
from airflow_provider_cg.core.landing.sinks.lake.tables import (
    APP_ID,
    DataFile,
    SchemaMismatch,
    TableConflict,
    TableSink,
    TableState,
    new_columns,
    stats_json,
)
from airflow_provider_cg.core.landing.sinks.shared.merging import DELETE_FLAG, MergeSpec, quote
from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

#: the table property delta-rs writes a MERGE's files by
TARGET_FILE_SIZE = "delta.targetFileSize"


def delta_storage_options(settings: ObjectStoreSettings) -> dict[str, str]:
    """delta-rs storage options for an S3-compatible store (no secret is logged by delta-rs)."""
    opts = {f"AWS_{k.upper()}": v for k, v in settings.object_store_options().items()}
    if settings.endpoint:
        opts["conditional_put"] = "etag"
    return opts


class DeltaLakeSink(TableSink):
    """Two-phase sink into the Delta table at ``location`` (a path, ``file://`` or ``s3://``),
    created from the first batch's schema if missing."""

    def __init__(self, location: str | os.PathLike, *, fsync: bool = True, compression: str = "snappy",
                 checkpoint_interval: int = 100, partitioning: Partitioning | None = None,
                 merge: MergeSpec | None = None, target_file_size: int | None = None) -> None:
        store = open_storage(str(location), fsync=fsync)
        if isinstance(store, ObjectStorage):
            store.check()
            self.storage_options = delta_storage_options(store.settings)
        else:
            self.storage_options = {}
        super().__init__(store, compression=compression, checkpoint_interval=checkpoint_interval,
                         target_file_size=target_file_size)
        self.uri = store.uri()
        self._dt: Any = None  # deltalake.DeltaTable once the table exists
        self.partitioning: Partitioning | None = self._table_partitioning(partitioning)
        self.merge = merge

    def _table_partitioning(self, asked: Partitioning | None) -> Partitioning | None:
        """The existing table's partition columns (``asked`` must name the same), else ``asked``."""
        dt = self._table()
        if dt is None:
            return asked
        columns = list(dt.metadata().partition_columns)
        if asked is not None and asked.columns != columns:
            raise ConfigError("partition_by", f"the table {self.uri} exists partitioned by "
                                              f"({', '.join(columns) or 'nothing'}), not ({asked})")
        return Partitioning.parse(", ".join(columns), "delta", transforms=False) if columns else None

    def _table(self, *, fresh: bool = True) -> DeltaTable | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            if self._dt is None:
                try:
                    self._dt = DeltaTable(self.uri, storage_options=self.storage_options or None)
                except TableNotFoundError:
                    return None
            elif fresh:
                self._dt.update_incremental()
        except (DeltaError, OSError) as e:
            self._dt = None
            first = (str(e).splitlines() or [""])[0][:200]
            raise SinkError(f"cannot read the delta table {self.uri} ({type(e).__name__}: {first})") from None
        return self._dt

    def load_state(self) -> TableState:
        dt = self._table()
        if dt is None:
            return TableState(0, None)
        return TableState(dt.transaction_version(APP_ID) or 0, pa.schema(dt.schema().to_arrow()), dt)

    def check_schema(self, schema: pa.Schema) -> None:
        """Besides the table's own columns: every column must be of a type Delta has (a
        ``time`` column has none), found before any ack rather than at publish."""
        from deltalake import Schema as DeltaSchema

        for f in schema:
            try:
                DeltaSchema.from_arrow(pa.schema([f]))
            except Exception:  # noqa: BLE001 - delta-rs raises a bare Exception for a type it lacks
                raise SchemaMismatch(f.name, f"has type {f.type}, which a Delta table cannot hold") from None
        super().check_schema(schema)

    def _evolved_table(self, schema: pa.Schema) -> DeltaTable:
        """The table, created from ``schema`` (and the partitioning) if missing -- by this
        publisher or another one meanwhile -- with ``schema``'s new columns added: a metadata
        commit before the data (harmless alone)."""
        from deltalake import DeltaTable, Field
        from deltalake import Schema as DeltaSchema
        from deltalake.exceptions import DeltaError

        dt = self._table(fresh=False)
        if dt is None:
            try:
                DeltaTable.create(self.uri, schema=schema, mode="ignore", storage_options=self.storage_options or None,
                                  partition_by=self.partitioning.columns if self.partitioning else None,
                                  configuration=self._file_size_property())
            except DeltaError:
                pass  # another publisher created it meanwhile
            dt = self._table()
            if dt is None:
                raise SinkError(f"delta table {self.uri} is not there after it was created")
        elif self.merge is not None and (wanted := self._file_size_property()) and \
                dt.metadata().configuration.get(TARGET_FILE_SIZE) != str(self.target_file_size):
            dt.alter.set_table_properties(wanted)
            dt.update_incremental()
        added = new_columns(pa.schema(dt.schema().to_arrow()), schema)
        if added:
            fields = DeltaSchema.from_arrow(pa.schema(added)).fields
            dt.alter.add_columns([Field(f.name, f.type, nullable=True) for f in fields])
            dt.update_incremental()
        return dt

    def _file_size_property(self) -> dict[str, str] | None:
        """``delta.targetFileSize``: the size delta-rs's MERGE writes its files at (the sink's own
        files are written at ``target_file_size`` by ``parquet_files.py``). delta-rs checks it
        every 1,024 rows, so a merge's file can pass it by up to 1,024 rows' bytes."""
        return {TARGET_FILE_SIZE: str(self.target_file_size)} if self.target_file_size else None

    def _publish_failed(self, e: Exception, what: str, pos: int) -> SinkError:
        """A failed table commit: ``TableConflict`` (another publisher was first: re-read and
        retry) or ``SinkError`` (the store went away, a timeout: the log record stays, a rerun
        publishes)."""
        from deltalake.exceptions import CommitFailedError

        self._dt = None
        first = (str(e).splitlines() or [""])[0][:200]
        if isinstance(e, CommitFailedError) or (what == "merge" and ("conflict" in first.lower()
                                                                      or "transaction" in first.lower())):
            return TableConflict(f"delta {what} of position {pos} lost a race ({first})")
        return SinkError(f"delta {what} of position {pos} to {self.uri} failed ({type(e).__name__}: {first})")

    @staticmethod
    def _properties(records: list[dict], now: int, retries: int, **metadata: str) -> CommitProperties:
        """The commit's app transaction (the last record's log position) and metadata: the
        positions and gids it publishes."""
        from deltalake import CommitProperties, Transaction

        last = records[-1]
        return CommitProperties(app_transactions=[Transaction(APP_ID, last["pos"], now)],
                                custom_metadata={"cg.gid": last["gid"], "cg.position": str(last["pos"]),
                                                 "cg.positions": ",".join(str(r["pos"]) for r in records),
                                                 **metadata},
                                max_commit_retries=retries)

    def commit_files(self, records: list[dict], files: list[DataFile], schema: pa.Schema, state: TableState) -> bool:
        from deltalake.exceptions import DeltaError
        from deltalake.transaction import AddAction, RemoveAction

        last = records[-1]["pos"]
        try:
            dt = self._evolved_table(schema)
            if not self.as_loaded(dt.transaction_version(APP_ID) or 0, state, last):
                return False  # the table was re-read above (created, evolved): another publisher got here first
            now = int(time.time() * 1000)
            part = self.partitioning
            actions: list[AddAction | RemoveAction] = [
                AddAction(f.path, f.size, part.delta_values(f.partition or []) if part else {}, now, True,
                          stats_json(f.stats)) for f in files]
            rows = sum(int(r["rows_written"]) for r in records)
            props = self._properties(records, now, 10, **{"cg.rows": str(rows)})
            dt.create_write_transaction(actions, "append", pa.schema(dt.schema().to_arrow()), commit_properties=props,
                                        partition_by=part.columns if part else None)
        except DeltaError as e:  # CommitFailedError is one
            raise self._publish_failed(e, "commit", last) from None
        return True

    def merge_rows(self, records: list[dict], latest: pa.Table, state: TableState) -> bool:
        """One delta-rs MERGE for the records, carrying the last one's app transaction: insert
        new keys, replace or delete (tombstones) only rows older than the merged record."""
        from deltalake.exceptions import DeltaError

        last = records[-1]["pos"]
        latest = self.storable(latest)
        columns = [quote(c) for c in latest.column_names if c != DELETE_FLAG]
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in self.merge.keys)
        newer = 't."origin_stream" <> s."origin_stream" OR t."origin_seq" < s."origin_seq"'
        flag = f"s.{quote(DELETE_FLAG)}"
        try:
            dt = self._evolved_table(latest.drop_columns([DELETE_FLAG]).schema)
            if not self.as_loaded(dt.transaction_version(APP_ID) or 0, state, last):
                return False
            props = self._properties(records, int(time.time() * 1000), 0)
            (dt.merge(latest, on, source_alias="s", target_alias="t", commit_properties=props)
             .when_matched_delete(predicate=f"({newer}) AND {flag}")
             .when_matched_update(updates={c: f"s.{c}" for c in columns}, predicate=f"({newer}) AND NOT {flag}")
             .when_not_matched_insert(updates={c: f"s.{c}" for c in columns}, predicate=f"NOT {flag}")
             .execute())
        except DeltaError as e:
            raise self._publish_failed(e, "merge", last) from None
        return True
