"""Table maintenance that is safe beside landing: compaction, old versions and files removed.

Member jobs keep landing while this runs; the protocol (``lake.py``) reads none of what
maintenance changes: its own log, keys and staging live under ``_cg_*`` beside the table,
and a batch's position is recorded in the table (Delta's app transaction, an Iceberg table
property), which compaction and expiry keep.

- **Delta** (delta-rs): ``OPTIMIZE`` compaction toward ``target_file_size`` (a separate commit
  that replaces small files by large ones; concurrent appends rebase over it), a checkpoint,
  ``VACUUM`` of files unreferenced for ``retention_hours``, and the clean-up of log entries
  older than the table's log retention.
- **Iceberg** (pyiceberg): snapshots older than ``retention_hours`` expired (the current one
  always kept), then orphan data files (under ``data/``, in no snapshot, older than the
  retention) deleted. pyiceberg 0.12 has no data-file compaction (Iceberg's
  ``rewrite_data_files`` is Spark's or Flink's); ``compact`` is refused for Iceberg, naming it.
- **The protocol log** (both): the records, checkpoints and key files that a checkpoint older
  than the retention folded are deleted (``protocol_log.py``), so ``_cg_log/`` and ``_cg_keys/``
  stop growing with the table's age.

The retention is at least ``MIN_RETENTION_HOURS``: a member publishes a batch by copying its
files into ``data/`` and then committing them; a file is unreferenced in between, and a
shorter retention could remove it under a commit in progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.base import SinkError
from airflow_provider_cg.core.landing.sinks.protocol_log import clean_protocol_log
from airflow_provider_cg.core.landing.sinks.registry import sink_kind

MIN_RETENTION_HOURS = 1.0
DEFAULT_RETENTION_HOURS = 168.0  # Delta's own default (7 days)


@dataclass
class MaintenanceReport:
    """What one maintenance run did (numbers only: safe for logs and XCom)."""

    table: str
    compacted: dict[str, Any] = field(default_factory=dict)
    removed_files: int = 0
    expired_snapshots: int = 0
    checkpoint: bool = False
    #: what the protocol log's clean-up removed (``protocol_log.clean_protocol_log``)
    protocol_log: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "compacted": self.compacted, "removed_files": self.removed_files,
                "expired_snapshots": self.expired_snapshots, "checkpoint": self.checkpoint,
                "protocol_log": self.protocol_log, "duration_s": round(self.duration_s, 3)}


def check_maintenance(sink: str, *, compact: bool, retention_hours: float) -> None:
    """The maintenance options' rules (``ConfigError`` naming the field): the sink's own
    (``SinkKind.check_maintenance``), then the retention's."""
    kind = sink_kind(sink)
    kind.check_maintenance(compact=False)  # its tables are maintained at all
    if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float) \
            or not retention_hours >= MIN_RETENTION_HOURS:
        raise ConfigError("retention_hours", f"must be a number >= {MIN_RETENTION_HOURS:g} (a shorter one could "
                                             "remove a batch's files while a member commits them)")
    kind.check_maintenance(compact=compact)


def maintain(options: Any, *, compact: bool = True,
             retention_hours: float = DEFAULT_RETENTION_HOURS) -> MaintenanceReport:
    """Maintain the table ``options`` (``SinkOptions``) name, compacting toward its
    ``target_file_size`` (the one landing splits files at); see the module docstring."""
    if getattr(options, "routes", None) is not None:
        raise ConfigError("routes", "maintenance is of one table: give that table's own options (a route's)")
    check_maintenance(options.sink, compact=compact, retention_hours=retention_hours)
    target_file_size = options.target_file_size
    started = time.monotonic()
    sink = options.open()
    try:
        report = sink_kind(options.sink).maintain(sink, compact=compact, target_file_size=target_file_size,
                                                  retention_hours=retention_hours)
        report.protocol_log = clean_protocol_log(sink.store, retention_hours).to_dict()
    except (ConfigError, SinkError):
        raise
    except Exception as e:  # the table's library or the store: one line, no location credentials (none allowed)
        first = (str(e).splitlines() or [""])[0][:200]
        raise SinkError(f"maintenance of the {options.sink} table failed ({type(e).__name__}: {first})") from None
    finally:
        sink.close()
    report.duration_s = time.monotonic() - started
    return report


def _retrying(action, reload, attempts: int = 5):
    """``action`` again after a commit lost to a member's concurrent commit (optimistic
    concurrency of both formats: the member's commit stands, maintenance re-reads and retries)."""
    for attempt in range(attempts):
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - each library's own conflict error, by name
            if attempt == attempts - 1 or not any(w in type(e).__name__ for w in ("CommitFailed", "Conflict")):
                raise
            time.sleep(0.1 * (attempt + 1))
            reload()
    raise AssertionError("unreachable")


def maintain_delta(sink, compact: bool, target_file_size: int | None, retention_hours: float) -> MaintenanceReport:
    """A Delta table's maintenance (``registry``'s ``Delta.maintain``): see the module docstring."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    report = MaintenanceReport(sink.uri)
    try:
        dt = DeltaTable(sink.uri, storage_options=sink.storage_options or None)
    except TableNotFoundError:
        return report  # nothing landed yet
    if compact:
        metrics = _retrying(lambda: dt.optimize.compact(target_size=target_file_size), dt.update_incremental)
        report.compacted = {k: metrics.get(k) for k in ("numFilesAdded", "numFilesRemoved", "numBatches")}
        dt.update_incremental()
    dt.create_checkpoint()
    report.checkpoint = True
    removed = dt.vacuum(retention_hours=int(retention_hours), dry_run=False, enforce_retention_duration=False)
    report.removed_files = len(removed)
    dt.cleanup_metadata()
    return report


def maintain_iceberg(sink, target_file_size: int | None, retention_hours: float) -> MaintenanceReport:
    """An Iceberg table's maintenance (``Iceberg.maintain``): see the module docstring."""
    from pyarrow import fs as pafs

    report = MaintenanceReport(sink.identifier)
    tbl = sink.load_table()
    if tbl is None:
        return report
    cutoff = datetime.now(UTC) - timedelta(hours=retention_hours)
    current = tbl.current_snapshot()
    old = [s.snapshot_id for s in tbl.snapshots()
           if current is not None and s.snapshot_id != current.snapshot_id
           and s.timestamp_ms < cutoff.timestamp() * 1000]
    if old:
        state = {"tbl": tbl}

        def reload() -> None:
            state["tbl"] = sink.load_table()

        _retrying(lambda: state["tbl"].maintenance.expire_snapshots().by_ids(old).commit(), reload)
        report.expired_snapshots = len(old)
        tbl = sink.load_table()
    referenced = set(tbl.inspect.all_files().column("file_path").to_pylist()) if tbl.snapshots() else set()
    store, data = sink.store, sink.DATA_PREFIX.rstrip("/")
    try:
        infos = store.filesystem().get_file_info(pafs.FileSelector(store.file_path(data), recursive=True,
                                                                     allow_not_found=True))
    except FileNotFoundError:
        infos = []
    root = store.file_path("").rstrip("/")
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        rel = info.path[len(root):].lstrip("/") if info.path.startswith(root) else None
        if rel is None or store.uri(rel) in referenced:
            continue
        if info.mtime is not None and info.mtime.replace(tzinfo=info.mtime.tzinfo or UTC) > cutoff:
            continue
        store.filesystem().delete_file(info.path)
        report.removed_files += 1
    return report
