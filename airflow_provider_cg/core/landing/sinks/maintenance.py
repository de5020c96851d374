"""Table maintenance that is safe beside landing: compaction, old versions and files removed.

Member jobs keep landing while this runs; the protocol (``lake_sink.py``) reads none of what
maintenance changes: its own log, keys and staging live under ``_cg_*`` beside the table,
and a batch's position is recorded in the table (Delta's app transaction, an Iceberg table
property), which compaction and expiry keep.

- **Delta** (delta-rs): ``OPTIMIZE`` compaction toward ``target_file_size`` (a separate commit
  that replaces small files by large ones; concurrent appends rebase over it), a checkpoint,
  ``VACUUM`` of files unreferenced for ``retention_hours``, and the clean-up of log entries
  and removed files' tombstones older than it (the table's ``delta.logRetentionDuration`` and
  ``delta.deletedFileRetentionDuration`` are set to it: what a reader or a commit loads then
  stops growing with the table's age).
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
from typing import Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import clean_protocol_log
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.registry import maintained_names, sink_kind
from airflow_provider_cg.core.landing.sinks.shared.maintenance_report import MaintenanceReport
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError

MIN_RETENTION_HOURS = 1.0
DEFAULT_RETENTION_HOURS = 168.0  # Delta's own default (7 days)


def check_maintenance(sink: str, *, compact: bool, retention_hours: float) -> None:
    """The maintenance options' rules (``ConfigError`` naming the field): the sink's own
    (``SinkKind.check_maintenance``), then the retention's."""
    kind = sink_kind(sink)
    if not kind.maintained:
        raise ConfigError("sink", f"maintenance is for {' and '.join(maintained_names())} tables (got {sink!r})")
    if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float) \
            or not retention_hours >= MIN_RETENTION_HOURS:
        raise ConfigError("retention_hours", f"must be a number >= {MIN_RETENTION_HOURS:g} (a shorter one could "
                                             "remove a batch's files while a member commits them)")
    kind.check_compaction(compact=compact)


def maintain(options: Any, *, compact: bool = True,
             retention_hours: float = DEFAULT_RETENTION_HOURS) -> MaintenanceReport:
    """Maintain the table ``options`` (``SinkOptions``) name, compacting toward its
    ``target_file_size`` (the one landing splits files at); see the module docstring."""
    if getattr(options, "routes", None) is not None:
        raise ConfigError("routes", "maintenance is of one table: give that table's own options (a route's)")
    check_maintenance(options.sink, compact=compact, retention_hours=retention_hours)
    target_file_size = options.target_file_size
    started = time.monotonic()
    sink: Any = open_sink(options)  # a maintained sink is a lake table (LakeSink): its protocol log is in its store
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
