"""A Delta table's maintenance through delta-rs, safe beside landing members: compaction
(OPTIMIZE), the log and tombstones held to the retention, a checkpoint, VACUUM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import (
    MaintenanceReport,
    retrying_conflicts,
)

if TYPE_CHECKING:
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink


def maintain_delta(sink: DeltaLakeSink, compact: bool, target_file_size: int | None,
                   retention_hours: float) -> MaintenanceReport:
    """A Delta table's maintenance (``Delta.maintain``): see the module docstring."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    report = MaintenanceReport(sink.uri)
    try:
        dt = DeltaTable(sink.uri, storage_options=sink.storage_options or None)
    except TableNotFoundError:
        return report  # nothing landed yet
    if compact:
        metrics = retrying_conflicts(lambda: dt.optimize.compact(target_size=target_file_size),
                                     dt.update_incremental)
        report.compacted = {k: metrics.get(k) for k in ("numFilesAdded", "numFilesRemoved", "numBatches")}
        dt.update_incremental()
    # What a reader loads grows with the log's entries and the removed files' tombstones a
    # checkpoint keeps, not only with the live files: held to the retention (a version older
    # than it cannot be read once VACUUM removed its files), a table landed every second stays
    # as cheap to open and to commit to after a day as after its first retention period
    kept = {LOG_RETENTION: _interval(retention_hours), TOMBSTONE_RETENTION: _interval(retention_hours)}
    if any(dt.metadata().configuration.get(k) != v for k, v in kept.items()):
        retrying_conflicts(lambda: dt.alter.set_table_properties(kept), dt.update_incremental)
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
