"""Opening the sink ``SinkOptions`` name: the one way the member job, ``cg lag`` and
``cg maintain`` get one.

Credentials come from the environment only (``CG_PG_DSN`` / ``CG_PG_DSN_FILE``,
``CG_ICEBERG_CATALOG_URI``, ``CG_ICEBERG_CATALOG_TOKEN`` / ``_CREDENTIAL``, ``AWS_*``), never
from arguments.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.base import TwoPhaseSink

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.contract import SinkOptions


def open_sink(options: SinkOptions, *, transformed: bool = False) -> TwoPhaseSink:
    """The sink ``options`` name (``parquet``, ``delta``, ``iceberg``, ``postgres``); ``ConfigError``
    naming the field when it cannot be opened as asked."""
    if options.routes is not None:  # several tables, each its own sink (``routing.py``)
        from airflow_provider_cg.core.landing.sinks.routing import RoutedSink, Routes

        routes = Routes.parse(options)
        opened: dict[str, TwoPhaseSink] = {}
        try:
            for route in routes.routes:
                try:
                    opened[route.name] = open_sink(route.options, transformed=transformed)
                except ConfigError as e:
                    raise ConfigError(f"routes.{route.name}.{e.field}", e.rule) from None
        except BaseException:
            for table in opened.values():
                table.close()
            raise
        return RoutedSink(routes, opened)
    sink = options.sink
    extra = {"delta": "deltalake", "iceberg": "pyiceberg"}.get(sink)
    if extra:
        for module in (extra, "obstore"):
            if importlib.util.find_spec(module) is None:
                raise ConfigError("sink", f"the {sink} sink needs {module} on the driver: "
                                          f"pip install 'airflow-provider-cg[{sink}]'")
    partitioning = None
    if options.partition_by:
        from airflow_provider_cg.core.landing.sinks.partitioning import Partitioning

        partitioning = Partitioning.parse(options.partition_by, sink)
        if any(f.transform != "identity" for f in partitioning.fields) \
                and importlib.util.find_spec("pyiceberg_core") is None:
            raise ConfigError("partition_by", "Iceberg partition transforms need pyiceberg-core on the driver "
                                              "and executors: pip install 'airflow-provider-cg[iceberg]'")
    merge = None
    if options.merge_keys:
        from airflow_provider_cg.core.landing.sinks.merging import MergeSpec

        merge = MergeSpec.parse(options.merge_keys, options.delete_when)
    if sink in ("parquet", "delta") and not options.sink_path:
        raise ConfigError("sink_path", f"required for the {sink} sink")
    if sink == "parquet":
        from airflow_provider_cg.core.landing.sinks.parquet import ParquetLakeSink

        try:
            return ParquetLakeSink(options.sink_path, target_file_size=options.target_file_size)
        except OSError as e:
            raise ConfigError("sink_path", f"cannot create the lake in {options.sink_path!r} ({e.strerror})") \
                from None
    if sink == "delta":
        from airflow_provider_cg.core.landing.sinks.delta import DeltaLakeSink

        try:
            return DeltaLakeSink(options.sink_path, partitioning=partitioning, merge=merge,
                                 target_file_size=options.target_file_size)
        except PermissionError as e:
            raise ConfigError("sink_path", f"cannot create the table in {options.sink_path!r} ({e.strerror})") \
                from None
    if sink == "iceberg":
        from airflow_provider_cg.core.landing.sinks.iceberg import IcebergSink

        uri = options.iceberg_catalog_uri or os.environ.get("CG_ICEBERG_CATALOG_URI")
        if not uri:
            raise ConfigError("iceberg_catalog_uri", "required for the iceberg sink (or CG_ICEBERG_CATALOG_URI)")
        if not options.iceberg_table:
            raise ConfigError("iceberg_table", "required for the iceberg sink")
        return IcebergSink(uri, options.iceberg_table, warehouse=options.iceberg_warehouse,
                           catalog_name=options.iceberg_catalog_name, partitioning=partitioning, merge=merge,
                           target_file_size=options.target_file_size)
    if sink != "postgres":
        raise ConfigError("sink", f"must be one of parquet, delta, iceberg, postgres (got {sink!r})")
    from airflow_provider_cg.core.landing.sinks.postgres import PostgresSink

    dsn = os.environ.get("CG_PG_DSN")
    if not dsn and os.environ.get("CG_PG_DSN_FILE"):
        try:
            with open(os.environ["CG_PG_DSN_FILE"], encoding="utf-8") as f:
                dsn = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError("CG_PG_DSN_FILE", f"cannot read the file it names ({type(e).__name__})") from None
    if not dsn:
        raise ConfigError("CG_PG_DSN", "the PostgreSQL sink needs a DSN in CG_PG_DSN or CG_PG_DSN_FILE")
    return PostgresSink(dsn, table=options.pg_table, transformed=transformed, merge=merge)
