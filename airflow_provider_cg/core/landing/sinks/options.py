"""Where the batches land and how the table is shaped (``SinkOptions``), and how one landing
routes its rows into several tables (``Routes``): one type for the member job, the operator,
``cg``, assets and lineage. Each option's rules are the sink's that takes it
(``registry.py``); what they share is ``check_sink``'s. Light: no table library is imported
here (the tables are opened by ``opening.py``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.fields import check_fields, converted, flag, option
from airflow_provider_cg.core.landing.sinks.registry import option_owners, sink_kind, sink_names
from airflow_provider_cg.core.landing.sinks.shared.declaration import SinkKind

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import Column

#: the registered sinks (``sinks/registry.py``; each declared in its family's ``declaration.py``)
SINKS = sink_names()
MIN_TARGET_FILE_SIZE = 1 << 20


@dataclass(frozen=True)
class SinkOptions:
    """Where the batches land and how the table is shaped: one type for the member job, the
    operator, ``cg`` (its sink flags are generated from these fields), assets and lineage.
    Each sink declares the options it takes (``sinks/registry.py``); one given to another sink
    is refused, naming it. No option carries a secret: credentials come from the environment (``opening.py``)."""

    sink: str = option("parquet", str, "where the batches land", SINKS)
    sink_path: str | None = option(help="the Parquet sink's dataset directory, or the Delta table's location (a path "
                                 "or s3://bucket/prefix; object-store credentials come from AWS_* environment)")
    pg_table: str = option("cg_events", str, "target table of the PostgreSQL sink")
    iceberg_table: str | None = option(help="the Iceberg sink's table, namespace.table")
    iceberg_catalog_uri: str | None = option(help="the Iceberg catalog: SQL, sqlite:////path/catalog.db or "
                                           "postgresql://host/db without a password (with one: CG_ICEBERG_CATALOG_URI), "
                                           "or REST, http(s)://host:port/path (its token or client credentials from "
                                           "CG_ICEBERG_CATALOG_TOKEN / CG_ICEBERG_CATALOG_CREDENTIAL)")
    iceberg_warehouse: str | None = option(help="where the Iceberg sink creates its table if missing (a path or "
                                         "s3://bucket/prefix)")
    iceberg_catalog_name: str = option("default", str, "the Iceberg catalog's name: a SQL catalog keys its rows by "
                                     "it, so other engines see the table only under the name they use")
    partition_by: str | None = option(help="partitioning of a table the sink creates, comma-separated: Delta takes "
                                    "columns (order_date, region); Iceberg also day(ts), hour(ts), month(ts), "
                                    "year(ts), bucket(16, id), truncate(4, name). A column may be one your "
                                    "transformation derives; an existing table partitioned otherwise is refused")
    target_file_size: int | None = option(None, int, "bytes a data file the job writes may hold at most (at least "
                                        "1048576): a batch (of a partition) larger than this lands as several files "
                                        "of about this size; smaller ones stay one file each, and `cg maintain "
                                        "--target-file-size` compacts them", positive=True)
    merge_keys: str | None = option(help="upsert by these columns (comma-separated): the latest record of a key, by "
                                  "origin order, replaces the table's row; never an older one over a newer one")
    delete_when: str | None = option(help="with merge_keys: the tombstone rule, column = 'text' | <integer> | "
                                   "true|false (e.g. op = 'd'): a matching record deletes its key")
    routes: str | None = option(help="land into several tables, each exactly once: a JSON object of routes, "
                              '{"<route>": {<sink options of its table>, "subjects": [...]}}; every option not '
                              "given by a route is the one given here, but for the table's location "
                              "(sink_path, iceberg_table, pg_table), which each route names", kind=dict)
    route_by: str | None = option(help="with routes: the column of the rows (or of the transformation's output) "
                                "whose value names each row's route; without it, each route lands the messages "
                                "of its subjects")

    def __post_init__(self) -> None:
        check_fields(self)
        check_sink(self)

    @classmethod
    def of(cls, values: Any) -> SinkOptions:
        """The sink options of a ``MemberJobSpec`` (or any object or mapping carrying them)."""
        get = values.get if isinstance(values, Mapping) else (lambda k: getattr(values, k, None))
        given: dict[str, Any] = {f.name: get(f.name) for f in dataclasses.fields(cls) if get(f.name) is not None}
        return cls(**given)

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> SinkOptions:
        """Sink options from text or typed values (``None`` is the default)."""
        return cls(**converted(values, cls, "a sink option"))

    def given(self) -> dict[str, Any]:
        """The options not at their default (what a command line or an asset needs)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(SinkOptions)
                if getattr(self, f.name) is not None and getattr(self, f.name) != f.default}

    def tables(self) -> list[tuple[str | None, SinkOptions]]:
        """The tables these options land into: ``(None, self)``, or each route's name and options."""
        if self.routes is None:
            return [(None, self)]
        return [(r.name, r.options) for r in Routes.parse(self).routes]

    @property
    def kind(self) -> SinkKind[Any]:
        """The sink's declaration (``sinks/registry.py``): everything a layer asks of it."""
        return sink_kind(self.sink)

    @property
    def sink_kinds(self) -> frozenset[str]:
        """The sinks of the tables these options land into (a routed landing may mix them)."""
        return frozenset(options.sink for _, options in self.tables())


