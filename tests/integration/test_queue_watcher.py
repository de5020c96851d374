"""MessageQueueTrigger(scheme="nats-cg") resolves to GroupOverflowTrigger, and an AssetWatcher
on a group's backlog creates an asset-triggered DAG run whose task sees the figures. Against a
real nats-server; Airflow is imported inside the tests only."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError
from tests.integration.test_groups import origin
from tests.integration.test_operators_groups import NatsThread
from tests.integration.test_sensor_trigger import elastic

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def test_scheme_resolves_to_the_overflow_trigger_in_crossing_mode(airflow_env):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from airflow_provider_cg.queues.nats import NatsCgMessageQueueProvider
    from airflow_provider_cg.triggers.overflow import GroupOverflowTrigger

    t = MessageQueueTrigger(scheme="nats-cg", stream="O", group="g", min_pending=5, nats_conn_id="c")
    assert isinstance(t.trigger, GroupOverflowTrigger)
    classpath, kwargs = t.serialize()  # what the DB stores: our trigger, not the wrapper
    assert classpath == "airflow_provider_cg.triggers.overflow.GroupOverflowTrigger"
    assert kwargs["mode"] == "crossing" and kwargs["min_pending"] == 5 and kwargs["nats_conn_id"] == "c"

    p = NatsCgMessageQueueProvider()
    assert p.scheme_matches("nats-cg") and not p.scheme_matches("nats")
    assert p.queue_matches("nats-cg://conn/S/g") and not p.queue_matches("kafka://x/t")
    assert p.trigger_class() is GroupOverflowTrigger


def test_deprecated_queue_uri(airflow_env):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    from airflow_provider_cg.queues.nats import NatsCgMessageQueueProvider, parse_queue_uri

    assert parse_queue_uri("nats-cg://nats_x/S/g/m1?min_pending=7&min_ack_pending=2&poke_interval=0.5") == {
        "stream": "S", "group": "g", "member": "m1", "nats_conn_id": "nats_x",
        "min_pending": 7, "min_ack_pending": 2, "poke_interval": 0.5,
    }
    # explicit keyword arguments win over the URI (both are passed to the trigger)
    assert NatsCgMessageQueueProvider().trigger_kwargs("nats-cg://c/S/g?min_pending=3", min_pending=9) == {
        "stream": "S", "group": "g", "nats_conn_id": "c",
    }
    with pytest.warns(Warning, match="deprecated"):
        t = MessageQueueTrigger(queue="nats-cg://nats_x/S/g?min_pending=3", poke_interval=2)
    _, kwargs = t.serialize()
    assert (kwargs["stream"], kwargs["group"], kwargs["member"]) == ("S", "g", None)
    assert (kwargs["min_pending"], kwargs["poke_interval"], kwargs["nats_conn_id"]) == (3, 2.0, "nats_x")

    for bad, field in [
        ("nats-cg://c/S", "queue"),
        ("nats-cg://c/S/g/m/x", "queue"),
        ("nats-cg://c/S/g?min_pending=x", "min_pending"),
        ("nats-cg://c/S/g?max=1", "max"),
    ]:
        with pytest.raises(ConfigError) as e:
            parse_queue_uri(bad)
        assert e.value.field == field


def test_asset_watcher_on_a_backlog_crossing_runs_the_dag(airflow_env, nats_conn_id, nats_settings):
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher, dag, task

    bg = NatsThread(nats_settings)
    try:

        async def setup():
            await origin(bg.nc)
            await bg.cg.create("O", "g", elastic(2, ("m1", "m2")))

        bg.run(setup())
        bg.publish([f"foo.k{i}" for i in range(12)])

        backlog = Asset(
            "cg_orders_backlog",
            watchers=[
                AssetWatcher(
                    name="orders_backlog",
                    trigger=MessageQueueTrigger(
                        scheme="nats-cg", stream="O", group="g", min_pending=10, poke_interval=0.1,
                        nats_conn_id=nats_conn_id,
                    ),
                )
            ],
        )

        @dag(dag_id="cg_backlog_watcher", schedule=[backlog])
        def d():
            @task
            def react(**context):
                return [e.extra["payload"] for e in context["triggering_asset_events"][backlog]]

            react()

        dg = d()
        assert airflow_env.run_asset_triggered(dg) is None  # nothing fired yet
        [payload] = airflow_env.fire_asset_watchers(dg, timeout=20)
        assert payload["status"] == "overflow" and payload["pending"] >= 10

        result = airflow_env.run_asset_triggered(dg)
        assert result is not None and result.run_type == "asset_triggered" and result.state == "success"
        [seen] = result.xcom("react")
        assert seen["stream"] == "O" and seen["group"] == "g" and seen["min_pending"] == 10
        assert seen["pending"] == payload["pending"] and seen["backlog"] == payload["backlog"]
        assert sum(seen["partitions"].values()) == seen["backlog"]
        assert airflow_env.run_asset_triggered(dg) is None  # one crossing, one run
    finally:
        bg.close()
