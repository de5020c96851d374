"""The consumer-group operators in DAGs run with dag.test() against a real nats-server, each
result checked on the server (KV entries, streams, consumers, pins). Airflow is imported
inside the tests only (see tests/airflow_conftest.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from typing import Any

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.partitioning import partition_of
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.integration.test_groups import Puller

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]

ELASTIC_BUCKET = "elastic-consumer-groups"
STATIC_BUCKET = "static-consumer-groups"


class NatsThread:
    """A NATS client on an event loop in a background thread, for sync tests that run DAGs
    (dag.test() and NatsHook.run() need the main thread without a running loop)."""

    def __init__(self, settings) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = self.run(settings.connect())
        self.api = JsApi(self.nc)
        self.cg = ConsumerGroups(self.nc, transition_pause=0.1)

    def run(self, coro: Coroutine, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def publish(self, subjects) -> None:
        async def go():
            js = self.nc.jetstream()
            for s in subjects:
                await js.publish(s, s.encode())

        self.run(go())

    def kv(self, bucket: str, key: str) -> bytes | None:
        async def go():
            import nats.js.errors

            try:
                kv = await self.nc.jetstream().key_value(bucket)
                return (await kv.get(key)).value
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
                return None

        return self.run(go())

    def close(self) -> None:
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def bg(nats_settings):
    t = NatsThread(nats_settings)
    yield t
    t.close()


@pytest.fixture
def failures():
    """Exceptions of failed tasks, recorded by an on_failure_callback (task_id -> exception)."""
    seen: dict[str, BaseException] = {}

    def record(context) -> None:
        seen[context["ti"].task_id] = context["exception"]

    record.seen = seen  # type: ignore[attr-defined]
    return record


def elastic_kwargs(conn: str, **over: Any) -> dict[str, Any]:
    kw = {
        "stream": "ORDERS",
        "group": "workers",
        "kind": "elastic",
        "max_members": 4,
        "partitioning_filters": [{"filter": "orders.*", "partitioning_wildcards": [1]}],
        "max_buffered_msgs": 1000,
        "members": ["m1", "m2"],
        "create_stream": {"subjects": ["orders.*"], "storage": "memory"},
        "nats_conn_id": conn,
    }
    kw.update(over)
    return kw


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over, field",
    [
        ({"max_members": 0}, "max_members"),
        ({"kind": "dynamic"}, "kind"),
        ({"stream": "bad.name"}, "stream"),
        ({"filters": ["x.*"]}, "filters"),
        ({"partitioning_filters": [{"filter": "orders.*", "partitioning_wildcards": [2]}]},
         "partitioning_filters[0].partitioning_wildcards[0]"),
        ({"members": ["ok", "bad member"]}, "members[1]"),
        ({"create_stream": {"subjects": []}}, "create_stream.subjects"),
        ({"create_stream": {"name": "OTHER", "subjects": ["a"]}}, "create_stream.name"),
    ],
)
def test_bad_create_arguments_fail_at_construction_naming_the_field(airflow_env, over, field):
    from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator

    with pytest.raises(ConfigError) as e:
        CreateConsumerGroupOperator(task_id="c", **elastic_kwargs("nowhere", **over))
    assert e.value.field == field


def test_bad_membership_and_step_down_arguments_fail_at_construction(airflow_env):
    from airflow_provider_cg.operators.groups import (
        AddMembersOperator,
        SetMemberMappingsOperator,
        StepDownMemberOperator,
    )

    with pytest.raises(ConfigError) as e:
        AddMembersOperator(task_id="a", stream="S", group="g", members=[])
    assert e.value.field == "members"
    with pytest.raises(ConfigError) as e:
        SetMemberMappingsOperator(task_id="s", stream="S", group="g", mappings={"m1": ["x"]})
    assert e.value.field.startswith("member_mappings")
    with pytest.raises(ConfigError) as e:
        AddMembersOperator(task_id="a", stream="S", group="g", members=["m1"], assignment="nearest")
    assert e.value.field == "assignment"
    with pytest.raises(ConfigError) as e:
        StepDownMemberOperator(task_id="d", stream="S", group="g", member="a.b")
    assert e.value.field == "member"
    # templates are checked after rendering
    AddMembersOperator(task_id="t", stream="{{ params.s }}", group="g", members="{{ params.m }}")


# --- create / delete --------------------------------------------------------------------------


def test_create_is_idempotent_and_a_different_immutable_field_fails_naming_it(airflow_env, nats_conn_id, bg, failures):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator

    @dag(dag_id="cg_op_create", schedule=None, default_args={"on_failure_callback": failures, "trigger_rule": "all_done"})
    def d():
        first = CreateConsumerGroupOperator(task_id="create", **elastic_kwargs(nats_conn_id))
        again = CreateConsumerGroupOperator(task_id="create_again", **elastic_kwargs(nats_conn_id))
        other_members = CreateConsumerGroupOperator(
            task_id="create_other_members", **elastic_kwargs(nats_conn_id, members=["x"])
        )
        conflict = CreateConsumerGroupOperator(task_id="conflict", **elastic_kwargs(nats_conn_id, max_members=3))
        other_kind = CreateConsumerGroupOperator(
            task_id="other_kind",
            **elastic_kwargs(nats_conn_id, kind="static", partitioning_filters=None, max_buffered_msgs=0,
                             filters=["orders.*"]),
        )
        # a template rendering to a bad name fails before the server is contacted
        bad_render = CreateConsumerGroupOperator(
            task_id="bad_render", params={"g": "bad.group"}, **elastic_kwargs(nats_conn_id, group="{{ params.g }}")
        )
        first >> again >> other_members >> conflict >> other_kind >> bad_render

    result = airflow_env.run_dag(d())

    assert result.state_of("create") == "success"
    created = result.xcom("create")
    assert created["created"] is True and created["stream_created"] is True
    assert created["kind"] == "elastic" and created["config"]["max_members"] == 4
    assert created["assignment"] == {"m1": [0, 1], "m2": [2, 3]}
    json.dumps(created)

    assert result.state_of("create_again") == "success"
    again = result.xcom("create_again")
    assert again["created"] is False and again["stream_created"] is False
    assert again["revision"] == created["revision"]
    # a different membership is not a conflict, and is left alone
    assert result.state_of("create_other_members") == "success"
    assert result.xcom("create_other_members")["config"]["members"] == ["m1", "m2"]

    assert result.state_of("conflict") == "failed"
    assert str(failures.seen["conflict"]).startswith("max_members: cannot change")
    assert isinstance(failures.seen["conflict"].__cause__, ConfigError)
    assert result.state_of("other_kind") == "failed"
    assert str(failures.seen["other_kind"]).startswith("kind:")
    assert result.state_of("bad_render") == "failed"
    assert str(failures.seen["bad_render"]).startswith("group: group name must not contain '.'")

    # on the server: the origin stream, the orbit-format KV entry, the work-queue stream
    origin = bg.run(bg.api.stream_info("ORDERS"))["config"]
    assert origin["subjects"] == ["orders.*"] and origin["storage"] == "memory"
    assert bg.kv(ELASTIC_BUCKET, "ORDERS.workers") == (
        b'{"max_members":4,"partitioning_filters":[{"filter":"orders.*","partitioning_wildcards":[1]}],'
        b'"max_buffered_msg":1000,"members":["m1","m2"]}'
    )
    assert bg.kv(STATIC_BUCKET, "ORDERS.workers") is None
    wq = bg.run(bg.api.stream_info("ORDERS-workers"))["config"]
    assert wq["retention"] == "workqueue" and wq["max_msgs"] == 1000


def test_static_group_create_fixed_membership_and_delete(airflow_env, nats_conn_id, bg, failures):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import (
        AddMembersOperator,
        CreateConsumerGroupOperator,
        DeleteConsumerGroupOperator,
    )

    static = {
        "stream": "S",
        "group": "st",
        "kind": "static",
        "max_members": 2,
        "filters": ["bar.*"],
        "members": ["m1", "m2"],
        "create_stream": {
            "subjects": ["bar.*"],
            "subject_transform": {"src": "bar.*", "dest": "{{partition(2,1)}}.bar.{{wildcard(1)}}"},
        },
        "nats_conn_id": nats_conn_id,
    }

    @dag(dag_id="cg_op_static", schedule=None, default_args={"on_failure_callback": failures, "trigger_rule": "all_done"})
    def d():
        create = CreateConsumerGroupOperator(task_id="create", **static)
        add = AddMembersOperator(task_id="add", stream="S", group="st", members=["m3"], nats_conn_id=nats_conn_id)
        create >> add

    result = airflow_env.run_dag(d())
    assert result.state_of("create") == "success" and result.xcom("create")["created"] is True
    assert bg.kv(STATIC_BUCKET, "S.st") == b'{"max_members":2,"filters":["bar.*"],"members":["m1","m2"]}'
    assert result.state_of("add") == "failed"
    assert "fixed at creation" in str(failures.seen["add"])
    assert bg.kv(STATIC_BUCKET, "S.st") == b'{"max_members":2,"filters":["bar.*"],"members":["m1","m2"]}'

    # a running member has a durable consumer; deleting the group removes it, the stream stays
    bg.run(bg.cg.ensure_member_consumer("S", "st", "m1"))
    assert bg.run(bg.api.consumer_info("S", "st-m1")) is not None

    @dag(dag_id="cg_op_delete_static", schedule=None, default_args={"on_failure_callback": failures, "trigger_rule": "all_done"})
    def d2():
        first = DeleteConsumerGroupOperator(task_id="delete", stream="S", group="st", nats_conn_id=nats_conn_id)
        again = DeleteConsumerGroupOperator(task_id="delete_again", stream="S", group="st", nats_conn_id=nats_conn_id)
        strict = DeleteConsumerGroupOperator(
            task_id="delete_strict", stream="S", group="st", ignore_missing=False, nats_conn_id=nats_conn_id
        )
        first >> again >> strict

    result = airflow_env.run_dag(d2())
    assert result.xcom("delete") == {"stream": "S", "group": "st", "kind": "static", "deleted": True}
    assert result.xcom("delete_again") == {"stream": "S", "group": "st", "kind": None, "deleted": False}
    assert result.state_of("delete_strict") == "failed"
    assert "does not exist" in str(failures.seen["delete_strict"])
    assert bg.kv(STATIC_BUCKET, "S.st") is None
    assert bg.run(bg.api.consumer_info("S", "st-m1")) is None
    assert bg.run(bg.api.stream_info("S"))["config"]["name"] == "S"


# --- membership -----------------------------------------------------------------------------


def test_membership_operators_change_the_assignment_and_the_member_consumers(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import (
        AddMembersOperator,
        CreateConsumerGroupOperator,
        DeleteConsumerGroupOperator,
        DeleteMemberMappingsOperator,
        DropMembersOperator,
        SetMemberMappingsOperator,
    )

    common = {"stream": "ORDERS", "group": "workers", "nats_conn_id": nats_conn_id}

    @dag(dag_id="cg_op_create_for_members", schedule=None)
    def setup():
        CreateConsumerGroupOperator(task_id="create", **elastic_kwargs(nats_conn_id, members=["m1"]))

    assert airflow_env.run_dag(setup()).state == "success"
    # m1 is running: it has a consumer, which the transitions must move along
    bg.run(bg.cg.ensure_member_consumer("ORDERS", "workers", "m1"))

    def filters(member: str):
        info = bg.run(bg.api.consumer_info("ORDERS-workers", member))
        return None if info is None else sorted(info["config"]["filter_subjects"])

    assert filters("m1") == ["0.orders.*", "1.orders.*", "2.orders.*", "3.orders.*"]

    @dag(dag_id="cg_op_members", schedule=None, params={"new": "m2,m3"})
    def d():
        add = AddMembersOperator(task_id="add", members="{{ params.new }}", **common)
        add_again = AddMembersOperator(task_id="add_again", members=["m2", "m3"], **common)
        drop = DropMembersOperator(task_id="drop", members=["m3"], **common)
        add >> add_again >> drop

    result = airflow_env.run_dag(d())
    assert result.state == "success"
    assert result.xcom("add")["changed"] is True
    assert result.xcom("add")["assignment"] == {"m1": [0, 3], "m2": [1], "m3": [2]}
    assert result.xcom("add_again")["changed"] is False
    assert result.xcom("drop")["config"]["members"] == ["m1", "m2"]
    assert result.xcom("drop")["assignment"] == {"m1": [0, 1], "m2": [2, 3]}
    assert filters("m1") == ["0.orders.*", "1.orders.*"]  # re-created with its new partitions
    assert json.loads(bg.kv(ELASTIC_BUCKET, "ORDERS.workers"))["members"] == ["m1", "m2"]

    @dag(dag_id="cg_op_mappings", schedule=None)
    def d2():
        set_ = SetMemberMappingsOperator(task_id="set", mappings={"m1": [3], "m9": [0, 1, 2]}, **common)
        delete = DeleteMemberMappingsOperator(task_id="delete_mappings", **common)
        delete_again = DeleteMemberMappingsOperator(task_id="delete_mappings_again", **common)
        set_ >> delete >> delete_again

    result = airflow_env.run_dag(d2())
    assert result.state == "success"
    assert result.xcom("set")["assignment"] == {"m1": [3], "m9": [0, 1, 2]}
    assert result.xcom("set")["config"]["member_mappings"] == [
        {"member": "m1", "partitions": [3]},
        {"member": "m9", "partitions": [0, 1, 2]},
    ]
    assert result.xcom("delete_mappings")["changed"] is True
    assert result.xcom("delete_mappings")["assignment"] == {}
    assert result.xcom("delete_mappings_again")["changed"] is False
    stored = json.loads(bg.kv(ELASTIC_BUCKET, "ORDERS.workers"))
    assert "member_mappings" not in stored and "members" not in stored
    assert filters("m1") is None  # no longer a member: its consumer is gone

    @dag(dag_id="cg_op_sticky", schedule=None)
    def d_sticky():
        add = AddMembersOperator(task_id="add", members=["a", "b"], assignment="sticky", **common)
        add_c = AddMembersOperator(task_id="add_c", members="c", assignment="{{ 'sticky' }}", **common)
        add >> add_c

    result = airflow_env.run_dag(d_sticky())
    assert result.state == "success", result.ti_states
    assert result.xcom("add")["assignment"] == {"a": [0, 1], "b": [2, 3]}
    assert result.xcom("add_c")["assignment"] == {"a": [0, 1], "b": [2], "c": [3]}  # one partition moved
    assert "members" not in json.loads(bg.kv(ELASTIC_BUCKET, "ORDERS.workers"))  # orbit's member_mappings

    @dag(dag_id="cg_op_delete_elastic", schedule=None)
    def d3():
        DeleteConsumerGroupOperator(task_id="delete", **common)

    result = airflow_env.run_dag(d3())
    assert result.xcom("delete")["deleted"] is True
    assert bg.kv(ELASTIC_BUCKET, "ORDERS.workers") is None
    assert bg.run(bg.api.list_consumers("ORDERS")) == []

    async def wq_gone():
        from airflow_provider_cg.core.errors import JetStreamApiError

        try:
            await bg.api.stream_info("ORDERS-workers")
        except JetStreamApiError as e:
            return e.err_code == 10059
        return False

    assert bg.run(wq_gone())


# --- status and step-down -------------------------------------------------------------------


def test_status_then_step_down_moves_the_pin(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import (
        ConsumerGroupStatusOperator,
        CreateConsumerGroupOperator,
        StepDownMemberOperator,
    )

    @dag(dag_id="cg_op_create_for_status", schedule=None)
    def setup():
        CreateConsumerGroupOperator(
            task_id="create", **elastic_kwargs(nats_conn_id, max_members=2, members=["m1", "m2"])
        )

    assert airflow_env.run_dag(setup()).state == "success"
    bg.run(bg.cg.ensure_member_consumer("ORDERS", "workers", "m1", ack_wait=5))
    keys = [f"k{i}" for i in range(40)]
    bg.publish([f"orders.{k}" for k in keys])
    expected = {0: 0, 1: 0}
    for k in keys:
        expected[partition_of(f"orders.{k}", 2, (1,), "orders.*")] += 1

    async def sourced() -> int:
        for _ in range(200):
            n = (await bg.api.stream_info("ORDERS-workers"))["state"]["messages"]
            if n >= 40:
                return n
            await asyncio.sleep(0.05)
        return n

    assert bg.run(sourced()) == 40
    # instance A of m1 takes 5 messages and holds them (ack pending) -- it is pinned
    a, b = Puller(bg.nc, "ORDERS-workers", "m1"), Puller(bg.nc, "ORDERS-workers", "m1")
    held = bg.run(a.pull(batch=5, expires=2))
    assert len(held) == 5 and a.pin

    @dag(dag_id="cg_op_status_step_down", schedule=None)
    def d():
        common = {"stream": "ORDERS", "group": "workers", "nats_conn_id": nats_conn_id}
        ConsumerGroupStatusOperator(task_id="status", **common) >> StepDownMemberOperator(
            task_id="step_down", member="m1", **common
        )

    result = airflow_env.run_dag(d())
    assert result.state == "success"
    st = result.xcom("status")
    assert st["kind"] == "elastic" and st["max_members"] == 2
    assert st["partitions"] == {"0": expected[0], "1": expected[1]} and st["backlog"] == 40
    by = {m["member"]: m for m in st["members"]}
    assert by["m1"]["partitions"] == [0] and by["m1"]["pinned_id"] == a.pin
    assert by["m1"]["num_ack_pending"] == 5 and by["m1"]["num_pending"] == expected[0] - 5
    assert by["m1"]["backlog"] == expected[0]
    assert by["m2"]["consumer_exists"] is False and st["inactive_members"] == ["m2"]
    assert result.xcom("step_down") == {
        "stream": "ORDERS", "group": "workers", "member": "m1", "unpinned_id": a.pin,
    }

    # the old holder's messages are acked (the server waits for in-flight ones), then a
    # standby instance gets the pin and A is refused
    for m in held:
        assert bg.run(a.ack(m))
    got = bg.run(b.pull(batch=1, expires=3))
    assert len(got) == 1 and b.pin and b.pin != a.pin
    [state] = [s for s in bg.run(bg.cg.member_info("ORDERS", "workers")) if s.member == "m1"]
    assert state.pinned_id == b.pin
    assert bg.run(a.pull(batch=1, expires=0.3, _retry=False)) == [] and a.last_status == "423"


# --- reset ---------------------------------------------------------------------------------


def test_reset_operator_plans_then_applies(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator, ResetConsumerGroupOperator

    @dag(dag_id="cg_op_create_for_reset", schedule=None)
    def setup():
        CreateConsumerGroupOperator(
            task_id="create", **elastic_kwargs(nats_conn_id, max_members=2, members=["m1", "m2"])
        )

    assert airflow_env.run_dag(setup()).state == "success"
    bg.publish([f"orders.k{i}" for i in range(30)])

    async def sourced() -> int:
        for _ in range(200):
            n = (await bg.api.stream_info("ORDERS-workers"))["state"]["messages"]
            if n >= 30:
                return n
            await asyncio.sleep(0.05)
        return n

    assert bg.run(sourced()) == 30

    @dag(dag_id="cg_op_reset", schedule=None)
    def d():
        common = {"stream": "ORDERS", "group": "workers", "nats_conn_id": nats_conn_id}
        ResetConsumerGroupOperator(task_id="plan", to_latest=True, **common) >> ResetConsumerGroupOperator(
            task_id="apply", member="{{ 'm1' }}", to_latest=True, dry_run=False, **common)

    result = airflow_env.run_dag(d())
    assert result.state == "success"
    plan, applied = result.xcom("plan"), result.xcom("apply")
    assert plan["executed"] is False and plan["skip"] == 30 and plan["member"] is None
    assert applied["executed"] is True and applied["member"] == "m1"
    m1_skip = applied["skip"]
    assert 0 < m1_skip < 30 and {c["member"] for c in applied["changes"]} == {"m1"}
    # m1's partition is empty now, m2's kept its messages
    assert bg.run(bg.api.stream_info("ORDERS-workers"))["state"]["messages"] == 30 - m1_skip
    with pytest.raises(ConfigError, match="reset: give exactly one of"):
        from airflow_provider_cg.operators.groups import ResetConsumerGroupOperator as Op

        Op(task_id="x", stream="ORDERS", group="workers", to_latest=True, to_earliest=True)


def test_resize_operator_plans_then_resizes(airflow_env, nats_conn_id, bg):
    from airflow.sdk import dag

    from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator, ResizeConsumerGroupOperator

    @dag(dag_id="cg_op_create_for_resize", schedule=None)
    def setup():
        CreateConsumerGroupOperator(
            task_id="create", **elastic_kwargs(nats_conn_id, max_members=2, members=["m1", "m2"])
        )

    assert airflow_env.run_dag(setup()).state == "success"

    @dag(dag_id="cg_op_resize", schedule=None)
    def d():
        common = {"stream": "ORDERS", "group": "workers", "nats_conn_id": nats_conn_id}
        ResizeConsumerGroupOperator(task_id="plan", max_members=4, **common) >> ResizeConsumerGroupOperator(
            task_id="apply", max_members="{{ 2 * 2 }}", dry_run=False, drain_timeout=10, **common)

    result = airflow_env.run_dag(d())
    assert result.state == "success"
    plan, applied = result.xcom("plan"), result.xcom("apply")
    assert plan["state"] == "planned" and plan["new_partitions"] == {"m1": [0, 1], "m2": [2, 3]}
    assert applied["state"] == "done" and applied["new_max_members"] == 4
    assert bg.run(bg.cg.get("ORDERS", "workers")).config.max_members == 4
    wq = bg.run(bg.api.stream_info("ORDERS-workers"))["config"]
    assert wq["sources"][0]["subject_transforms"][0]["dest"].startswith("{{Partition(4,")
    with pytest.raises(ConfigError, match="max_members"):
        ResizeConsumerGroupOperator(task_id="x", stream="ORDERS", group="workers", max_members=0)


def test_layout_operators_create_in_and_move_between_layouts(airflow_env, nats_conn_id, bg):
    """CreateConsumerGroupOperator(layout=...) and MoveConsumerGroupLayoutOperator under a real
    DAG run: the group gets its partition streams, then moves back (nothing to drain)."""
    from airflow.sdk import dag

    from airflow_provider_cg.core.groups.layouts.partition_streams import partition_streams_of
    from airflow_provider_cg.operators.groups import (
        CreateConsumerGroupOperator,
        MoveConsumerGroupLayoutOperator,
    )

    @dag(dag_id="cg_op_layouts", schedule=None)
    def d():
        common = {"stream": "ORDERS", "group": "workers", "nats_conn_id": nats_conn_id}
        CreateConsumerGroupOperator(task_id="create", layout="partition-streams",
                                    **elastic_kwargs(nats_conn_id, max_members=3)) >> \
            MoveConsumerGroupLayoutOperator(task_id="back", layout="{{ 'work-queue' }}", wait=10, **common)

    result = airflow_env.run_dag(d())
    assert result.state == "success"
    assert result.xcom("back") == {"stream": "ORDERS", "group": "workers", "layout": "work-queue", "done": True,
                                   "left": {}}
    assert bg.run(bg.cg.status("ORDERS", "workers")).layout == "work-queue"
    assert bg.run(partition_streams_of(bg.api, "ORDERS-workers")) == []
    with pytest.raises(ConfigError) as e:
        MoveConsumerGroupLayoutOperator(task_id="x", stream="ORDERS", group="workers", layout="sideways")
    assert e.value.field == "layout"
    with pytest.raises(ConfigError) as e:
        CreateConsumerGroupOperator(task_id="y", layout="partition-streams",
                                    **elastic_kwargs(nats_conn_id, kind="static", partitioning_filters=None,
                                                     filters=["orders.*"]))
    assert e.value.field == "layout"
