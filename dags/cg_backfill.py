"""Example DAG 3: scheduled backfill of a consumer group from its origin stream.

One spark-submit of the member job in backfill mode re-reads the origin stream's messages
whose stream timestamp lies in a window and lands them as example DAG 1 does (the same
transformation into the same ``paid_orders`` table: one shape per table). The window is the
run's data interval ``[data_interval_start, data_interval_end)``, or the params
``window_start`` / ``window_end`` of a manual run::

    airflow dags trigger cg_backfill -c '{"window_start": "2026-11-20T09:00:00Z", "window_end": "2026-11-20T10:00:00Z"}'

It runs only the windows you ask for: ``catchup=False`` (unpausing it lands the hour that
just ended, then one hour per hour, never a run per hour since a past start date), and the
past is backfilled on request::

    airflow backfill create --dag-id cg_backfill --from-date 2026-11-20T00:00 --to-date 2026-11-21T00:00

A window without messages, or a group that does not exist yet (this DAG unpaused before
``cg_scheduled_consumption`` created it), is skipped before any Spark starts.

What is guaranteed, beside the live members of ``cg_scheduled_consumption`` landing into the
same table: every paid order of the window is in the table once, and each order's effect
once (no writer commits an input another writer committed: a batch that finds some of its
inputs landed meanwhile is rolled back and computed again without them). Re-running a window,
overlapping windows, replays after ``cg reset`` and concurrent live consumption all end so.
Per-key order holds too: the backfill lands only what the group has passed, and leaves to the
members the messages still pending in a partition whose position lags behind the window
(``left_to_members`` in its summary); they land them in order. A backfill acknowledges
nothing: live members' backlogs are untouched. An origin stream deleted and created again
under the same name is refused until ``stream_life`` says what it is (see docs/concepts/exactly-once.md). The schedule is a timetable with
data intervals (``CronDataIntervalTimetable``): Airflow 3 gives plain cron and timedelta
schedules zero-length intervals.

Settings come from environment variables (the schedule is fixed when the file is parsed):
``CG_BACKFILL_STREAM``, ``CG_BACKFILL_GROUP``, ``CG_BACKFILL_NATS_CONN_ID``,
``CG_BACKFILL_SPARK_CONN_ID``, ``CG_BACKFILL_START_DATE`` (ISO 8601, default
2026-01-01T00:00Z: the earliest window ``airflow backfill create`` may ask for),
``CG_BACKFILL_INTERVAL_SECONDS`` (a fixed interval instead of ``@hourly``, e.g. for demos and
tests) and the table's (``CG_BACKFILL_SINK``, ``..._SINK_PATH``,
``..._PAYLOAD_FORMAT``, ``..._TRANSFORM``, ``..._AWS_CONN_ID``: see
``airflow_provider_cg.examples.orders_landing``).
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, Param

try:  # Airflow 3.1+: the Task SDK's timetables
    from airflow.sdk.definitions.timetables.interval import (
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )
except ImportError:  # pragma: no cover
    from airflow.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable

from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, orders_landing
from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

DAG_ID = "cg_backfill"


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CG_BACKFILL_{name}") or default


def _start_date() -> dt.datetime:
    value = dt.datetime.fromisoformat(_env("START_DATE", "2026-01-01T00:00:00+00:00").replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _schedule():
    """Timetables *with data intervals*: Airflow 3 gives a plain ``"@hourly"`` or timedelta
    schedule zero-length intervals (``data_interval_start == data_interval_end``)."""
    seconds = _env("INTERVAL_SECONDS", "")
    if seconds:
        return DeltaDataIntervalTimetable(dt.timedelta(seconds=float(seconds)))
    return CronDataIntervalTimetable("@hourly", timezone="UTC")


with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Scheduled backfill: re-read each data interval of the origin stream into the sink, idempotently",
    schedule=_schedule(),
    start_date=_start_date(),
    catchup=False,  # only the windows asked for: no run per hour since start_date on unpause
    max_active_runs=4,  # windows are independent (each has its own sink batch ids)
    params={
        "window_start": Param(None, type=["null", "string"], format="date-time",
                              description="a manual run's window start (default: the data interval's)"),
        "window_end": Param(None, type=["null", "string"], format="date-time",
                            description="a manual run's window end, exclusive (default: the data interval's)"),
    },
    tags=["nats", "consumer-groups", "spark", "backfill", "example"],
    doc_md=__doc__,
) as dag:
    ConsumerGroupSparkSubmitOperator(
        task_id="backfill",
        stream=_env("STREAM", "ORDERS"),
        group=_env("GROUP", "orders-lake"),
        backfill_start="{{ params.window_start or data_interval_start.isoformat() }}",
        backfill_end="{{ params.window_end or data_interval_end.isoformat() }}",
        skip_missing_group=True,  # unpaused before cg_scheduled_consumption created the group: nothing to do yet
        **orders_landing("CG_BACKFILL_"),
        nats_conn_id=_env("NATS_CONN_ID", "nats_default"),
        conn_id=_env("SPARK_CONN_ID", "spark_default"),
    )
