"""The shipped example DAGs are safe to unpause as shipped (no servers needed: parsed only).

What a user who unpauses one of them must not get: a run per past interval since a start
date, Spark started for nothing, two DAGs writing different shapes into one table.
"""

from __future__ import annotations

import datetime as dt
import inspect
import os

import jinja2
import pytest

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow]

LANDING = "ConsumerGroupSparkSubmitOperator"
SHAPE = ("sink", "payload_format", "json_schema", "avro_schema", "transform", "transform_sql")


@pytest.fixture
def shipped(airflow_env, monkeypatch):
    """The example DAGs as Airflow parses them, with no ``CG_*`` override in the environment."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_provider_cg.core.tools.packaging import example_dags_folder

    for name in [k for k in os.environ if k.startswith(("CG_BACKFILL_", "CG_OVERFLOW_", "CG_DEMO_"))]:
        monkeypatch.delenv(name)
    bag = DagBag(dag_folder=str(example_dags_folder()))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dags) == {"cg_scheduled_consumption", "cg_backfill", "cg_overflow_scaleout",
                             "cg_overflow_scaleout_sensor", "cg_paid_orders_report", "cg_table_maintenance",
                             "cg_follow_orders", "cg_stream_windows"}
    return bag.dags


def _landing_tasks(dag):
    for task in dag.tasks:
        if type(task).__name__ == LANDING or getattr(task, "operator_name", "") == LANDING \
                or getattr(task, "_operator_name", "") == LANDING:
            yield task


def _fields(task) -> dict:
    """The landing task's arguments as its DAG's defaults render them (mapped or not)."""
    names = (*SHAPE, "sink_path", "iceberg_table", "check_backlog")
    partial = getattr(task, "partial_kwargs", None)
    if partial is None:
        values = {k: getattr(task, k, None) for k in names}
    else:  # mapped: what partial() did not set is the operator's default
        from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

        defaults = inspect.signature(ConsumerGroupSparkSubmitOperator.__init__).parameters
        values = {k: partial[k] if k in partial else defaults[k].default for k in names}
    params = task.dag.params.dump()
    env = jinja2.Environment()
    return {k: env.from_string(v).render(params=params) if isinstance(v, str) else v for k, v in values.items()}


def test_no_dag_runs_once_per_past_interval_when_unpaused(shipped):
    from airflow.serialization.encoders import coerce_to_core_timetable  # what the scheduler runs
    from airflow.timetables.base import TimeRestriction

    now = dt.datetime.now(dt.UTC)
    for dag_id, dag in shipped.items():
        assert dag.catchup is False, f"{dag_id}: catchup would start a run per interval since its start date"
        assert dag.max_active_runs <= 4, dag_id
        restriction = TimeRestriction(earliest=dag.start_date, latest=None, catchup=dag.catchup)
        first = coerce_to_core_timetable(dag.timetable).next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
        if first is None:  # asset-scheduled or manual only
            continue
        if type(dag.timetable).__name__ == "ContinuousTimetable":  # one run at a time, however far back
            # its start date: the first run must span time, or Airflow computes the second run's
            # logical date as the first's and never starts it (docs/how-to/follow.md)
            assert first.data_interval.end > first.data_interval.start, (dag_id, first.data_interval)
            continue
        # Unpaused today, its first automatic run covers the latest interval, not one from the past.
        assert now - first.data_interval.start < dt.timedelta(days=1), (dag_id, first.data_interval)


def test_every_landing_task_checks_for_work_before_starting_spark(shipped):
    tasks = [(dag_id, t) for dag_id, dag in shipped.items() for t in _landing_tasks(dag)]
    assert {dag_id for dag_id, _ in tasks} == set(shipped) - {"cg_paid_orders_report", "cg_table_maintenance",
                                                             "cg_stream_windows"}, tasks
    for dag_id, task in tasks:
        assert _fields(task).get("check_backlog", True) is True, (dag_id, task.task_id)
    # the streaming example's queries run available-now: its tasks check too (off by default)
    (stream_task,) = [t for t in shipped["cg_stream_windows"].tasks if t.task_id == "windows"]
    assert stream_task.partial_kwargs["check_backlog"] is True


def test_one_table_one_shape(shipped):
    """Tasks that write one table write it in one shape (same decoding and transformation)."""
    tables: dict[str, dict[tuple, list[str]]] = {}
    for dag_id, dag in shipped.items():
        for task in _landing_tasks(dag):
            f = _fields(task)
            where = f.get("iceberg_table") if f.get("sink") == "iceberg" else f.get("sink_path")
            assert where, (dag_id, task.task_id, f)
            shape = tuple(f.get(k) or None for k in SHAPE)
            tables.setdefault(where, {}).setdefault(shape, []).append(f"{dag_id}.{task.task_id}")
    for where, shapes in tables.items():
        assert len(shapes) == 1, f"{where} is written in {len(shapes)} shapes: {shapes}"


def test_the_backfill_window_is_the_params_or_the_data_interval(shipped):
    dag = shipped["cg_backfill"]
    (task,) = list(_landing_tasks(dag))
    assert dag.params.dump() == {"window_start": None, "window_end": None}
    env = jinja2.Environment()
    interval = {"data_interval_start": dt.datetime(2026, 11, 20, 9, tzinfo=dt.UTC),
                "data_interval_end": dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)}
    asked = {"window_start": "2026-11-19T00:00:00Z", "window_end": "2026-11-19T06:00:00Z"}
    for params, expected in ((dag.params.dump(), ("2026-11-20T09:00:00+00:00", "2026-11-20T10:00:00+00:00")),
                             (asked, (asked["window_start"], asked["window_end"]))):
        got = tuple(env.from_string(getattr(task, f)).render(params=params, **interval)
                    for f in ("backfill_start", "backfill_end"))
        assert got == expected


def test_every_landing_task_announces_its_table_and_the_report_listens(shipped):
    """Each landing task's outlet is the table it writes (DAG 1, whose table is a param: the
    alias through which each run names the table it rendered, paid_orders by default); the
    downstream DAG is scheduled on it."""
    from airflow.sdk import AssetAlias

    from airflow_provider_cg.assets import LANDED_TABLES, table_uri
    from airflow_provider_cg.core.landing.sinks.options import SinkOptions

    outlets = {}
    for dag_id, dag in shipped.items():
        for task in _landing_tasks(dag):
            partial = getattr(task, "partial_kwargs", None)
            found = (partial.get("outlets") if partial else None) or task.outlets
            assert found, (dag_id, task.task_id)
            if dag_id == "cg_scheduled_consumption":
                assert found == [AssetAlias(LANDED_TABLES)]
                p = dag.params.dump()
                options = SinkOptions.build({"sink": p["table_format"], "sink_path": p["sink_path"]})
                found = [type("Rendered", (), {"uri": table_uri(options)})]
            outlets[dag_id] = {a.uri for a in found}
    assert len({frozenset(v) for v in outlets.values()}) == 1, outlets  # one table: paid_orders
    report = shipped["cg_paid_orders_report"]
    assert {a.uri for a in report.timetable.asset_condition.objects} == outlets["cg_backfill"]