#: the sink options' names, as every layer spells them
SINK_FIELDS = tuple(f.name for f in dataclasses.fields(SinkOptions))
#: the options of one table (what a route gives, what ``cg maintain`` takes): all but the routing
TABLE_FIELDS = tuple(f for f in SINK_FIELDS if f not in ("routes", "route_by"))


def add_sink_arguments(parser: argparse.ArgumentParser, *, sink_help: str | None = None) -> None:
    """Every sink option as a flag of ``parser`` (``cg lag --sink ...``), from ``SinkOptions``."""
    for f in dataclasses.fields(SinkOptions):
        meta = f.metadata
        text = sink_help if f.name == "sink" and sink_help else meta["help"]
        owners = option_owners(f.name)
        if owners:
            text += f" [{', '.join(owners)}]"
        parser.add_argument(flag(f.name), dest=f.name, metavar=f.name.upper(), default=None,
                            choices=meta["choices"], help=text)


def sink_options_from_args(ns: argparse.Namespace) -> SinkOptions | None:
    """The sink options a command line gave (``add_sink_arguments``), or None without ``--sink``."""
    values = {name: getattr(ns, name, None) for name in SINK_FIELDS}
    if values["sink"] is None:
        extra = next((n for n in SINK_FIELDS if values[n] is not None), None)
        if extra:
            raise ConfigError(extra, "needs --sink (the sink it belongs to)")
        return None
    return SinkOptions.build(values)


def check_sink(spec: Any) -> None:
    """The rules of the sink options (``SinkOptions``' fields of ``spec``), for the member job,
    the operator and ``cg lag --sink`` alike."""
    if spec.route_by is not None and spec.routes is None:
        raise ConfigError("route_by", "needs routes (the tables a row's route names)")
    if spec.routes is not None:  # each route's options are checked as a table's own
        Routes.parse(spec)
        return
    kind = sink_kind(spec.sink)
    for f in dataclasses.fields(SinkOptions):
        owners = option_owners(f.name)
        value = getattr(spec, f.name)
        if owners and spec.sink not in owners and value is not None and value != f.default:
            raise ConfigError(f.name, f"is an option of the {' and '.join(owners)} sink"
                                      f"{'s' if len(owners) > 1 else ''}, not of {spec.sink}")
    typed = kind.typed(spec)
    kind.partitioning(typed)
    if spec.target_file_size is not None and spec.target_file_size < MIN_TARGET_FILE_SIZE:
        raise ConfigError("target_file_size", f"must be at least {MIN_TARGET_FILE_SIZE} bytes (1 MiB): smaller "
                                              "files cost readers more than they gain")
    if spec.delete_when is not None and spec.merge_keys is None:
        raise ConfigError("delete_when", "needs merge_keys (a tombstone deletes a key's row)")
    kind.merge(spec)
    kind.check(typed)  # the sink's own rules (where its table is)


# --- routes: one landing into several tables (``routing.py`` lands them) ----------------------

ROUTE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
MAX_ROUTES = 16
#: where each sink option says which table a route is (never inherited from the top level)
LOCATION_FIELDS = ("sink_path", "iceberg_table", "pg_table")
#: what a route's entry may hold besides its sink options
SUBJECTS = "subjects"
ROUTING_FIELDS = ("routes", "route_by")


@dataclass(frozen=True)
class Route:
    """One table of a routed landing: its name, its sink options, the subjects it takes (none:
    rows are routed by ``route_by``)."""

    name: str
    options: Any  # SinkOptions
    subjects: tuple[str, ...] = ()

    @property
    def regex(self) -> str:
        from airflow_provider_cg.core.groups.names import subjects_regex

        return subjects_regex(self.subjects)


