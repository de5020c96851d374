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


def test_dag_lands_every_published_order_once(airflow_env, nats_conn_id, nats_settings, spark_env, example_dag,
                                             tmp_path):
    from tests.support.member_job import assert_exactly_once, delta_landed

    _publish(nats_settings, N)
    dag = example_dag("cg_scheduled_consumption.py").dag
    assert dag.params["table_format"] == "delta"  # the default
    lake = tmp_path / "paid_orders"
    conf = {"nats_conn_id": nats_conn_id, "spark_conn_id": spark_env, "sink_path": str(lake)}
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
    assert summary["total"] == N

    table = _delta_rows(lake)
    # the example transformation: cancelled orders dropped, amount_cents derived
    paid = [i for i in range(N) if i % 10 != 7]
    assert table.num_rows == len(paid)
    assert sorted(table.column("order_id").to_pylist()) == paid  # every paid order, once
    assert sorted(table.column("origin_seq").to_pylist()) == [i + 1 for i in paid]
    cents = dict(zip(table.column("order_id").to_pylist(), table.column("amount_cents").to_pylist(), strict=True))
    assert all(cents[i] == round(i / 10 * 100) for i in paid)
    per_member = {r["member"]: 0 for r in summary["rows"]}
    for r in summary["rows"]:
        per_member[r["member"]] += r["rows"]
    assert per_member == {m["member"]: m["backlog"] for m in members}
    assert_exactly_once(delta_landed(str(lake)), {("ORDERS", i + 1): f"c{i % 97}" for i in paid})

    # A second run finds nothing left: every member is skipped without starting Spark.
    again = airflow_env.run_dag(dag, run_conf=conf)
    assert again.state == "success"
    assert all(again.state_of("consume", i) == "skipped" for i in range(len(members)))
    assert _delta_rows(lake).num_rows == len(paid)


def test_dag_on_a_spark_standalone_cluster(airflow_env, nats_conn_id, nats_settings, example_dag, tmp_path, monkeypatch):
    """Example DAG 1 with its Spark connection pointing at a standalone master and worker
    (client deploy mode) and ``table_format=iceberg``: decoding, the transformation and the
    data files' writes run on the cluster's executors; every paid order lands once, in per-key
    order, read back through the Iceberg catalog."""
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
                "iceberg_catalog_uri": catalog, "iceberg_warehouse": str(tmp_path / "warehouse")}
        result = airflow_env.run_dag(example_dag("cg_scheduled_consumption.py").dag, run_conf=conf)
        assert result.state == "success", result.ti_states
        # the executors of the cluster ran the job's Spark tasks
        executors = list((tmp_path / "spark" / "work").glob("app-*/*/stderr"))
        assert executors, "no executor ran on the standalone worker"
    finally:
        cluster.stop()
    expected = {("ORDERS", i + 1): f"c{i % 97}" for i in range(N) if i % 10 != 7}
    assert_exactly_once(iceberg_landed(catalog, "lake.paid_orders"), expected)
