"""Example DAG 6: the orders landed continuously by followers, fresh within seconds.

Each member's task is a follower (``follow``): one spark-submit that keeps its member's pin and
lands new orders as they arrive, a batch every ``commit_interval`` (1 s) or ``batch_size``
messages, until the DAG's next run (``follow="until-next-run"``), then hands its pin over. The
DAG runs every ``CG_FOLLOW_SECONDS`` (10 minutes) with a start date in the past and two runs at a
time: the next run's followers start while this one's still land, warm Spark up and wait for the
pins; this run's followers land on (``handover_wait``, 2 minutes at most) until they are ready,
then pass each pin within a batch. So the table never waits for a Spark start between runs, and
Spark starts once per task, not once per batch. (An ``@continuous`` DAG cannot do this: Airflow
runs one of its runs at a time, so the next one's Spark starts only after this one has ended.)

It waits for the group (DAG 1 creates it) rather than failing in a loop, then lands as example
DAG 1 does (same group, same transformation, same ``paid_orders`` table),
so it is safe beside the others: a member's pin is held by one instance at a time, and every
writer of the table lands each order once, in per-key order. While followers hold the pins, DAG
1's scheduled members find them taken and are skipped (``not-pinned``) after their standby wait;
pause one of the two. Settings from environment variables: ``CG_FOLLOW_STREAM``,
``CG_FOLLOW_GROUP``, ``CG_FOLLOW_SECONDS``, ``CG_FOLLOW_FOLLOW`` (``until-next-run``, or a fixed
time), ``CG_FOLLOW_HANDOVER_SECONDS``, ``CG_FOLLOW_NATS_CONN_ID``, ``CG_FOLLOW_SPARK_CONN_ID``
and the table's (``CG_FOLLOW_SINK``, ``..._SINK_PATH``, ``..._PAYLOAD_FORMAT``,
``..._TRANSFORM``, ``..._AWS_CONN_ID``: ``airflow_provider_cg.examples.orders_landing``).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, landing_asset, landing_report, orders_landing
from airflow_provider_cg.operators.members import ConsumerGroupMembersOperator
from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

DAG_ID = "cg_follow_orders"


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CG_FOLLOW_{name}") or default


STREAM = _env("STREAM", "ORDERS")
GROUP = _env("GROUP", "orders-lake")
EVERY = float(_env("SECONDS", "600"))
FOLLOW = _env("FOLLOW", "until-next-run")
HANDOVER = _env("HANDOVER_SECONDS", "120")
LANDING = orders_landing("CG_FOLLOW_")

with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Continuous landing: one follower per member, each a spark-submit that lands what arrives",
    schedule=dt.timedelta(seconds=EVERY),
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,  # the first run at once, none for the intervals before
    max_active_runs=2,  # the next run's followers start while this one's land, to relieve them warm
    tags=["nats", "consumer-groups", "spark", "example"],
    doc_md=__doc__,
) as dag:
    @task.sensor(task_id="group_exists", poke_interval=30, mode="reschedule", timeout=7 * 24 * 3600)
    def group_exists() -> bool:
        """Until DAG 1 (or you) created the group: a DAG that runs all the time must not fail in a loop."""
        from airflow_provider_cg.core.errors import GroupNotFound
        from airflow_provider_cg.hooks.nats import NatsHook
        from airflow_provider_cg.operators.members import member_states

        try:
            member_states(NatsHook(nats_conn_id=_env("NATS_CONN_ID", "nats_default")), STREAM, GROUP)
        except GroupNotFound:
            return False
        return True

    members = ConsumerGroupMembersOperator(task_id="members", stream=STREAM, group=GROUP,
                                           nats_conn_id=_env("NATS_CONN_ID", "nats_default"))
    follow = ConsumerGroupSparkSubmitOperator.partial(
        task_id="follow",
        stream=STREAM,
        group=GROUP,
        **LANDING,
        follow=FOLLOW,
        handover_wait=HANDOVER,
        commit_interval=1.0,
        nats_conn_id=_env("NATS_CONN_ID", "nats_default"),
        conn_id=_env("SPARK_CONN_ID", "spark_default"),
        map_index_template="{{ task.member }}",
        outlets=[landing_asset(LANDING)],
    ).expand_kwargs(members.output)

    @task(task_id="report", trigger_rule="none_failed")
    def report(ti: Any = None) -> dict[str, Any]:
        """What each follower landed (``examples.landing_report``)."""
        return landing_report(ti.xcom_pull(task_ids="follow") or [])

    group_exists() >> members
    follow >> report()
