"""Example DAG 1 (dags/cg_scheduled_consumption.py) run with dag.test() against a real
nats-server and real spark-submit (local[*]): its default Delta table (and, on a Spark
standalone cluster, an Iceberg table chosen by the DAG's ``table_format`` parameter) ends with
exactly the published paid orders, once each, in per-key order."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from airflow_provider_cg.core.jetstream.publish import publish_many

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
N = 3000


def _publish(settings, n: int) -> None:
    async def go():
        nc = await settings.connect()
        try:
            await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
            msgs = (
                (f"orders.c{i % 97}", json.dumps({"order_id": i, "customer": f"c{i % 97}", "amount": i / 10,
                                                  "status": "cancelled" if i % 10 == 7 else "paid"}).encode())
                for i in range(n)
            )
            return await publish_many(nc, msgs)
        finally:
            await nc.close()

    assert asyncio.run(go()).published == n


def _delta_rows(path):
    from tests.support.member_job import read_delta

    return read_delta(str(path))


def _asset_event_extras(consumer_dag) -> list[dict]:
    """The extras of the asset events of the Assets ``consumer_dag`` is scheduled on."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    uris = [a.uri for a in consumer_dag.timetable.asset_condition.objects]
    with create_session() as s:
        rows = s.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                         .where(AssetModel.uri.in_(uris))).all()
        return [dict(r.extra or {}) for r in rows]


