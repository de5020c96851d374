"""Each table format's maintenance (Delta through delta-rs, Iceberg through pyiceberg) and what
one run did; ``maintenance.py`` checks the options, opens the table and runs its sink's
(``SinkKind.maintain``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any


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
    # What a reader loads grows with the log's entries and the removed files' tombstones a
    # checkpoint keeps, not only with the live files: held to the retention (a version older
    # than it cannot be read once VACUUM removed its files), a table landed every second stays
    # as cheap to open and to commit to after a day as after its first retention period
    kept = {LOG_RETENTION: _interval(retention_hours), TOMBSTONE_RETENTION: _interval(retention_hours)}
    if any(dt.metadata().configuration.get(k) != v for k, v in kept.items()):
        _retrying(lambda: dt.alter.set_table_properties(kept), dt.update_incremental)
        dt.update_incremental()
    dt.create_checkpoint()
    report.checkpoint = True
    removed = dt.vacuum(retention_hours=int(retention_hours), dry_run=False, enforce_retention_duration=False)
    report.removed_files = len(removed)
    dt.cleanup_metadata()
    return report


#: the Delta table properties ``maintain_delta`` holds to the maintenance's retention
LOG_RETENTION, TOMBSTONE_RETENTION = "delta.logRetentionDuration", "delta.deletedFileRetentionDuration"


def _interval(hours: float) -> str:
    return f"interval {int(hours * 3600)} seconds"


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
