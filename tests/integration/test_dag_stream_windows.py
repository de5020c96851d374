"""Example DAG 7 (dags/cg_stream_windows.py) with dag.test() against a real nats-server and real
spark-submit: it creates its group, and each member's task submits the example streaming
application, whose available-now query appends the closed windows' revenue per customer into a
Delta table; each closed window holds exactly the orders its members' partitions stored in it."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict

import pytest

from airflow_provider_cg.core.jetstream.publish import publish_many

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.spark]


def test_each_member_task_appends_its_closed_windows_once(airflow_env, nats_conn_id, nats_settings, spark_env,
                                                           example_dag, tmp_path, monkeypatch):
    import pandas as pd

    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
    from airflow_provider_cg.core.jetstream.direct_gets import ALL, PartitionReader
    from tests.support.member_job import read_delta

    table, checkpoints = tmp_path / "order_windows", tmp_path / "checkpoints"
    for name, value in {"NATS_CONN_ID": nats_conn_id, "SPARK_CONN_ID": spark_env, "TABLE": str(table),
                        "CHECKPOINTS": str(checkpoints), "WINDOW": "2 seconds", "WATERMARK": "1 second", "MEMBERS": "w1,w2"}.items():
        monkeypatch.setenv(f"CG_STREAM_{name}", value)

    async def publish() -> list[dict]:
        nc = await nats_settings.connect()
        await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.>"], allow_direct=True)
        # the group as the DAG creates it (its task then finds it so): it gets what is published from now on
        await ConsumerGroups(nc).create("ORDERS", "orders-windows", ElasticGroupConfig(
            6, (PartitioningFilter("orders.*", (1,)),), members=("w1", "w2")))
        n = 0
        for _ in range(6):  # orders over about 5 s: windows that close, then one that stays open
            batch = [(f"orders.c{i % 11}", json.dumps({"order_id": i, "customer": f"c{i % 11}",
                                                        "amount": float(i % 17)}).encode()) for i in range(n, n + 300)]
            assert (await publish_many(nc, batch)).published == 300
            n += 300
            await asyncio.sleep(0.9)
        # a row's timestamp is when the stream the member reads stored the message: for an elastic
        # group its work-queue stream, whose sourcing stores it a little after the origin did
        wq = "ORDERS-orders-windows"
        for _ in range(600):  # until the work queue has sourced them all
            if (await nc.jetstream().stream_info(wq)).state.messages >= n:
                break
            await asyncio.sleep(0.05)
        reader = PartitionReader(nc, wq)
        b = await reader.read(ALL, 0, 10_000)
        await reader.close()
        await nc.close()
        stored = [re.search(rb"Nats-Time-Stamp: (\S+)", h).group(1).decode() for h in b.hdrs]
        return [{**json.loads(p), "ts": pd.Timestamp(t).timestamp()} for p, t in zip(b.data, stored, strict=True)]

    orders = asyncio.run(publish())
    assert len(orders) == 1800
    result = airflow_env.run_dag(example_dag("cg_stream_windows.py").dag)
    assert result.state == "success", result.ti_states
    assert result.xcom("windows", 0)["result"] == "finished"
    landed = read_delta(str(table)).to_pylist()
    expected: dict[tuple[float, str], list] = defaultdict(lambda: [0, 0.0])
    for o in orders:
        w = expected[(o["ts"] // 2 * 2, o["customer"])]
        w[0] += 1
        w[1] += o["amount"]
    got = {(r["window_start"].timestamp(), r["customer"]): [r["orders"], r["revenue"]] for r in landed}
    assert len(got) == len(landed), "a window appended twice"
    assert got and all(got[k] == expected[k] for k in got), \
        [(k, got[k], expected[k]) for k in got if got[k] != expected[k]][:5]
    closed = sum(v[0] for v in got.values())
    assert closed >= 900, closed  # the windows the watermark passed: most of the orders
