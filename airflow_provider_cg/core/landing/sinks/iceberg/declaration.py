"""The Iceberg sink's declaration: a table in a SQL or REST catalog, its files where the
catalog's warehouse (or the table's location) says (``sinks/iceberg/writer.py``)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.shared.declaration import (
    Connection,
    SinkKind,
    check_location,
    location_dataset,
)
from airflow_provider_cg.core.landing.sinks.shared.identifiers import parse_identifier

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink
    from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import MaintenanceReport

CATALOG_URI_ENV = "CG_ICEBERG_CATALOG_URI"


@dataclass(frozen=True)
class IcebergOptions:
    iceberg_table: str | None = None
    iceberg_catalog_uri: str | None = None
    iceberg_warehouse: str | None = None
    iceberg_catalog_name: str = "default"
    partition_by: str | None = None
    target_file_size: int | None = None
    merge_keys: str | None = None
    delete_when: str | None = None


class Iceberg(SinkKind[IcebergOptions]):
    name = "iceberg"
    options_class = IcebergOptions
    location = ("iceberg_catalog_uri", "iceberg_catalog_name", "iceberg_table")
    driver_modules = ("pyiceberg", "obstore")
    #: a catalog in PostgreSQL (its DSN, password included) or behind a REST endpoint (its token)
    connections = (Connection("pg_conn_id", "dsn", env=CATALOG_URI_ENV, locates_table=True),
                   Connection("iceberg_conn_id", "iceberg-catalog", locates_table=True))
    partition_transforms = True
    maintained = True
    no_compaction = ("pyiceberg has no data-file compaction (Iceberg's rewrite_data_files runs in Spark or Flink); "
                     "expire and orphan clean-up run without it")

    def check(self, options: IcebergOptions) -> None:
        if not options.iceberg_table:
            raise ConfigError("iceberg_table", "required for the iceberg sink (namespace.table)")
        parse_identifier(options.iceberg_table)
        uri = options.iceberg_catalog_uri
        if uri is not None:
            if not uri.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg2://", "http://", "https://")):
                raise ConfigError("iceberg_catalog_uri", "must be sqlite:////path/catalog.db, postgresql://host/db "
                                                         "or a REST catalog's http(s)://host:port/path")
            if uri.startswith(("http://", "https://")) and (urlsplit(uri).username or not urlsplit(uri).hostname):
                raise ConfigError("iceberg_catalog_uri", "must be http(s)://host[:port][/path] with no credentials in "
                                                         "it (a token goes in CG_ICEBERG_CATALOG_TOKEN, or the "
                                                         "operator's iceberg_conn_id)")
            if urlsplit(uri).password:
                raise ConfigError("iceberg_catalog_uri", "must not contain a password (pass the URI in "
                                                         "CG_ICEBERG_CATALOG_URI, or pg_conn_id to the operator)")
        if options.iceberg_warehouse is not None:
            check_location("iceberg_warehouse", options.iceberg_warehouse, object_store=True, sink=self.name)
        if not options.iceberg_catalog_name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError("iceberg_catalog_name", "must be letters, digits, '_' or '-' "
                                                      f"(got {options.iceberg_catalog_name!r})")

    def open(self, options: IcebergOptions, *, transformed: bool = False) -> IcebergSink:
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        partitioning = self.partitioning(options)
        if partitioning is not None and any(f.transform != "identity" for f in partitioning.fields) \
                and importlib.util.find_spec("pyiceberg_core") is None:
            raise ConfigError("partition_by", "Iceberg partition transforms need pyiceberg-core on the driver "
                                              "and executors: pip install 'airflow-provider-cg[iceberg]'")
        uri = options.iceberg_catalog_uri or os.environ.get(CATALOG_URI_ENV)
        if not uri:
            raise ConfigError("iceberg_catalog_uri", f"required for the iceberg sink (or {CATALOG_URI_ENV})")
        if not options.iceberg_table:
            raise ConfigError("iceberg_table", "required for the iceberg sink")
        return IcebergSink(uri, options.iceberg_table, warehouse=options.iceberg_warehouse,
                           catalog_name=options.iceberg_catalog_name, partitioning=partitioning,
                           merge=self.merge(options), target_file_size=options.target_file_size)

    def asset_uri(self, options: IcebergOptions) -> str:
        """``iceberg://<catalog host or sqlite>/<namespace>/<table>``."""
        iceberg_table, catalog_uri = options.iceberg_table, options.iceberg_catalog_uri
        if not iceberg_table or "." not in iceberg_table:
            raise ValueError("iceberg_table (namespace.table) is needed for an iceberg table's asset")
        namespace, _, table = iceberg_table.rpartition(".")
        where = "sqlite" if (catalog_uri or "").startswith("sqlite") else "catalog"
        if catalog_uri and not catalog_uri.startswith("sqlite"):
            where = catalog_uri.split("://", 1)[-1].rsplit("@", 1)[-1].split("/", 1)[0] or "catalog"
        return f"iceberg://{where}/{namespace.replace('.', '/')}/{table}"

    def asset_name(self, options: IcebergOptions) -> str:
        return f"{options.iceberg_table} ({self.name}, {urlsplit(self.asset_uri(options)).netloc})"

    def asset_extra(self, options: IcebergOptions) -> dict[str, Any]:
        extra = {"iceberg_table": options.iceberg_table}
        if options.iceberg_catalog_uri:  # never a password: the contract refuses one in it
            extra["iceberg_catalog_uri"] = options.iceberg_catalog_uri
        return extra

    def dataset(self, options: IcebergOptions, table_location: tuple[str, str] | None = None,
                files_at: str | None = None) -> tuple[str, str]:
        """By the table's location, as OpenLineage's Spark integration names an Iceberg table
        (its catalog's name goes in the symlink, ``catalog_table``); by the catalog's name when
        the run found no location (it wrote nothing)."""
        return location_dataset(files_at) if files_at else self.catalog_table(options, table_location)

    def catalog_table(self, options: IcebergOptions, table_location: tuple[str, str] | None = None) -> tuple[str, str]:
        """The catalog's URI (no credentials) and the table's identifier in it. A REST catalog
        is its endpoint: ``namespace.table``, as OpenLineage's Spark integration names it. A SQL
        catalog's database holds the tables of several catalogs, keyed by name, so the name is
        ``<iceberg_catalog_name>.namespace.table``: two catalogs' tables of one name never meet.
        ``table_location``: where the catalog connection points (a PostgreSQL catalog's host and
        database, or a REST connection's URL), when ``iceberg_catalog_uri`` is not given."""
        if options.iceberg_table is None:  # (``check`` requires it)
            raise ConfigError("iceberg_table", "required for the iceberg sink")
        uri = options.iceberg_catalog_uri
        if not uri and table_location:
            where, database = table_location
            uri = where if "://" in where else f"postgresql://{where}/{database}"
        if not uri:
            return "iceberg://catalog", f"{options.iceberg_catalog_name}.{options.iceberg_table}"
        parts = urlsplit(uri)
        if "@" in parts.netloc:  # never credentials (the options refuse a password; a user name either)
            uri = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()
        if parts.scheme in ("http", "https"):
            return uri.rstrip("/"), options.iceberg_table
        return uri, f"{options.iceberg_catalog_name}.{options.iceberg_table}"

    def read_table(self, *, columns: list[str] | None = None, storage_options: dict[str, str] | None = None,
                   row_filter: Any = None, **location: Any) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        uri = location.get("iceberg_catalog_uri") or os.environ.get(CATALOG_URI_ENV)
        if not uri:
            raise ValueError("iceberg_catalog_uri: no catalog named")
        scan = SqlCatalog("default", uri=uri).load_table(location["iceberg_table"])
        return (scan.scan(selected_fields=tuple(columns)) if columns else scan.scan()).to_arrow()

    def describe(self, options: IcebergOptions) -> str:
        return str(options.iceberg_table)

    def how_to_read(self, options: IcebergOptions) -> list[str]:
        return [f"python -c \"from pyiceberg.catalog.sql import SqlCatalog; print(SqlCatalog('default', "
                f"uri='{options.iceberg_catalog_uri}').load_table('{options.iceberg_table}').scan().to_pandas())\""]

    def maintain(self, sink: Any, *, compact: bool, target_file_size: int | None, retention_hours: float
                 ) -> MaintenanceReport:
        from airflow_provider_cg.core.landing.sinks.iceberg.maintenance import maintain_iceberg

        return maintain_iceberg(sink, target_file_size, retention_hours)


KIND = Iceberg()
