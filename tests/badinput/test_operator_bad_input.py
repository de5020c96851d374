"""Bad arguments to the operators and the sensor: a ``ConfigError`` naming the field when the
DAG is parsed (or, for templated values, when the task runs), before any connection."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow]


def _refused(factory, cases) -> list[str]:
    failures = []
    for kwargs, field in cases:
        try:
            factory(**kwargs)
        except ConfigError as e:
            if not e.field.startswith(field):
                failures.append(f"{kwargs}: names {e.field!r}, expected {field!r}")
        except Exception as e:  # anything else is a crash, not an answer
            failures.append(f"{kwargs}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{kwargs}: accepted")
    return failures


def test_group_operators_refuse_bad_arguments(airflow_env):
    from airflow_provider_cg.operators.groups import (
        AddMembersOperator,
        CreateConsumerGroupOperator,
        SetMemberMappingsOperator,
        StepDownMemberOperator,
    )

    def create(**kw):
        return CreateConsumerGroupOperator(**{"task_id": "t", "stream": "S", "group": "g", "max_members": 4, **kw})

    failures = _refused(create, [
        ({"stream": "a b"}, "stream"), ({"group": "a.b"}, "group"), ({"stream": "a*"}, "stream"),
        ({"kind": "ring"}, "kind"), ({"max_members": 0}, "max_members"), ({"max_members": 10**9}, "max_members"),
        ({"max_members": "x"}, "max_members"), ({"max_members": True}, "max_members"),
        ({"members": ["a b"]}, "members"), ({"members": [1]}, "members"), ({"members": "[" * 5000}, "members"),
        ({"member_mappings": "[" * 100_000}, "member_mappings"), ({"member_mappings": {"m": [9]}}, "member_mappings"),
        ({"member_mappings": [{"member": None, "partitions": [0, 1, 2, 3]}]}, "member_mappings"),
        ({"partitioning_filters": ["foo"]}, "partitioning_filters"),
        ({"partitioning_filters": [{"filter": "a.*", "partitioning_wildcards": [3]}]}, "partitioning_filters"),
        ({"partitioning_filters": [{"filter": "a.*", "bogus": 1}]}, "partitioning_filters"),
        ({"kind": "static", "partitioning_filters": ["a.*"]}, "partitioning_filters"),
        ({"create_stream": {"subjects": []}}, "create_stream"), ({"create_stream": {"subjects": ["a b"]}}, "create_stream"),
        ({"create_stream": {"name": "other", "subjects": ["a"]}}, "create_stream"),
        ({"max_buffered_msgs": -1}, "max_buffered_msg"),
    ])
    failures += _refused(lambda **kw: AddMembersOperator(task_id="t", stream="S", group="g", **kw), [
        ({"members": []}, "members"), ({"members": ["*"]}, "members"), ({"members": ""}, "members")])
    failures += _refused(lambda **kw: SetMemberMappingsOperator(task_id="t", stream="S", group="g", **kw), [
        ({"mappings": []}, "member_mappings"), ({"mappings": "not json"}, "member_mappings")])
    failures += _refused(lambda **kw: StepDownMemberOperator(task_id="t", stream="S", group="g", **kw), [
        ({"member": "a>b"}, "member")])
    assert not failures, "\n".join(failures)


AVRO_OK = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}'


def test_sensor_and_spark_operator_refuse_bad_arguments(airflow_env):
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator
    from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

    failures = _refused(lambda **kw: GroupOverflowSensor(task_id="s", stream="S", group="g", **kw), [
        ({}, "min_pending"), ({"min_pending": 0}, "min_pending"), ({"min_pending": 1, "max_failures": 0}, "max_failures"),
        ({"min_pending": 1, "poke_interval": -1}, "poke_interval")])
    base = {"task_id": "c", "stream": "S", "group": "g", "member": "m1", "sink_path": "/lake"}
    failures += _refused(lambda **kw: ConsumerGroupSparkSubmitOperator(**{**base, **kw}), [
        ({"batch_size": 0}, "batch_size"), ({"batch_size": "1.5"}, "batch_size"), ({"max_seconds": float("nan")}, "max_seconds"),
        ({"ack_wait": -1}, "ack_wait"), ({"sink": "s3"}, "sink"), ({"member": "a b"}, "member"),
        ({"payload_format": "json"}, "json_schema"), ({"payload_format": "avro"}, "avro_schema"),
        ({"payload_format": "avro", "avro_schema": "{"}, "avro_schema"),
        ({"payload_format": "avro", "avro_schema": '{"type": "enum"}'}, "avro_schema"),
        ({"payload_format": "avro", "avro_schema": AVRO_OK, "avro_package": "spark-avro"}, "avro_package"),
        ({"follow": "until-next-rn"}, "follow"), ({"follow": "inf"}, "follow"), ({"follow": 0}, "follow"),
        ({"follow": "10m", "commit_interval": 0}, "commit_interval")])
    assert not failures, "\n".join(failures)
    # the operator's own word for a follower's time is named where it is refused
    with pytest.raises(ConfigError, match='or "until-next-run"'):
        ConsumerGroupSparkSubmitOperator(**base, follow="until-next-rn")


def test_what_the_job_refuses_the_operator_refuses_before_spark_submit(airflow_env):
    """The job's bad-input corpus (tests/unit/landing/test_contract.py), given to the operator:
    as literal arguments it is refused when the DAG is parsed; as a template that renders to
    it, when the task runs, before spark-submit (``_check(rendered=True)`` is the first step of
    ``execute``). Both name the same field the job names."""
    from airflow_provider_cg.core.landing.contract import MemberJobSpec
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator
    from tests.unit.landing.test_contract import BAD, BASE

    failures = []
    for over, field in BAD:
        with pytest.raises(ConfigError) as job:
            MemberJobSpec.build({**BASE, **over})
        assert job.value.field == field
        kwargs = {"task_id": "t", **BASE, **over, "pg_conn_id": "pg"}
        failures += _refused(lambda kw=kwargs: ConsumerGroupSparkSubmitOperator(**kw), [({}, field)])
        templated = {k: "{{ params.v }}" for k in over if over[k] is not None and k != "transform"}
        if templated:  # renders to the bad value at run time
            op = ConsumerGroupSparkSubmitOperator(**{**kwargs, **templated})
            for k in templated:
                setattr(op, k, over[k])
            try:
                op._check(rendered=True)
                failures.append(f"{over}: accepted once rendered")
            except ConfigError as e:
                if e.field != field:
                    failures.append(f"{over}: rendered, names {e.field!r}, expected {field!r}")
    assert not failures, "\n".join(failures)


def test_mapped_tasks_are_refused_when_the_dag_is_parsed(airflow_env):
    """The same corpus given to ``.partial()`` (the member mapped by ``.expand()``), to a literal
    ``.expand()`` and to a literal ``.expand_kwargs()``: refused when the DAG file is parsed,
    naming the field, not when the land task runs after the group and members tasks; what
    ``.partial()`` leaves to the mapping (here the member) is not judged before it is known."""
    import inspect

    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.spark import JOB_FIELDS
    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator as Op
    from tests.unit.landing.test_contract import BAD, BASE

    params = inspect.signature(Op.__init__).parameters
    defaults = {f: params[f].default for f in JOB_FIELDS}  # every field given: only the member is mapped

    def mapped(how: str, over: dict) -> None:
        given = {k: v for k, v in {**defaults, **BASE, **over}.items() if k != "member"}
        with DAG(f"d_{how}", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
            if how == "partial":
                Op.partial(task_id="t", **given, pg_conn_id="pg").expand(member=["m1", "m2"])
            elif how == "expand":  # the bad values mapped, each a literal list
                first = {k: v for k, v in given.items() if k not in over}
                Op.partial(task_id="t", **first, pg_conn_id="pg").expand(
                    member=["m1", "m2"], **{k: [v] for k, v in over.items()})
            else:
                first = {k: v for k, v in given.items() if k not in over}
                Op.partial(task_id="t", **first, pg_conn_id="pg").expand_kwargs([{"member": "m1", **over}])

    failures = []
    for over, field in BAD:
        if "member" in over or field == "member":
            continue  # mapped here: its rules wait for its value
        for how in ("partial", "expand", "expand_kwargs"):
            failures += [f"{how} {over}: {f}" for f in _refused(lambda h=how, o=over: mapped(h, o), [({}, field)])]
    assert not failures, "\n".join(failures)
    # the right arguments parse, whatever is mapped or templated
    with DAG("d_ok", schedule=None, start_date=pendulum.datetime(2024, 1, 1)):
        Op.partial(task_id="a", stream="S", group="g", sink="delta").expand(sink_path=["/tmp/x"], member=["m1"])
        Op.partial(task_id="b", stream="S", group="g", sink="{{ params.sink }}", follow="until-next-run") \
            .expand_kwargs([{"member": "m1", "sink_path": "/tmp/y"}])


def test_a_continuous_dag_without_a_start_date_is_refused_when_parsed(airflow_env):
    """Airflow gives such a DAG's first run a zero-length interval and never starts a second:
    a landing task in it, mapped or not, names ``start_date``; the DAG's own start date or one
    from ``default_args`` is enough, and other schedules need none."""
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator as Op

    def build(schedule, mapped: bool, **dag_args) -> None:
        with DAG("c", schedule=schedule, max_active_runs=1, **dag_args):
            if mapped:
                Op.partial(task_id="t", stream="S", group="g", sink_path="/tmp/l", follow="60s").expand(member=["m1"])
            else:
                Op(task_id="t", stream="S", group="g", member="m1", sink_path="/tmp/l", follow="60s")

    past = pendulum.datetime(2025, 1, 1)
    for mapped in (False, True):
        with pytest.raises(ConfigError, match="^start_date: the @continuous DAG 'c' needs one"):
            build("@continuous", mapped)
        build("@continuous", mapped, start_date=past)
        build("@continuous", mapped, default_args={"start_date": past})
        build(None, mapped)
