"""GroupOverflowTrigger run directly in asyncio (crossing and once semantics, reconnects) and
GroupOverflowSensor in DAGs (deferred and poke mode, min_ack_pending, timeout/soft_fail)
against a real nats-server. Airflow is imported inside the tests only."""

from __future__ import annotations

import asyncio
import threading

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from airflow_provider_cg.core.groups.partitioning import partition_of
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from tests.integration.test_groups import Puller, origin, publish_keys, static_origin
from tests.integration.test_operators_groups import NatsThread

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def elastic(n: int = 2, members=("m1",)) -> ElasticGroupConfig:
    return ElasticGroupConfig(n, (PartitioningFilter("foo.*", (1,)),), members=tuple(members))


def trigger(conn: str, **kw):
    from airflow_provider_cg.triggers.overflow import GroupOverflowTrigger

    return GroupOverflowTrigger(**{"stream": "O", "group": "g", "poke_interval": 0.1, "nats_conn_id": conn, **kw})


class Events:
    """Runs ``trigger.run()`` in a task and queues the event payloads."""

    def __init__(self, trig) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.done = False

        async def pump() -> None:
            async for event in trig.run():
                await self.queue.put(event.payload)
            self.done = True

        self.task = asyncio.create_task(pump())

    async def next(self, timeout: float = 5.0) -> dict:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def none_within(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        assert self.queue.empty(), f"unexpected event: {self.queue.get_nowait()}"
        if self.task.done():
            self.task.result()  # surface a crash

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
def connects(monkeypatch):
    """Counts NATS connections opened through NatsConnectionSettings.connect."""
    calls = []
    real = NatsConnectionSettings.connect

    async def counting(self, **kw):
        calls.append(1)
        return await real(self, **kw)

    monkeypatch.setattr(NatsConnectionSettings, "connect", counting)
    return calls


# --- the trigger ------------------------------------------------------------------------------


def test_trigger_validates_and_serializes(airflow_env):
    from airflow.sdk._shared.module_loading import import_string
    from airflow.triggers.base import BaseEventTrigger

    from airflow_provider_cg.triggers.overflow import GroupOverflowTrigger

    t = GroupOverflowTrigger(stream="O", group="g", member="m1", min_ack_pending=3, poke_interval=2, nats_conn_id="c")
    classpath, kwargs = t.serialize()
    assert classpath == "airflow_provider_cg.triggers.overflow.GroupOverflowTrigger"
    assert kwargs == {
        "stream": "O", "group": "g", "member": "m1", "min_pending": None, "min_ack_pending": 3,
        "poke_interval": 2.0, "nats_conn_id": "c", "mode": "crossing", "deadline": None, "max_failures": None,
        "max_oldest_age": None,
    }
    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert isinstance(BaseEventTrigger.hash(classpath, kwargs), int)

    for bad, field in [
        ({}, "min_pending"),
        ({"min_pending": 0}, "min_pending"),
        ({"min_pending": 1, "min_ack_pending": True}, "min_ack_pending"),
        ({"min_pending": 1, "mode": "always"}, "mode"),
        ({"min_pending": 1, "poke_interval": 0}, "poke_interval"),
        ({"min_pending": 1, "deadline": 5.0}, "deadline"),
        ({"min_pending": 1, "max_failures": 0}, "max_failures"),
        ({"max_oldest_age": 0}, "max_oldest_age"),
        ({"max_oldest_age": "10"}, "max_oldest_age"),
        ({"max_oldest_age": True}, "max_oldest_age"),
    ]:
        with pytest.raises(ConfigError) as e:
            GroupOverflowTrigger(stream="O", group="g", **bad)
        assert e.value.field == field


async def test_crossing_fires_once_per_crossing_and_rearms_below(airflow_env, nats_conn_id, nc, connects):
    cg = ConsumerGroups(nc)
    await origin(nc)
    await cg.create("O", "g", elastic(2, ("m1",)))
    await cg.ensure_member_consumer("O", "g", "m1")
    events = Events(trigger(nats_conn_id, min_pending=5))
    try:
        await publish_keys(nc, ["a", "b", "c"])
        await events.none_within(0.6)  # 3 < 5

        await publish_keys(nc, ["d", "e", "f", "g"])
        ev = await events.next()
        assert ev["status"] == "overflow" and 5 <= ev["pending"] <= 7
        assert (ev["stream"], ev["group"], ev["member"]) == ("O", "g", None)
        assert (ev["min_pending"], ev["min_ack_pending"], ev["ack_pending"]) == (5, None, 0)
        assert set(ev["partitions"]) == {"0", "1"} and ev["ts"] > 0

        await publish_keys(nc, ["h", "i", "j"])
        await events.none_within(0.6)  # still above: no second event

        drained = await Puller(nc, "O-g", "m1").drain()
        assert drained == 10
        await events.none_within(0.6)  # below again: re-armed, nothing to report

        keys = [f"k{i}" for i in range(6)]
        await publish_keys(nc, keys)
        ev = await events.next()
        assert ev["status"] == "overflow" and 5 <= ev["pending"] <= 6
        assert not events.done  # crossing mode runs forever
    finally:
        await events.stop()
    assert len(connects) == 1  # one connection for all those polls


async def test_max_oldest_age_fires_when_the_oldest_pending_message_is_old_enough(airflow_env, nats_conn_id, nc):
    """Freshness: no count threshold, only the age of the oldest pending message; it fires
    once that message is older than the threshold, re-arms once the backlog is landed."""
    cg = ConsumerGroups(nc)
    await origin(nc)
    await cg.create("O", "g", elastic(2, ("m1",)))
    await cg.ensure_member_consumer("O", "g", "m1")
    events = Events(trigger(nats_conn_id, max_oldest_age=1.5))
    try:
        await publish_keys(nc, ["a", "b", "c"])
        published = asyncio.get_running_loop().time()
        ev = await events.next(timeout=10)
        waited = asyncio.get_running_loop().time() - published
        assert ev["status"] == "overflow" and ev["max_oldest_age"] == 1.5 and ev["pending"] == 3
        assert 1.5 < ev["oldest_pending_age_s"] < 5 and waited > 1.2, (ev, waited)
        await events.none_within(0.5)  # still old: no second event
        assert await Puller(nc, "O-g", "m1").drain() == 3
        await events.none_within(0.5)  # nothing pending: re-armed
        await publish_keys(nc, ["d"])
        ev = await events.next(timeout=10)
        assert ev["pending"] == 1 and ev["oldest_pending_age_s"] > 1.5
    finally:
        await events.stop()


async def test_once_mode_on_a_member_without_consumer_counts_its_partitions(airflow_env, nats_conn_id, nc):
    cg = ConsumerGroups(nc)
    await origin(nc)
    await cg.create("O", "g", elastic(2, ("m1", "m2")))
    keys = [f"k{i}" for i in range(30)]
    m2_part = {m.member: m.partitions for m in await cg.member_info("O", "g")}["m2"]
    assert m2_part == [1]
    expected = sum(1 for k in keys if partition_of(f"foo.{k}", 2, (1,), "foo.*") == 1)
    await publish_keys(nc, keys)

    async def sourced() -> None:
        for _ in range(100):
            if (await cg.status("O", "g")).backlog == 30:
                return
            await asyncio.sleep(0.05)

    await sourced()
    events = Events(trigger(nats_conn_id, member="m2", min_pending=expected, mode="once"))
    try:
        ev = await events.next()
        assert ev["pending"] == expected and ev["backlog"] == expected and ev["ack_pending"] == 0
        assert ev["partitions"] == {"1": expected} and ev["member"] == "m2"
        await asyncio.wait_for(events.task, 2)  # once: the generator ends after its event
        assert events.done
    finally:
        await events.stop()

    # one more than there is: never fires; an unknown member ends with an error event
    events = Events(trigger(nats_conn_id, member="m2", min_pending=expected + 1, mode="once"))
    await events.none_within(0.5)
    await events.stop()
    events = Events(trigger(nats_conn_id, member="nobody", min_pending=1, mode="once"))
    ev = await events.next()
    assert ev["status"] == "error" and ev["error"].startswith("ConfigError: member:")
    await events.stop()


async def test_static_group_whole_group_pending_without_consumers(airflow_env, nats_conn_id, nc):
    cg = ConsumerGroups(nc)
    await static_origin(nc, "S", partitions=2)
    await cg.create("S", "st", StaticGroupConfig(2, ("bar.*",), ("m1", "m2")))
    await publish_keys(nc, [f"k{i}" for i in range(12)], prefix="bar")
    events = Events(trigger(nats_conn_id, min_pending=12, mode="once", stream="S", group="st"))
    try:
        ev = await events.next()
        assert ev["pending"] == 12 and ev["backlog"] == 12 and sum(ev["partitions"].values()) == 12
    finally:
        await events.stop()


async def reconnected(nc, limit: float = 15.0) -> None:
    """Wait until the fixture's client has reconnected and JetStream answers."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while loop.time() < end:
        if nc.is_connected:
            try:
                await nc.jetstream().account_info()
                return
            except Exception:
                pass
        await asyncio.sleep(0.1)
    raise AssertionError("the test client did not reconnect")


async def test_once_mode_gives_up_after_max_failures_with_the_reason(airflow_env, nats_conn_id, nats_server, nc):
    """A sensor's trigger on an unreachable server ends with an error event after
    ``max_failures`` polls in a row (not silently at its deadline), saying why."""
    import time

    cg = ConsumerGroups(nc)
    await origin(nc)
    await cg.create("O", "g", elastic(1, ("m1",)))
    await asyncio.to_thread(nats_server.stop)
    try:
        started = time.monotonic()
        events = Events(trigger(nats_conn_id, min_pending=3, mode="once", max_failures=3,
                                deadline=time.time() + 600))
        ev = await events.next(timeout=60)
        assert ev["status"] == "error" and "3 polls in a row failed" in ev["error"], ev
        assert "cannot reach NATS" in ev["error"] and "connection refused" in ev["error"], ev
        assert time.monotonic() - started < 60
        await events.stop()
    finally:
        await asyncio.to_thread(nats_server.start)


async def test_trigger_retries_until_the_server_is_up_and_keeps_its_connection(
    airflow_env, nats_conn_id, nats_server, nc, connects
):
    cg = ConsumerGroups(nc)
    await origin(nc)
    await cg.create("O", "g", elastic(1, ("m1",)))
    await asyncio.to_thread(nats_server.stop)
    events = Events(trigger(nats_conn_id, min_pending=3))
    try:
        await events.none_within(2.5)  # connection refused (each attempt ~1 s): retried with backoff
        assert len(connects) >= 2
        await asyncio.to_thread(nats_server.start)
        await publish_keys(nc, ["a", "b", "c"])  # the fixture's client reconnects by itself
        ev = await events.next(timeout=20)
        assert ev["pending"] == 3
        opened = len(connects)

        # an outage while connected: the same connection reconnects, nothing is reopened
        await asyncio.to_thread(nats_server.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(nats_server.start)
        await reconnected(nc)
        await cg.ensure_member_consumer("O", "g", "m1")  # an instance starts and works it off
        assert await Puller(nc, "O-g", "m1").drain() == 3
        await events.none_within(0.5)  # re-armed
        await publish_keys(nc, ["d", "e", "f"])
        ev = await events.next(timeout=20)
        assert ev["pending"] == 3
        assert len(connects) == opened
    finally:
        await events.stop()


async def test_crossing_waits_for_a_group_created_later(airflow_env, nats_conn_id, nc):
    events = Events(trigger(nats_conn_id, group="late", min_pending=2))
    try:
        await events.none_within(0.5)  # no group yet: logged and retried, never fatal here
        await origin(nc)
        await ConsumerGroups(nc).create("O", "late", elastic(2, ("m1",)))
        await publish_keys(nc, ["a", "b"])
        ev = await events.next(timeout=20)
        assert ev["group"] == "late" and ev["pending"] == 2
    finally:
        await events.stop()


# --- the sensor -------------------------------------------------------------------------------


@pytest.fixture
def bg(nats_settings):
    t = NatsThread(nats_settings)
    yield t
    t.close()


def _setup_elastic(bg: NatsThread, members=("m1", "m2"), consumers=()) -> None:
    async def go():
        await origin(bg.nc)
        await bg.cg.create("O", "g", elastic(2, members))
        for m in consumers:
            await bg.cg.ensure_member_consumer("O", "g", m)

    bg.run(go())


def test_sensor_rejects_bad_thresholds(airflow_env):
    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    for bad, field in [({}, "min_pending"), ({"min_pending": 5, "min_ack_pending": 0}, "min_ack_pending"),
                       ({"min_pending": "5"}, "min_pending"), ({"max_oldest_age": -1}, "max_oldest_age")]:
        with pytest.raises(ConfigError) as e:
            GroupOverflowSensor(task_id="s", stream="O", group="g", **bad)
        assert e.value.field == field


def test_deferred_sensor_waits_for_a_background_publisher(airflow_env, nats_conn_id, bg, monkeypatch):
    from airflow.sdk import dag

    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    def no_poke(self, context):
        raise AssertionError("a deferrable sensor must not poke")

    monkeypatch.setattr(GroupOverflowSensor, "poke", no_poke)
    _setup_elastic(bg)
    publisher = threading.Timer(1.0, bg.publish, args=([f"foo.k{i}" for i in range(8)],))

    @dag(dag_id="cg_sensor_deferred", schedule=None)
    def d():
        GroupOverflowSensor(
            task_id="wait", stream="O", group="g", min_pending=8, poke_interval=0.2, timeout=30,
            nats_conn_id=nats_conn_id,
        )

    publisher.start()
    try:
        result = airflow_env.run_dag(d())
    finally:
        publisher.join()
    assert result.state_of("wait") == "success"
    ev = result.xcom("wait")
    assert ev["status"] == "overflow" and ev["pending"] == 8 and ev["backlog"] == 8
    assert ev["min_pending"] == 8 and sum(ev["partitions"].values()) == 8


def test_poke_mode_sensor_on_a_member(airflow_env, nats_conn_id, bg, monkeypatch):
    from airflow.sdk import dag

    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor
    from airflow_provider_cg.triggers.overflow import GroupOverflowTrigger

    def no_trigger(self):
        raise AssertionError("poke mode must not defer")

    monkeypatch.setattr(GroupOverflowTrigger, "run", no_trigger)
    _setup_elastic(bg, consumers=("m1",))
    keys = [f"k{i}" for i in range(20)]
    in_m1 = sum(1 for k in keys if partition_of(f"foo.{k}", 2, (1,), "foo.*") == 0)
    bg.publish([f"foo.{k}" for k in keys])

    @dag(dag_id="cg_sensor_poke", schedule=None)
    def d():
        GroupOverflowSensor(
            task_id="wait", stream="O", group="g", member="m1", min_pending=in_m1, deferrable=False,
            poke_interval=0.2, timeout=30, nats_conn_id=nats_conn_id,
        )

    result = airflow_env.run_dag(d())
    assert result.state_of("wait") == "success"
    ev = result.xcom("wait")
    assert ev["status"] == "overflow" and ev["member"] == "m1"
    assert ev["pending"] == in_m1 and ev["partitions"] == {"0": in_m1}


def test_min_ack_pending_fires_either_way_while_min_pending_is_far(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    _setup_elastic(bg, members=("m1",), consumers=("m1",))
    bg.publish([f"foo.k{i}" for i in range(10)])
    puller = Puller(bg.nc, "O-g", "m1")

    async def take(n: int) -> int:  # pull without acking: ack pending grows
        got = []
        for _ in range(20):
            got += await puller.pull(batch=n - len(got), expires=0.5)
            if len(got) >= n:
                break
        return len(got)

    assert bg.run(take(4)) == 4

    @dag(dag_id="cg_sensor_ack_pending", schedule=None)
    def d():
        common = {"stream": "O", "group": "g", "member": "m1", "min_pending": 1000, "min_ack_pending": 4,
                  "poke_interval": 0.2, "timeout": 30, "nats_conn_id": nats_conn_id}
        GroupOverflowSensor(task_id="deferred", **common) >> GroupOverflowSensor(
            task_id="poked", deferrable=False, **common
        )

    result = airflow_env.run_dag(d())
    for task_id in ("deferred", "poked"):
        assert result.state_of(task_id) == "success"
        ev = result.xcom(task_id)
        assert ev["ack_pending"] == 4 and ev["pending"] == 6 and ev["backlog"] == 10


def test_timeouts_soft_fail_and_errors(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    _setup_elastic(bg)
    bg.publish(["foo.a"])
    seen: dict[str, BaseException] = {}

    def record(context) -> None:
        seen[context["ti"].task_id] = context["exception"]

    @dag(dag_id="cg_sensor_timeouts", schedule=None,
         default_args={"trigger_rule": "all_done", "on_failure_callback": record})
    def d():
        common = {"stream": "O", "group": "g", "min_pending": 2, "poke_interval": 0.2, "timeout": 1,
                  "nats_conn_id": nats_conn_id}
        (
            GroupOverflowSensor(task_id="deferred_soft", soft_fail=True, **common)
            >> GroupOverflowSensor(task_id="poke_soft", soft_fail=True, deferrable=False, **common)
            >> GroupOverflowSensor(task_id="deferred_hard", **common)
            >> GroupOverflowSensor(task_id="missing_group", **{**common, "group": "nope", "timeout": 30})
        )

    result = airflow_env.run_dag(d())
    assert result.state_of("deferred_soft") == "skipped"
    assert result.state_of("poke_soft") == "skipped"
    assert result.state_of("deferred_hard") == "failed"
    assert "timed out" in str(seen["deferred_hard"])
    assert result.state_of("missing_group") == "failed"
    assert "GroupNotFound: consumer group 'nope' on stream 'O' does not exist" in str(seen["missing_group"])


def test_poke_mode_sensor_on_the_oldest_pending_age(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    _setup_elastic(bg)
    bg.publish(["foo.k1", "foo.k2"])

    @dag(dag_id="cg_sensor_oldest_age", schedule=None)
    def d():
        GroupOverflowSensor(task_id="wait", stream="O", group="g", max_oldest_age=1.0, mode="poke",
                            deferrable=False, poke_interval=0.3, timeout=30, nats_conn_id=nats_conn_id)

    result = airflow_env.run_dag(d())
    assert result.state_of("wait") == "success"
    ev = result.xcom("wait")
    assert ev["status"] == "overflow" and ev["oldest_pending_age_s"] > 1.0 and ev["max_oldest_age"] == 1.0


def test_queue_uri_takes_max_oldest_age(airflow_env):
    from airflow_provider_cg.queues.nats import parse_queue_uri

    assert parse_queue_uri("nats-cg://c/O/g?max_oldest_age=90")["max_oldest_age"] == 90.0
