"""What a sink declares (``SinkKind``): each sink does in its family's ``declaration.py``
(``sinks/<family>/``), and every layer asks the registry (``registry.py``) instead of comparing sink names.

A ``SinkKind`` gives its name, its options (one typed options class, a frozen dataclass whose
fields are the ``SinkOptions`` it takes), their rules, how it opens, which Airflow connections
its credentials come from, its Asset URI and lineage dataset, how a reader without Spark reads
its table, and its maintenance. The declarations import nothing heavy: the contract, the
operator and ``cg`` load them in the scheduler and the CLI; the table code is imported by
``open`` and the readers only.

Adding a sink: a family folder under ``sinks/`` with its ``declaration.py`` (its ``SinkKind``),
its writer, its tests, and one line in ``registry.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar
from urllib.parse import unquote, urlsplit

from airflow_provider_cg.core.errors import ConfigError

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import MaintenanceReport
    from airflow_provider_cg.core.landing.sinks.shared.merging import MergeSpec
    from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink


@dataclass(frozen=True)
class Connection:
    """An Airflow connection a sink's credentials come from: the operator's parameter that
    names it, and what the member job's environment gets from it (``hooks/spark_submit.py``):
    ``dsn`` (a PostgreSQL DSN into ``env``) or ``iceberg-catalog`` (a REST catalog's URI and
    token). ``locates_table``: the connection's host and database are where the table is
    (lineage)."""

    param: str
    gives: str
    env: str | None = None
    required: bool = False
    locates_table: bool = False


def location_dataset(location: str) -> tuple[str, str]:
    """``(namespace, name)`` of a table at a location, as OpenLineage names storage: ``file`` and
    the plain path (the quoting a URI adds is not part of it), or ``scheme://bucket`` and the key."""
    parts = urlsplit(location if "://" in location else f"file://{location}")
    if parts.scheme == "file":
        return "file", unquote(parts.path)
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


#: a sink's typed options class (``SinkKind.options_class``)
OptionsT = TypeVar("OptionsT")


