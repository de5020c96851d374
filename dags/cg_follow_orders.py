"""Example DAG 6: the orders landed continuously by followers, fresh within seconds.

Each member's task is a follower (``follow``): one spark-submit that keeps its member's pin and
lands new orders as they arrive, a batch every ``commit_interval`` (1 s) or ``batch_size``
messages, for ``CG_FOLLOW_SECONDS`` (10 minutes), then hands its pin over. The DAG is
``@continuous`` with two runs at a time and a start date in the past: the next run's followers
start ``handover_wait`` (2 minutes) before the running ones' follow time ends (deferred until
then), wait for the pin warm, and the running ones land on until they are, then pass the pin
within a batch: the table never waits for a Spark start. Spark starts once per task, not once
per batch.

It waits for the group (DAG 1 creates it) rather than failing in a loop, then lands as example
DAG 1 does (same group, same transformation, same ``paid_orders`` table),
so it is safe beside the others: a member's pin is held by one instance at a time, and every
writer of the table lands each order once, in per-key order. While followers hold the pins, DAG
1's scheduled members find them taken and are skipped (``not-pinned``) after their standby wait;
pause one of the two. Settings from environment variables: ``CG_FOLLOW_STREAM``,
``CG_FOLLOW_GROUP``, ``CG_FOLLOW_SECONDS``, ``CG_FOLLOW_HANDOVER_SECONDS``, ``CG_FOLLOW_NATS_CONN_ID``,
``CG_FOLLOW_SPARK_CONN_ID``
and the table's (``CG_FOLLOW_SINK``, ``..._SINK_PATH``, ``..._PAYLOAD_FORMAT``,
``..._TRANSFORM``, ``..._AWS_CONN_ID``: ``airflow_provider_cg.examples.orders_landing``). On a
cron schedule instead, ``follow="until-next-run"`` follows until the next run starts.
"""

from __future__ import annotations

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
FOLLOW = _env("SECONDS", "600")
HANDOVER = _env("HANDOVER_SECONDS", "120")
LANDING = orders_landing("CG_FOLLOW_")

with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Continuous landing: one follower per member, each a spark-submit that lands what arrives",
    schedule="@continuous",
    # a start date in the past: without one Airflow's first continuous run spans no time and the
    # scheduler never starts a second (docs/how-to/follow.md); continuous runs do not catch up
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,  # the next run's followers start before this one's end, to relieve them warm
    tags=["nats", "consumer-groups", "spark", "example"],
    doc_md=__doc__,
) as dag:
    @task.sensor(task_id="group_exists", poke_interval=30, mode="reschedule", timeout=7 * 24 * 3600)
    def group_exists() -> bool:
        """Until DAG 1 (or you) created the group: a continuous DAG must not fail in a loop."""
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
