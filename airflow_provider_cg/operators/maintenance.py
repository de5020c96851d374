"""Maintenance of a landed table as an Airflow task: ``cg maintain`` beside the member jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.fields import flag
from airflow_provider_cg.core.landing.sinks.maintenance import DEFAULT_RETENTION_HOURS, check_maintenance
from airflow_provider_cg.core.landing.sinks.options import TABLE_FIELDS, SinkOptions
from airflow_provider_cg.core.landing.sinks.registry import sink_kind
from airflow_provider_cg.hooks import spark_submit
from airflow_provider_cg.lineage import MovesNoData
from airflow_provider_cg.operators.members import UI_COLOR

__all__ = ["ConsumerGroupTableMaintenanceOperator"]


class ConsumerGroupTableMaintenanceOperator(MovesNoData, BaseOperator):
    """Maintain the Delta or Iceberg table member jobs land into, while they land
    (``core/landing/sinks/maintenance.py``): Delta compaction toward ``target_file_size``, a
    checkpoint, ``VACUUM`` and log clean-up; Iceberg snapshot expiry and orphan-file clean-up.

    :param sink: the table's kind; with ``sink_path``, ``iceberg_table`` and the other sink
        options, the table, as the landing tasks' sink options (``SinkOptions``), templated.
    :param compact: compact small files (default: yes for Delta; pyiceberg has no compaction).
    :param target_file_size: the table's target file size in bytes (compaction's target; the
        member jobs split larger files at it too).
    :param retention_hours: old versions and unreferenced files kept this long (>= 1).
    :param aws_conn_id: ``aws`` connection for a table on S3-compatible storage.
    :param pg_conn_id: ``postgres`` connection of an Iceberg catalog kept in PostgreSQL.
    :param iceberg_conn_id: ``iceberg`` connection of an Iceberg REST catalog (as the landing operator's).

    Runs ``cg maintain`` in a child process whose environment carries the credentials (never
    its command line); returns what it did (files compacted and removed, snapshots expired)
    as the task's XCom. Invalid options fail the task without retries.
    """

    template_fields: Sequence[str] = (*TABLE_FIELDS, "retention_hours", "aws_conn_id",
                                      "pg_conn_id", "iceberg_conn_id")
    ui_color = UI_COLOR

    def __init__(self, *, sink: str | None = None, sink_path: str | None = None, iceberg_table: str | None = None,
                 iceberg_catalog_uri: str | None = None, iceberg_warehouse: str | None = None,
                 iceberg_catalog_name: str | None = None, partition_by: str | None = None,
                 pg_table: str | None = None, merge_keys: str | None = None, delete_when: str | None = None,
                 compact: bool | None = None, target_file_size: int | None = None,
                 retention_hours: float = DEFAULT_RETENTION_HOURS, aws_conn_id: str | None = None,
                 pg_conn_id: str | None = None, iceberg_conn_id: str | None = None, **kwargs: Any) -> None:
        params = dict(locals())  # every option of a table is a parameter of its own name
        sink_options = {name: params[name] for name in TABLE_FIELDS}
        super().__init__(**kwargs)
        for name, value in sink_options.items():
            setattr(self, name, value)
        self.compact, self.retention_hours = compact, retention_hours
        self.aws_conn_id, self.pg_conn_id, self.iceberg_conn_id = aws_conn_id, pg_conn_id, iceberg_conn_id

    def _options(self) -> tuple[SinkOptions, bool]:
        options = SinkOptions.build({k: getattr(self, k) for k in TABLE_FIELDS})
        compact = sink_kind(options.sink).compacts if self.compact is None else bool(self.compact)
        check_maintenance(options.sink, compact=compact, retention_hours=float(self.retention_hours))
        return options, compact


    def execute(self, context: Any) -> dict[str, Any]:
        try:
            options, compact = self._options()
        except (ConfigError, ValueError) as e:
            raise AirflowFailException(str(e)) from e
        argv = [sys.executable, "-m", "airflow_provider_cg.core.tools.cli", "maintain", "--json",
                "--compact" if compact else "--no-compact", "--retention-hours", str(float(self.retention_hours))]
        for name, value in options.given().items():  # the sink is one: delta and iceberg are not its default
            argv += [flag(name), str(value)]
        env = {**os.environ, **spark_submit.sink_env(options.sink, pg_conn_id=self.pg_conn_id,
                                                      iceberg_conn_id=self.iceberg_conn_id,
                                                      aws_conn_id=self.aws_conn_id)}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            message = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise (AirflowFailException if done.returncode == 1 else AirflowException)(message)
        report = json.loads(done.stdout)
        self.log.info("maintained %s: compacted %s, expired snapshots %d, removed files %d", report["table"],
                      report["compacted"] or "-", report["expired_snapshots"], report["removed_files"])
        return report
