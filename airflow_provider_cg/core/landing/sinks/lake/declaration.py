"""The Parquet sink's declaration: a dataset directory on the driver's disk, readable by any
Parquet reader in ``data/`` (``sinks/lake/writer.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar
from urllib.parse import quote

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.shared.declaration import SinkKind, check_location

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.lake.writer import ParquetLakeSink


@dataclass(frozen=True)
class ParquetOptions:
    sink_path: str | None = None
    target_file_size: int | None = None


def path_uri(sink_path: str | None, sink: str) -> str:
    """The Asset URI of a table at a path: ``file:///abs/path`` or ``s3://bucket/prefix``."""
    if not sink_path:
        raise ValueError(f"sink_path is needed for a {sink} table's asset")
    if "://" in sink_path:
        from urllib.parse import urlsplit

        parts = urlsplit(sink_path)
        if parts.username or parts.password:  # the contract refuses it too: never in an asset
            raise ValueError("sink_path: credentials do not belong in a table's location")
        return sink_path.rstrip("/")
    return "file://" + quote(os.path.abspath(sink_path))


def path_key(sink_path: str | None) -> tuple:
    """A table at a path, whichever sink writes it (a Parquet lake and a Delta table in one
    directory are one table)."""
    path = sink_path or ""
    return ("path", path.rstrip("/") if "://" in path else os.path.abspath(path))


class PathOptions(Protocol):
    """What a sink whose table is at a path takes, at least."""

    @property
    def sink_path(self) -> str | None: ...

    @property
    def target_file_size(self) -> int | None: ...


PathOptionsT = TypeVar("PathOptionsT", bound=PathOptions)


class PathSink(SinkKind[PathOptionsT]):
    """A sink whose table is at a path (``sink_path``): the Parquet lake, Delta."""

    location = ("sink_path",)
    object_store = False

    def check(self, options: PathOptionsT) -> None:
        if not options.sink_path:
            raise ConfigError("sink_path", f"required for the {self.name} sink")
        check_location("sink_path", options.sink_path, object_store=self.object_store, sink=self.name)

    def table_key(self, options: PathOptionsT) -> tuple:
        return path_key(options.sink_path)

    def asset_uri(self, options: PathOptionsT) -> str:
        return path_uri(options.sink_path, "delta or parquet")

    def asset_extra(self, options: PathOptionsT) -> dict[str, Any]:
        return {"sink_path": options.sink_path}



class Parquet(PathSink[ParquetOptions]):
    name = "parquet"
    options_class: ClassVar[type] = ParquetOptions

    def open(self, options: ParquetOptions, *, transformed: bool = False) -> ParquetLakeSink:
        from airflow_provider_cg.core.landing.sinks.lake.writer import ParquetLakeSink

        if not options.sink_path:
            raise ConfigError("sink_path", f"required for the {self.name} sink")
        try:
            return ParquetLakeSink(options.sink_path, target_file_size=options.target_file_size)
        except OSError as e:
            raise ConfigError("sink_path", f"cannot create the lake in {options.sink_path!r} ({e.strerror})") \
                from None

    def read_table(self, *, columns: list[str] | None = None, storage_options: dict[str, str] | None = None,
                   row_filter: Any = None, **location: Any) -> Any:
        from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed

        return read_committed(location["sink_path"], columns=columns)

    def how_to_read(self, options: ParquetOptions) -> list[str]:
        path = options.sink_path
        return [f"python -c \"import pyarrow.parquet as pq; print(pq.read_table('{path}/data').num_rows)\"",
                f"spark.read.option('mergeSchema', 'true').parquet('{path}/data')"]


KIND = Parquet()
