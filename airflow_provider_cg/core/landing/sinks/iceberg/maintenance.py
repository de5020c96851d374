"""An Iceberg table's maintenance through pyiceberg, safe beside landing members: snapshots older
than the retention expired, data files no snapshot references (and older than it) removed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import (
    MaintenanceReport,
    retrying_conflicts,
)

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink


def maintain_iceberg(sink: IcebergSink, target_file_size: int | None,
                     retention_hours: float) -> MaintenanceReport:
    """An Iceberg table's maintenance (``Iceberg.maintain``): old snapshots expired, orphan files removed."""
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
            state["tbl"] = sink.load_table() or state["tbl"]

        retrying_conflicts(lambda: state["tbl"].maintenance.expire_snapshots().by_ids(old).commit(), reload)
        report.expired_snapshots = len(old)
        reloaded = sink.load_table()
        if reloaded is None:
            return report  # dropped meanwhile
        tbl = reloaded
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