class SinkKind(Generic[OptionsT]):
    """One sink's declaration (see the module docstring), generic over its typed options class:
    every method that takes options takes that class (``typed`` makes it from ``SinkOptions``,
    or anything carrying its fields); subclasses set the class variables and override what
    differs."""

    name: ClassVar[str]
    #: the typed options class: a frozen dataclass of the ``SinkOptions`` fields this sink takes
    options_class: ClassVar[type]
    #: the options that name a table of this sink (each route of a routed landing gives its own)
    location: ClassVar[tuple[str, ...]]
    #: Python modules the driver needs to open it, and the extra that installs them
    driver_modules: ClassVar[tuple[str, ...]] = ()
    #: Airflow connections its credentials come from, in the order they are preferred
    connections: ClassVar[tuple[Connection, ...]] = ()
    #: its table is a file or catalog table an engine reads (an Airflow Asset); PostgreSQL's is not
    has_asset: ClassVar[bool] = True
    #: ``partition_by`` takes Iceberg's transforms (``day(ts)``, ``bucket(16, id)``), not only columns
    partition_transforms: ClassVar[bool] = False
    #: ``cg maintain`` and the maintenance operator work on its tables; ``compacts``: data files too
    maintained: ClassVar[bool] = False
    compacts: ClassVar[bool] = False
    #: why ``compact`` is refused for a maintained sink that does not compact
    no_compaction: ClassVar[str] = "its tables are not compacted"

    @classmethod
    def option_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls.options_class))

    def typed(self, options: Any) -> OptionsT:
        """This sink's typed options, from ``SinkOptions`` (or anything carrying its fields)."""
        return self.options_class(**{f: getattr(options, f) for f in self.option_fields()})

    # --- rules and opening ------------------------------------------------------------------

    def check(self, options: OptionsT) -> None:
        """The rules of this sink's own options, where its table is (``ConfigError`` naming the
        field); the rules all sinks share (partitioning, merge, file size) are
        ``options.check_sink``'s."""

    def needs_modules(self) -> None:
        """``ConfigError`` naming the extra to install when the driver lacks a module it needs."""
        for module in self.driver_modules:
            if importlib.util.find_spec(module) is None:
                raise ConfigError("sink", f"the {self.name} sink needs {module} on the driver: "
                                          f"pip install 'airflow-provider-cg[{self.name}]'")

    def open(self, options: OptionsT, *, transformed: bool = False) -> TwoPhaseSink:
        """The two-phase sink of one table (``ConfigError`` naming the field when it cannot be
        opened as asked)."""
        raise NotImplementedError

    def partitioning(self, options: OptionsT) -> Partitioning | None:
        """The table's partitioning as ``partition_by`` asks (None without it)."""
        partition_by = getattr(options, "partition_by", None)  # (not every sink's options have it)
        if partition_by is None:
            return None
        from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning

        return Partitioning.parse(partition_by, self.name, transforms=self.partition_transforms)

    @staticmethod
    def merge(options: Any) -> MergeSpec | None:
        """The upsert ``merge_keys`` / ``delete_when`` ask for (None without merge keys)."""
        if getattr(options, "merge_keys", None) is None:
            return None
        from airflow_provider_cg.core.landing.sinks.shared.merging import MergeSpec

        return MergeSpec.parse(options.merge_keys, options.delete_when)

    # --- what other layers ask --------------------------------------------------------------

    def table_key(self, options: OptionsT) -> tuple:
        """Which table the options name (two routes into one table are refused)."""
        return (self.name, *(getattr(options, f) for f in self.location))

    def asset_uri(self, options: OptionsT) -> str:
        """The Asset URI of its table (``assets.table_uri``); ``ValueError`` when incomplete."""
        raise ValueError(f"no asset for sink {self.name!r}")

    def asset_name(self, options: OptionsT) -> str:
        """The Asset's name, for people: the table's own name first, then its format and where it
        is (``paid_orders (delta, /lake/paid_orders)``). The name is a function of the URI, one to
        one: Airflow keeps a name to one URI among active assets and fails a task whose outlet
        it cannot activate, so two tables of one name (``/lake/dev/orders``,
        ``/lake/prod/orders``) must never share one."""
        uri = self.asset_uri(options)
        parts = urlsplit(uri)
        where = unquote(parts.path) if parts.scheme == "file" else uri
        leaf = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1])
        return f"{leaf or uri} ({self.name}, {where})"

    def asset_extra(self, options: OptionsT) -> dict[str, Any]:
        """What an asset event's extra carries to find the table again (``assets.landed_rows``)."""
        return {}

    def dataset(self, options: OptionsT, table_location: tuple[str, str] | None = None,
                files_at: str | None = None) -> tuple[str, str]:
        """``(namespace, name)`` of the table in OpenLineage's naming; ``table_location``: host
        and database of a connection that ``locates_table``; ``files_at``: where the run found
        the table's files, when its catalog decides it (the summary's ``table_location``)."""
        return location_dataset(self.asset_uri(options))

    def catalog_table(self, options: OptionsT, table_location: tuple[str, str] | None = None) -> tuple[str, str] | None:
        """``(namespace, name)`` of the table in the catalog that names it, for lineage's symlink
        of type TABLE beside ``dataset``; None for a table a path names."""
        return None

    def read_table(self, *, columns: list[str] | None = None, storage_options: dict[str, str] | None = None,
                   row_filter: Any = None, **location: Any) -> Any:
        """The table as a reader without Spark sees it (a pyarrow table); ``location``: the
        fields of ``asset_extra``."""
        raise ValueError(f"cannot read a {self.name!r} table")

    def describe(self, options: OptionsT) -> str:
        """Where its table is, in a line (no secret: locations carry none)."""
        return ", ".join(str(getattr(options, f)) for f in self.location)

    def how_to_read(self, options: OptionsT) -> list[str]:
        """Commands that read its table with other tools (the demo prints them)."""
        return []

    def check_compaction(self, *, compact: bool) -> None:
        """``ConfigError`` when ``compact`` is asked of a sink whose tables are not compacted."""
        if compact and not self.compacts:
            raise ConfigError("compact", self.no_compaction)

    def maintain(self, sink: Any, *, compact: bool, target_file_size: int | None,
                 retention_hours: float) -> MaintenanceReport:
        """One maintenance run over an open sink of this kind (``sinks/maintenance.py``; only
        for a sink that is ``maintained``)."""
        raise NotImplementedError


def check_location(name: str, value: str, *, object_store: bool, sink: str) -> None:
    """A local path, or (where allowed) an ``s3://bucket/prefix`` URL without credentials."""
    parts = urlsplit(value)
    if parts.scheme in ("s3", "s3a"):
        if not object_store:
            raise ConfigError(name, f"the {sink} sink needs a local path (use the delta sink on object storage)")
        if not parts.netloc or "@" in parts.netloc:
            raise ConfigError(name, "must be s3://bucket/prefix, with no credentials in it")
    elif parts.scheme not in ("", "file") and len(parts.scheme) > 1:
        raise ConfigError(name, f"unsupported scheme {parts.scheme!r} (a local path or s3://bucket/prefix)")
