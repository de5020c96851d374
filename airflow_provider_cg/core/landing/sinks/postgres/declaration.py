"""The PostgreSQL sink's declaration: a table in the database of ``CG_PG_DSN`` (the
operator's ``pg_conn_id``), with the sink's own bookkeeping tables beside it
(``sinks/postgres/writer.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.shared.declaration import Connection, SinkKind
from airflow_provider_cg.core.landing.sinks.shared.identifiers import OWN_TABLES, validate_identifier

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.postgres.writer import PostgresSink

DSN_ENV, DSN_FILE_ENV = "CG_PG_DSN", "CG_PG_DSN_FILE"
@dataclass(frozen=True)
class PostgresOptions:
    pg_table: str = "cg_events"
    merge_keys: str | None = None
    delete_when: str | None = None


def dsn_from_env() -> str:
    """The DSN from ``CG_PG_DSN`` or the file ``CG_PG_DSN_FILE`` names (never an argument)."""
    dsn = os.environ.get(DSN_ENV)
    if not dsn and os.environ.get(DSN_FILE_ENV):
        try:
            with open(os.environ[DSN_FILE_ENV], encoding="utf-8") as f:
                dsn = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(DSN_FILE_ENV, f"cannot read the file it names ({type(e).__name__})") from None
    if not dsn:
        raise ConfigError(DSN_ENV, f"the PostgreSQL sink needs a DSN in {DSN_ENV} or {DSN_FILE_ENV}")
    return dsn


class Postgres(SinkKind[PostgresOptions]):
    name = "postgres"
    options_class = PostgresOptions
    location = ("pg_table",)
    connections = (Connection("pg_conn_id", "dsn", env=DSN_ENV, required=True, locates_table=True),)
    has_asset = False

    def check(self, options: PostgresOptions) -> None:
        validate_identifier("pg_table", options.pg_table)
        if options.pg_table in OWN_TABLES:
            raise ConfigError("pg_table", f"{options.pg_table!r} is one of the sink's own tables "
                                          f"({', '.join(OWN_TABLES)})")

    def open(self, options: PostgresOptions, *, transformed: bool = False) -> PostgresSink:
        from airflow_provider_cg.core.landing.sinks.postgres.writer import PostgresSink

        return PostgresSink(dsn_from_env(), table=options.pg_table, transformed=transformed,
                            merge=self.merge(options))

    def asset_uri(self, options: PostgresOptions) -> str:
        return f"postgres:///{options.pg_table or PostgresOptions.pg_table}"

    def dataset(self, options: PostgresOptions, table_location: tuple[str, str] | None = None,
                files_at: str | None = None) -> tuple[str, str]:
        where, db = table_location or ("localhost:5432", "postgres")
        table = options.pg_table if "." in (options.pg_table or "") else f"public.{options.pg_table}"
        return f"postgres://{where}", f"{db}.{table}"


KIND = Postgres()