@dataclass(frozen=True)
class Routes:
    """The routes of a landing (``SinkOptions.routes``) and how rows find theirs."""

    routes: tuple[Route, ...]
    route_by: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.routes)

    def route(self, name: str) -> Route:
        return next(r for r in self.routes if r.name == name)

    @classmethod
    def parse(cls, top: Any) -> Routes:
        """The routes of the sink options ``top`` (a ``SinkOptions`` with ``routes``): each
        route's options are ``top``'s, but for the table's location, overridden by its own.
        ``ConfigError`` names ``routes.<route>.<option>``."""
        try:
            entries = json.loads(top.routes) if isinstance(top.routes, str) else top.routes
        except json.JSONDecodeError as e:
            raise ConfigError("routes", f"not JSON ({e.msg} at character {e.pos})") from None
        if not isinstance(entries, dict) or not entries:
            raise ConfigError("routes", 'must be an object of routes: {"<route>": {"sink_path": ...}, ...}')
        if len(entries) > MAX_ROUTES:
            raise ConfigError("routes", f"at most {MAX_ROUTES} routes (got {len(entries)})")
        for f in LOCATION_FIELDS:
            default = SinkOptions.__dataclass_fields__[f].default
            if getattr(top, f) is not None and getattr(top, f) != default:
                raise ConfigError(f, f"with routes, each route names its own table (routes.<route>.{f})")
        inherited = {f.name: getattr(top, f.name) for f in dataclasses.fields(SinkOptions)
                     if f.name not in (*LOCATION_FIELDS, *ROUTING_FIELDS) and getattr(top, f.name) is not None}
        routes: list[Route] = []
        tables: dict[tuple, str] = {}
        for name, entry in entries.items():
            where = f"routes.{name}"
            if not isinstance(name, str) or not ROUTE_NAME.match(name):
                raise ConfigError("routes", f"route name {name!r}: letters, digits, '_' and '-', at most 64")
            if not isinstance(entry, dict):
                raise ConfigError(where, "must be an object of sink options (and subjects)")
            unknown = [k for k in entry if k not in SinkOptions.__dataclass_fields__ and k != SUBJECTS
                       or k in ROUTING_FIELDS]
            if unknown:
                raise ConfigError(f"{where}.{unknown[0]}", "is not an option of a route (a sink option, or subjects)")
            subjects = _subjects(f"{where}.{SUBJECTS}", entry.get(SUBJECTS))
            own = {k: v for k, v in entry.items() if k != SUBJECTS}
            try:
                options = SinkOptions.build({**inherited, **own})
                check_sink(options)
            except ConfigError as e:
                raise ConfigError(f"{where}.{e.field}", e.rule) from None
            table = _table_key(options)
            if table in tables:
                raise ConfigError(f"{where}", f"lands into the same table as route {tables[table]!r}")
            tables[table] = name
            routes.append(Route(name, options, subjects))
        by = top.route_by
        if by is not None:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", by):
                raise ConfigError("route_by", f"must be a column name (got {by!r})")
            with_subjects = next((r for r in routes if r.subjects), None)
            if with_subjects:
                raise ConfigError(f"routes.{with_subjects.name}.subjects", "give route_by or each route's subjects, "
                                                                           "not both")
        else:
            without = next((r for r in routes if not r.subjects), None)
            if without:
                raise ConfigError(f"routes.{without.name}.subjects", "required without route_by (the subjects whose "
                                                                     "messages this route lands)")
        return cls(tuple(routes), by)

    # --- rows (the driver's path) ----------------------------------------------------------

    def split(self, table: pa.Table) -> dict[str, np.ndarray]:
        """Per route, the mask of the rows it takes (numpy booleans)."""
        import pyarrow.compute as pc

        if self.route_by is not None:
            col = table.column(self.route_by)
            return {r.name: pc.fill_null(pc.equal(col, r.name), False).to_numpy(zero_copy_only=False)
                    for r in self.routes}
        subjects = table.column("subject")
        return {r.name: pc.fill_null(pc.match_substring_regex(subjects, r.regex), False).to_numpy(zero_copy_only=False)
                for r in self.routes}

    def unrouted_reason(self, value: Any = None) -> str:
        if self.route_by is not None:
            return (f"column {self.route_by!r}: names no route ({value!r}; the routes are "
                    f"{', '.join(self.names)})")
        return "subject: matches no route's subjects"

    # --- Spark --------------------------------------------------------------------------------

    def unrouted_column(self, columns: list[str]) -> Column | None:
        """Why a row (``route_by``) or message (subjects) has no route, as a Spark column (None:
        the column to route by is not there; the route's schema check names it)."""
        from pyspark.sql import functions as F

        if self.route_by is not None:
            if self.route_by not in columns:
                return None
            col = F.col(self.route_by)
            shown = F.when(col.isNull(), F.lit("None")).otherwise(F.concat(F.lit("'"), col.cast("string"), F.lit("'")))
            return F.when(col.isNull() | ~col.isin(*self.names), F.concat(
                F.lit(f"column {self.route_by!r}: names no route ("), shown,
                F.lit(f"; the routes are {', '.join(self.names)})")))
        if "subject" not in columns:
            return None
        anywhere = "|".join(f"(?:{r.regex})" for r in self.routes)
        return F.when(~F.coalesce(F.col("subject").rlike(anywhere), F.lit(False)),
                      F.lit(self.unrouted_reason()))

    def takes(self, name: str) -> Column:
        """The Spark condition of a route's rows (``route_by``) or messages (subjects)."""
        from pyspark.sql import functions as F

        route = self.route(name)
        if self.route_by is not None:
            return F.col(self.route_by) == F.lit(name)
        return F.coalesce(F.col("subject").rlike(route.regex), F.lit(False))


def _subjects(field: str, value: Any) -> tuple[str, ...]:
    from airflow_provider_cg.core.groups.names import validate_subject

    if value is None:
        return ()
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ConfigError(field, "must be a list of subjects (NATS wildcards * and > allowed)")
    return tuple(validate_subject(field, s) for s in items)


def _table_key(options: Any) -> tuple:
    """Which table sink options name (two routes into one table are refused)."""
    kind = sink_kind(options.sink)
    return kind.table_key(kind.typed(options))
