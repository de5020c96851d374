"""The Delta Lake sink's declaration: a table at a path or ``s3://bucket/prefix``, written by
delta-rs on the driver and Parquet files from Spark's tasks (``sinks/delta/writer.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.lake.declaration import PathSink

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink
    from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import MaintenanceReport


@dataclass(frozen=True)
class DeltaOptions:
    sink_path: str | None = None
    partition_by: str | None = None
    target_file_size: int | None = None
    merge_keys: str | None = None
    delete_when: str | None = None


class Delta(PathSink[DeltaOptions]):
    """Located like the Parquet sink (a path), but also on object storage, partitioned by
    columns, merging, and maintained (``OPTIMIZE``, ``VACUUM``)."""

    name = "delta"
    options_class = DeltaOptions
    object_store = True
    driver_modules = ("deltalake", "obstore")
    maintained = compacts = True

    def open(self, options: DeltaOptions, *, transformed: bool = False) -> DeltaLakeSink:
        from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

        if not options.sink_path:
            raise ConfigError("sink_path", f"required for the {self.name} sink")
        try:
            return DeltaLakeSink(options.sink_path, partitioning=self.partitioning(options), merge=self.merge(options),
                                 target_file_size=options.target_file_size)
        except PermissionError as e:
            raise ConfigError("sink_path", f"cannot create the table in {options.sink_path!r} ({e.strerror})") \
                from None

    def read_table(self, *, columns: list[str] | None = None, storage_options: dict[str, str] | None = None,
                   row_filter: Any = None, **location: Any) -> Any:
        """delta-rs's file list read by pyarrow (``s3://`` with ``AWS_*`` settings); ``row_filter``
        (a pyarrow expression) is pushed down to the Parquet files."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

        sink_path = location["sink_path"]
        remote = sink_path.startswith("s3://")
        store = ObjectStoreSettings.from_env() if remote else None  # AWS_* (an aws connection's)
        if store is not None and storage_options is None:
            storage_options = store.object_store_options()
        dt = DeltaTable(sink_path, storage_options=storage_options)
        schema = pa.schema(dt.schema().to_arrow())
        if columns:
            schema = pa.schema([schema.field(c) for c in columns])
        uris = dt.file_uris()
        if not uris:
            return schema.empty_table()
        # (not to_pyarrow_dataset(): its scan threads abort the interpreter at exit, delta-rs #2184)
        if store is not None:
            return pq.read_table([u[len("s3://"):] for u in uris], schema=schema,
                                 filesystem=store.pyarrow_filesystem(), filters=row_filter)
        return pq.read_table(uris, schema=schema, filters=row_filter)

    def how_to_read(self, options: DeltaOptions) -> list[str]:
        path = options.sink_path
        return [f"python -c \"import pyarrow.parquet as pq; from deltalake import DeltaTable; "
                f"print(pq.read_table(DeltaTable('{path}').file_uris()))\"",
                "spark-submit --packages io.delta:delta-spark_2.13:4.4.0 ... "
                f"spark.read.format('delta').load('{path}')"]

    def maintain(self, sink: Any, *, compact: bool, target_file_size: int | None, retention_hours: float
                 ) -> MaintenanceReport:
        from airflow_provider_cg.core.landing.sinks.delta.maintenance import maintain_delta

        return maintain_delta(sink, compact, target_file_size, retention_hours)


KIND = Delta()
