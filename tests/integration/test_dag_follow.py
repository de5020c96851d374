"""Example DAG 6 (dags/cg_follow_orders.py) with dag.test() against a real nats-server and real
spark-submit: its follower, one spark-submit, lands orders published while it runs, in several
batches of one Spark session, into the table every example lands into; each paid order once."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from airflow_provider_cg.core.jetstream.publish import publish_many

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.spark]

GROUP = "follow-lake"


def _orders(first: int, n: int) -> list[tuple[str, bytes]]:
    return [(f"orders.c{i % 53}", json.dumps({"order_id": i, "customer": f"c{i % 53}", "amount": i / 10,
                                              "status": "cancelled" if i % 10 == 7 else "paid"}).encode())
            for i in range(first, first + n)]


@pytest.fixture
def statsd(monkeypatch):
    """Airflow's metrics to a real StatsD socket, set up as the task runner sets them up."""
    from airflow.sdk.observability import stats

    from airflow_provider_cg.metrics import airflow_stats
    from tests.support.statsd import StatsdListener

    listener = StatsdListener()
    for name, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(listener.port),
                        "STATSD_PREFIX": "airflow"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{name}", value)
    assert airflow_stats() is not None
    yield listener
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

    stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
    listener.close()


def test_a_follower_lands_orders_as_they_arrive(airflow_env, nats_conn_id, nats_settings, spark_env, example_dag,
                                                tmp_path, monkeypatch, statsd):
    """... and its task sends the member's lag as the run reports it, every progress interval,
    through Airflow's StatsD: the backlog it started with, then less as it lands."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
    from tests.support.member_job import read_delta

    lake = tmp_path / "paid_orders"
    # dag.test() runs one run: no successor comes to relieve the follower (the hand-over across
    # runs is tests/install/test_getting_started.py's, under a real scheduler)
    for name, value in {"GROUP": GROUP, "FOLLOW": "22", "HANDOVER_SECONDS": "0", "NATS_CONN_ID": nats_conn_id,
                        "SPARK_CONN_ID": spark_env, "SINK_PATH": str(lake)}.items():
        monkeypatch.setenv(f"CG_FOLLOW_{name}", value)

    async def setup():
        nc = await nats_settings.connect()
        await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.>"])
        await ConsumerGroups(nc).create("ORDERS", GROUP, ElasticGroupConfig(
            4, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
        assert (await publish_many(nc, _orders(0, 600))).published == 600
        await nc.close()

    asyncio.run(setup())
    published = [600]

    def publish_while_following():  # three more rounds while the follower runs (it follows 22 s: its
        # first batch starts Spark, which on a busy machine takes a good part of that; the rounds 4.5 s)
        async def go():
            nc = await nats_settings.connect()
            for _ in range(3):
                await asyncio.sleep(1.5)
                assert (await publish_many(nc, _orders(published[0], 300))).published == 300
                published[0] += 300
            await nc.close()

        deadline = time.monotonic() + 120  # the follower's first batch landed: it runs
        while not (lake / "_delta_log" / f"{0:020d}.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        asyncio.run(go())

    publisher = threading.Thread(target=publish_while_following)
    dag = example_dag("cg_follow_orders.py").dag
    publisher.start()
    result = airflow_env.run_dag(dag)
    publisher.join(60)
    assert result.state == "success", result.ti_states
    summary = result.xcom("follow", 0)
    assert summary["result"] == "committed" and summary["stop_reason"] == "follow ended", summary
    assert summary["messages_read"] == published[0] == 1500, summary
    assert summary["batches"] >= 4, summary  # batch after batch in one spark-submit, as the rounds came
    paid = sorted(i for i in range(published[0]) if i % 10 != 7)
    table = read_delta(str(lake), ["order_id"])
    assert sorted(table.column("order_id").to_pylist()) == paid  # every paid order, once
    assert result.xcom("report")["totals"]["messages_read"] == 1500
    prefix = f"airflow.cg.{nats_conn_id}.ORDERS.{GROUP}.m1."
    backlog = [v for name, v in statsd.gauges(prefix) if name == prefix + "backlog_messages"]
    assert len(backlog) >= 3, statsd.lines[-20:]  # one a progress interval (5 s) of a 22 s follow
    assert max(backlog) > 0 and backlog[-1] < max(backlog), backlog  # it had some to land, then less
    assert any(name == prefix + "pinned" and v == 1 for name, v in statsd.gauges(prefix))


async def test_a_successor_starts_its_hand_over_window_before_the_holders_follow_time_ends(airflow_env, nats_conn_id,
                                                                                           nats_settings):
    """The operator reads the member's holder on the progress board (a follower, real
    nats-server): with a hand-over window it starts that long before the holder's follow time
    ends (its deferral's moment), at once when that is past, without a window or a holder at
    once, and a bad window is refused naming it."""
    import datetime as dt

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.landing.contract import Summary
    from airflow_provider_cg.core.landing.run.board import ProgressBoard
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

    def op(**kw):
        return ConsumerGroupSparkSubmitOperator(task_id="f", stream="ORDERS", group=GROUP, member="m1",
                                                sink_path="/tmp/lake", follow="10m", nats_conn_id=nats_conn_id, **kw)

    assert op(handover_wait=60)._successor_start() is None  # nobody holds m1
    nc = await nats_settings.connect()
    try:
        summary = Summary("ORDERS", GROUP, "m1", pin_id="pinned-elsewhere")
        holder = ProgressBoard(nc, "$JS.API", summary, owner="m1/holder", interval=5.0)
        holder.follow_until = time.time() + 90
        await holder._write(holder.report("landing"))
        start, ends = await asyncio.to_thread(op(handover_wait=60)._successor_start)
        assert abs((ends - start).total_seconds() - 60) < 0.01
        assert abs(start.timestamp() - (holder.follow_until - 60)) < 1.0
        assert await asyncio.to_thread(op(handover_wait=100)._successor_start) is None  # its window began
        assert await asyncio.to_thread(op()._successor_start) is None  # no window: at once
        with pytest.raises(TaskDeferred) as deferred:
            await asyncio.to_thread(op(handover_wait=60).execute, {})
        moment = deferred.value.trigger.moment
        assert abs(moment.timestamp() - start.timestamp()) < 1.0 and moment > dt.datetime.now(dt.UTC)
        for bad in ("soon", -5):  # refused when the DAG is parsed, naming it
            with pytest.raises(ConfigError, match="handover_wait"):
                op(handover_wait=bad)
    finally:
        await nc.close()