def _asset_event_names(consumer_dag) -> set[str]:
    """The names of the Assets in Airflow's database that hold the events ``consumer_dag`` reads."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    uris = [a.uri for a in consumer_dag.timetable.asset_condition.objects]
    with create_session() as s:
        return set(s.scalars(select(AssetModel.name).join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
                             .where(AssetModel.uri.in_(uris))).all())


def test_dag_lands_every_published_order_once(airflow_env, nats_conn_id, nats_settings, spark_env, example_dag,
                                             tmp_path):
    from tests.support.member_job import assert_exactly_once, delta_landed

    _publish(nats_settings, N)
    dag = example_dag("cg_scheduled_consumption.py").dag
    assert dag.params["table_format"] == "delta"  # the default
    lake = Path(dag.params["sink_path"])  # the default table, paid_orders: the report DAG's asset
    conf = {"nats_conn_id": nats_conn_id, "spark_conn_id": spark_env}
    report_dag = example_dag("cg_paid_orders_report.py").dag
    airflow_env.sync_dag(report_dag)  # scheduled on the table's Asset before anything lands
    result = airflow_env.run_dag(dag, run_conf=conf)

    assert result.state == "success", result.ti_states
    assert result.state_of("ensure_group") == "success"
    members = result.xcom("members")
    assert [m["member"] for m in members] == ["m1", "m2", "m3"]
    assert sum(m["backlog"] for m in members) == N
    for i, m in enumerate(members):
        expected = "success" if m["backlog"] else "skipped"
        assert result.state_of("consume", i) == expected
    summary = result.xcom("summarise")

    table = _delta_rows(lake)
    # the example transformation: cancelled orders dropped, amount_cents derived
    paid = [i for i in range(N) if i % 10 != 7]
    assert table.num_rows == len(paid)
    assert sorted(table.column("order_id").to_pylist()) == paid  # every paid order, once
    assert sorted(table.column("origin_seq").to_pylist()) == [i + 1 for i in paid]
    cents = dict(zip(table.column("order_id").to_pylist(), table.column("amount_cents").to_pylist(), strict=True))
    assert all(cents[i] == round(i / 10 * 100) for i in paid)
    # The summary names what it counts: messages read and landed, rows written (fewer: cancelled
    # orders are dropped by the transformation), per member and partition.
    assert summary["totals"] == {"messages_read": N, "messages_landed": N, "rows_written": len(paid),
                                 "duplicates_skipped": 0, "dead_lettered": 0}, summary["totals"]
    assert {m["member"]: sum(m["partitions"].values()) for m in summary["members"]} == \
        {m["member"]: m["backlog"] for m in members}
    assert_exactly_once(delta_landed(str(lake)), {("ORDERS", i + 1): f"c{i % 97}" for i in paid})

    # Each member's run emitted an asset event saying what it landed; the downstream DAG,
    # scheduled on the table's Asset, ran once for them and read exactly those rows.
    landed = [m["member"] for m in members if m["backlog"]]
    extras = _asset_event_extras(report_dag)
    assert sorted(e["member"] for e in extras) == landed
    assert sum(e["messages_landed"] for e in extras) == N
    assert all(e["table"] == f"file://{lake}" and e["format"] == "delta" and e["batch_ids"] for e in extras)
    assert sum(r["messages"] for e in extras for r in e["origin"]["ORDERS"].values()) == N
    # the table's Asset is named for people, the same in the landing DAG and the report's schedule
    name = f"paid_orders (delta, {lake})"
    assert {a.name for a in report_dag.timetable.asset_condition.objects} == {name}
    assert _asset_event_names(report_dag) == {name} and all(e["name"] == name for e in extras)
    # (Airflow queues the run at the first event and gives it the events up to then; the others
    # go to the next run, so the run covers one to three members' landings.)
    report = airflow_env.run_asset_triggered(report_dag)
    assert report is not None and report.state == "success", report
    out = report.xcom("new_paid_orders")
    by_member = {e["member"]: e["origin"] for e in extras}
    assert out["events"] >= 1 and out["ranges"] and all(by_member[m] == r for m, r in out["ranges"].items())
    announced = [(int(p), r["first_seq"], r["last_seq"]) for o in out["ranges"].values() for p, r in o["ORDERS"].items()]
    rows = [(pt, q, oid) for pt, q, oid in zip(table.column("partition").to_pylist(), table.column("origin_seq").to_pylist(),
                                                table.column("order_id").to_pylist(), strict=True)
            if any(pt == p and lo <= q <= hi for p, lo, hi in announced)]
    assert (out["orders"], out["amount_cents"]) == (len(rows), sum(cents[oid] for _, _, oid in rows)) and rows

    # A second run finds nothing left: every member is skipped without starting Spark.
    again = airflow_env.run_dag(dag, run_conf=conf)
    assert again.state == "success"
    assert all(again.state_of("consume", i) == "skipped" for i in range(len(members)))
    assert _delta_rows(lake).num_rows == len(paid)
    # (a run into another table, its sink_path param, puts its event on that table's asset: the
    # landing task's outlet is an AssetAlias; tests/integration/test_operator_spark.py shows it)


def test_dag_on_a_spark_standalone_cluster(airflow_env, nats_conn_id, nats_settings, example_dag, tmp_path, monkeypatch):
    """Example DAG 1 with its Spark connection pointing at a standalone master and worker
    (client deploy mode), ``table_format=iceberg`` and ``read=executors``: reading NATS,
    decoding, the transformation and the data files' writes run on the cluster's executors
    (which get the NATS settings with the job, not from their environment); every paid order
    lands once, in per-key order, read back through the Iceberg catalog."""
    from tests.support.member_job import assert_exactly_once, iceberg_landed
    from tests.support.spark_standalone import StandaloneCluster

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    cluster = StandaloneCluster(tmp_path / "spark").start()
    try:
        airflow_env.add_connection("spark_cluster", "spark", host="spark://127.0.0.1", port=cluster.port,
                                   extra={"deploy-mode": "client"})
        _publish(nats_settings, N)
        catalog = f"sqlite:///{tmp_path}/catalog.db"
        conf = {"nats_conn_id": nats_conn_id, "spark_conn_id": "spark_cluster", "table_format": "iceberg",
                "iceberg_catalog_uri": catalog, "iceberg_warehouse": str(tmp_path / "warehouse"), "read": "executors",
                "members": ["m1"]}  # one spark-submit: three members are the other test's
        result = airflow_env.run_dag(example_dag("cg_scheduled_consumption.py").dag, run_conf=conf)
        assert result.state == "success", result.ti_states
        # the executors of the cluster ran the job's Spark tasks
        executors = list((tmp_path / "spark" / "work").glob("app-*/*/stderr"))
        assert executors, "no executor ran on the standalone worker"
        summaries = [v for (task, _), v in result.xcoms.items() if task == "consume" and v]
        assert summaries and {s["read_path"] for s in summaries} == {"executors"}, summaries
    finally:
        cluster.stop()
    expected = {("ORDERS", i + 1): f"c{i % 97}" for i in range(N) if i % 10 != 7}
    assert_exactly_once(iceberg_landed(catalog, "lake.paid_orders"), expected)
