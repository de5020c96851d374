"""Example DAG 3 (dags/cg_backfill.py) against a real nats-server and spark-submit: each data
interval lands exactly the origin messages stamped inside it, with the rows live consumption
lands; re-running an interval adds nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.run.backfill import _ns
from airflow_provider_cg.core.landing.run.member import run_member_batch
from tests.integration.test_backfill import COMPARED, ts_ns
from tests.support.nats import run_with_nats

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 3.0  # seconds per data interval


def _publish_through(settings, t0: dt.datetime, until: dt.datetime) -> dict[int, int]:
    """Create the group; publish every 50 ms from before ``t0`` until ``until``; {seq: ts ns}."""

    async def go(nc):
        api = JsApi(nc)
        await api.add_stream({"name": "O", "subjects": ["orders.>"], "storage": "file"})
        cfg = ElasticGroupConfig(4, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2"))
        await ConsumerGroups(nc).create("O", "g", cfg)
        i = 0
        while dt.datetime.now(dt.UTC) < until:
            headers = {"X-I": str(i)} if i % 4 == 0 else None
            item = (f"orders.c{i % 11}", f"{i}".encode(), headers) if headers else (f"orders.c{i % 11}", f"{i}".encode())
            await publish_many(nc, [item])
            i += 1
            await asyncio.sleep(0.05)
        last = (await api.stream_info("O"))["state"]["last_seq"]
        return {q: ts_ns((await api.get_msg("O", q))["time"]) for q in range(1, last + 1)}

    return run_with_nats(settings, go)


def _interval(dag_id: str, run_id: str) -> tuple[dt.datetime, dt.datetime]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        dr = s.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).one()
        return dr.data_interval_start, dr.data_interval_end


def _asset_events(uri: str) -> list:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as s:
        rows = s.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                         .where(AssetModel.uri == uri)).all()
        return [dict(r.extra or {}) for r in rows]


def _rows(path) -> dict[int, dict]:
    from airflow_provider_cg.core.landing.sinks import read_committed

    table = read_committed(path)
    rows = table.select(COMPARED).to_pylist()
    assert len({r["origin_seq"] for r in rows}) == len(rows), "duplicate rows"
    return {r["origin_seq"]: r for r in rows}


def test_backfill_dag_lands_each_interval_exactly_once(airflow_env, nats_conn_id, nats_settings, spark_env, example_dag,
                                                       tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    t0 = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).replace(microsecond=0)
    for k, v in {"STREAM": "O", "GROUP": "g", "NATS_CONN_ID": nats_conn_id, "SPARK_CONN_ID": spark_env,
                 "SINK_PATH": str(lake), "START_DATE": t0.isoformat(), "INTERVAL_SECONDS": str(INTERVAL),
                 # compared row by row with live consumption's rows: landed as read, into Parquet
                 "SINK": "parquet", "PAYLOAD_FORMAT": "raw", "TRANSFORM": "none"}.items():
        monkeypatch.setenv(f"CG_BACKFILL_{k}", v)
    times = _publish_through(nats_settings, t0, t0 + dt.timedelta(seconds=2 * INTERVAL + 1))
    dag = example_dag("cg_backfill.py").dag

    # Live consumption into a table of its own first: a backfill lands what the group has
    # passed (messages still pending behind the window are left to the members, in order).
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    live_lake = tmp_path / "live"

    async def live(nc):
        for m in ("m1", "m2"):
            opts = BatchOptions(stream="O", group="g", member=m, standby_timeout=10, idle_timeout=1)
            await run_member_batch(nc, ParquetLakeSink(live_lake, fsync=False), opts)

    run_with_nats(nats_settings, live)

    expected: set[int] = set()
    for k in (1, 2):
        started = time.monotonic()
        result = airflow_env.run_dag(dag, logical_date=t0 + dt.timedelta(seconds=k * INTERVAL))
        assert result.state == "success", result.ti_states
        start, end = _interval(dag.dag_id, result.run_id)
        assert (start, end) == (t0 + dt.timedelta(seconds=(k - 1) * INTERVAL), t0 + dt.timedelta(seconds=k * INTERVAL))
        window = {q for q, t in times.items() if _ns(start) <= t < _ns(end)}
        assert len(window) > 20
        summary = result.xcom("backfill")
        assert (summary["result"], summary["rows_written"], summary["messages_read"]) == ("committed", len(window), len(window))
        expected |= window
        assert set(_rows(lake)) == expected, f"interval {k} ({time.monotonic() - started:.1f}s)"
    # Messages before the first and after the last interval were not touched.
    assert min(times) not in expected and max(times) not in expected

    # Re-running the first interval adds nothing: the task is skipped (no row written), so it
    # emits no asset event and nothing scheduled on the table runs for it
    before = _rows(lake)
    events_before = len(_asset_events(f"file://{lake}"))
    assert events_before == 2
    again = airflow_env.run_dag(dag, logical_date=t0 + dt.timedelta(seconds=INTERVAL))
    assert again.state == "success" and again.state_of("backfill") == "skipped", again.ti_states
    summary = again.xcom("backfill")
    assert summary["rows_written"] == 0 and summary["duplicates_skipped"] == summary["messages_read"] > 0
    assert _rows(lake) == before
    assert len(_asset_events(f"file://{lake}")) == events_before

    # A window after the last message is skipped before any Spark starts.
    empty = airflow_env.run_dag(dag, logical_date=t0 + dt.timedelta(seconds=5 * INTERVAL))
    assert empty.state == "success" and empty.state_of("backfill") == "skipped", empty.ti_states
    assert empty.xcom("backfill")["stop_reason"] == "no messages in the window: Spark not started"

    # A manual run's params choose the window: here an empty one, over a data interval that is not.
    after = dt.datetime.fromtimestamp(max(times.values()) / 1e9 + 1, dt.UTC)
    manual = airflow_env.run_dag(dag, logical_date=t0 + dt.timedelta(seconds=INTERVAL), run_conf={
        "window_start": after.isoformat(), "window_end": (after + dt.timedelta(hours=1)).isoformat()})
    assert manual.state_of("backfill") == "skipped", manual.ti_states
    assert manual.xcom("backfill")["window_start"] == after.isoformat()
    assert _rows(lake) == before

    # Live consumption landed the same rows for these messages.
    live_rows = _rows(live_lake)
    assert set(live_rows) == set(times)
    assert {q: live_rows[q] for q in expected} == before
