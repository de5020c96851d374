"""The Airflow harness: dag.test() of a NatsHook task against a real nats-server, a deferred
task resumed from its inline trigger, and the AssetWatcher path (triggerer -> asset event ->
asset-triggered run). Airflow is imported inside the tests only (see tests/airflow_conftest.py).
"""

from __future__ import annotations

import time

import pytest

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def test_dag_test_runs_a_nats_hook_task(airflow_env, nats_conn_id):
    from airflow.sdk import dag, task

    from airflow_provider_cg.hooks.nats import NatsHook

    @dag(dag_id="cg_harness_nats", schedule=None)
    def harness():
        @task
        def publish_and_count() -> int:
            async def go(nc) -> int:
                js = nc.jetstream()
                await js.add_stream(name="HARNESS", subjects=["harness.>"])
                for i in range(3):
                    await js.publish(f"harness.{i}", b"x")
                return (await js.stream_info("HARNESS")).state.messages

            return NatsHook(nats_conn_id=nats_conn_id).run(go)

        publish_and_count()

    started = time.perf_counter()
    result = airflow_env.run_dag(harness())
    print(f"dag.test of a 1-task DAG: {time.perf_counter() - started:.2f}s; timings {airflow_env.timings}")

    assert result.state == "success"
    assert result.state_of("publish_and_count") == "success"
    assert result.xcom("publish_and_count") == 3


def test_deferred_task_resumes_with_the_trigger_event(airflow_env):
    from datetime import timedelta

    from airflow.providers.standard.triggers.temporal import DateTimeTrigger
    from airflow.sdk import BaseOperator, dag, timezone

    class WaitABit(BaseOperator):
        def execute(self, context):
            moment = timezone.utcnow() + timedelta(seconds=0.3)
            self.defer(trigger=DateTimeTrigger(moment=moment), method_name="execute_complete")

        def execute_complete(self, context, event=None):
            return {"resumed": True, "event": str(event)}

    @dag(dag_id="cg_harness_defer", schedule=None)
    def harness():
        WaitABit(task_id="wait")

    result = airflow_env.run_dag(harness())

    assert result.state == "success"
    assert result.xcom("wait")["resumed"] is True
    assert result.xcom("wait")["event"].startswith("20")  # the trigger's payload: its moment


def test_asset_watcher_event_creates_and_runs_an_asset_triggered_run(airflow_env, tmp_path):
    from airflow.providers.standard.triggers.file import FileDeleteTrigger
    from airflow.sdk import Asset, AssetWatcher, dag, task

    marker = tmp_path / "ready"
    marker.write_text("go")
    watched = Asset(
        "cg_harness_ready",
        watchers=[
            AssetWatcher(name="ready", trigger=FileDeleteTrigger(filepath=str(marker), poke_interval=0.1))
        ],
    )

    @dag(dag_id="cg_harness_watcher", schedule=[watched])
    def harness():
        @task
        def consume(**context):
            events = context["triggering_asset_events"][watched]
            return [e.extra for e in events]

        consume()

    d = harness()
    payloads = airflow_env.fire_asset_watchers(d, timeout=10)
    assert payloads == [True]
    assert not marker.exists()  # FileDeleteTrigger consumed it

    result = airflow_env.run_asset_triggered(d)
    assert result is not None
    assert result.run_type == "asset_triggered"
    assert result.state == "success"
    assert result.xcom("consume") == [{"from_trigger": True, "payload": True}]

    assert airflow_env.run_asset_triggered(d) is None  # the queued request was consumed
