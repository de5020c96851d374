"""Example DAG 2: overflow scale-out of a NATS JetStream consumer group.

When the group's backlog crosses a threshold: one spark-submit per member lands its backlog
(``drain``; a member whose follower lands already, example DAG 6, is skipped), and one per
temporary overflow member (``overflow``: ``ox1``, ``ox2``) joins the group once its Spark is
warm (``join=True``), lands the partitions it takes, and leaves. A partition moves to an
overflow member only when that member can serve it, and back to its previous owner as the
member leaves: no partition waits for a Spark start. ``restore`` (``trigger_rule="all_done"``)
drops the overflow members a job could not (a killed task). Membership changes move
partitions with the group's safe transition and an elastic group's work-queue stream deletes
a message only once it is acked, so no message is lost or landed twice across the change;
the sink's dedupe on ``(origin_stream, origin_seq)`` covers redeliveries. The drain lands as example DAG 1 does
(same transformation, same ``paid_orders`` table): the overflow of a group is more of its
consumers, not another pipeline.

Two DAGs, same tasks:

- ``cg_overflow_scaleout``: scheduled on an Asset whose ``AssetWatcher`` runs
  ``MessageQueueTrigger(scheme="nats-cg", ..., min_pending=threshold)`` in the triggerer; one
  DAG run per crossing of the threshold.
- ``cg_overflow_scaleout_sensor``: no schedule (trigger it, or give it one); its first task is
  a deferrable ``GroupOverflowSensor`` waiting for the same threshold.

The watcher's arguments are fixed when the file is parsed, so stream, group, threshold and
connections come from environment variables (``CG_OVERFLOW_STREAM``, ``CG_OVERFLOW_GROUP``,
``CG_OVERFLOW_THRESHOLD``, ``CG_OVERFLOW_MEMBERS``, ``CG_OVERFLOW_NATS_CONN_ID``,
``CG_OVERFLOW_SPARK_CONN_ID``, ``CG_OVERFLOW_POKE_INTERVAL``, and the table's: ``..._SINK``,
``..._SINK_PATH``, ``..._PAYLOAD_FORMAT``, ``..._TRANSFORM``, ``..._AWS_CONN_ID``, see
``airflow_provider_cg.examples.orders_landing``), which are also the params' defaults.
The overflow members must not be regular members of the group: restoring drops them.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, Param, task

from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, landing_asset, landing_report, orders_landing
from airflow_provider_cg.operators.groups import DropMembersOperator
from airflow_provider_cg.operators.members import ConsumerGroupMembersOperator
from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator
from airflow_provider_cg.sensors.overflow import GroupOverflowSensor

DAG_ID = "cg_overflow_scaleout"
SENSOR_DAG_ID = "cg_overflow_scaleout_sensor"


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CG_OVERFLOW_{name}") or default


STREAM = _env("STREAM", "ORDERS")
GROUP = _env("GROUP", "orders-lake")
THRESHOLD = int(_env("THRESHOLD", "10000"))
OVERFLOW_MEMBERS = [m.strip() for m in _env("MEMBERS", "ox1,ox2").split(",") if m.strip()]
NATS_CONN_ID = _env("NATS_CONN_ID", "nats_default")
SPARK_CONN_ID = _env("SPARK_CONN_ID", "spark_default")
LANDING = orders_landing("CG_OVERFLOW_")

PARAMS = {
    "stream": Param(STREAM, type="string"),
    "group": Param(GROUP, type="string"),
    "overflow_members": Param(OVERFLOW_MEMBERS, type="array", description="added for the drain, then dropped"),
    "sink_path": Param(LANDING["sink_path"], type="string"),
    "nats_conn_id": Param(NATS_CONN_ID, type="string"),
    "spark_conn_id": Param(SPARK_CONN_ID, type="string"),
}

backlog_asset = Asset(
    f"cg_backlog_{STREAM}_{GROUP}",
    watchers=[
        AssetWatcher(
            name=f"{STREAM}-{GROUP}-overflow",
            trigger=MessageQueueTrigger(
                scheme="nats-cg", stream=STREAM, group=GROUP, min_pending=THRESHOLD,
                poke_interval=float(_env("POKE_INTERVAL", "10")), nats_conn_id=NATS_CONN_ID,
            ),
        )
    ],
)


def scale_out_and_drain() -> Any:
    """members >> [drain (per member), overflow (per overflow member)] >> restore (all_done)
    >> report; returns the head."""
    common = {"stream": "{{ params.stream }}", "group": "{{ params.group }}", "nats_conn_id": "{{ params.nats_conn_id }}"}
    members = ConsumerGroupMembersOperator(task_id="members", **common)
    landing = {**LANDING, "sink_path": "{{ params.sink_path }}", "conn_id": "{{ params.spark_conn_id }}",
               "map_index_template": "{{ task.member }}", "max_active_tis_per_dagrun": 8,
               "outlets": [landing_asset(LANDING)], **common}  # what each member landed, as an asset event
    # the group's members land their backlog (a member a follower holds is skipped: it lands already)
    drain = ConsumerGroupSparkSubmitOperator.partial(task_id="drain", **landing).expand_kwargs(members.output)

    @task(task_id="overflow_members")
    def overflow_members(params: Any = None) -> list[str]:
        return list(params["overflow_members"])

    # each overflow member joins once its Spark is warm, lands its partitions' backlog, leaves
    overflow = ConsumerGroupSparkSubmitOperator.partial(task_id="overflow", join=True, **landing).expand(
        member=overflow_members())
    restore = DropMembersOperator(task_id="restore", members=OVERFLOW_MEMBERS, trigger_rule="all_done",
                                  **common)  # the overflow members' own leave, if a job could not
    restore.members = "{{ params.overflow_members | join(',') }}"

    @task(task_id="report", trigger_rule="none_failed")
    def report(ti: Any = None) -> dict[str, Any]:
        """What the drain and the overflow landed per member (``examples.landing_report``) and
        the membership after the restore."""
        landed = [*_as_list(ti.xcom_pull(task_ids="drain")), *_as_list(ti.xcom_pull(task_ids="overflow"))]
        out = landing_report(landed)
        out["assignment"] = (ti.xcom_pull(task_ids="restore") or {}).get("assignment")
        print(f"membership after the restore: {out['assignment']}")
        return out

    # report also waits for the landing tasks, so a failed one fails the run after the restore.
    members >> [drain, overflow]
    [drain, overflow] >> restore
    [drain, overflow, restore] >> report()
    return members


def _as_list(pulled: Any) -> list[dict[str, Any]]:
    """A mapped task's summaries as a list (one summary when it was mapped once)."""
    if not pulled:
        return []
    return [pulled] if isinstance(pulled, dict) else [s for s in pulled if s]


with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Overflow scale-out: add members when the backlog crosses a threshold, drain, restore",
    schedule=[backlog_asset],
    catchup=False,
    max_active_runs=1,
    tags=["nats", "consumer-groups", "spark", "example"],
    params=PARAMS,
    doc_md=__doc__,
) as dag:
    scale_out_and_drain()


with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=SENSOR_DAG_ID,
    description="Overflow scale-out, waiting for the threshold with GroupOverflowSensor",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    tags=["nats", "consumer-groups", "spark", "example"],
    params=PARAMS,
    doc_md=__doc__,
) as sensor_dag:
    wait = GroupOverflowSensor(
        task_id="wait_overflow",
        stream="{{ params.stream }}",
        group="{{ params.group }}",
        min_pending=THRESHOLD,
        nats_conn_id="{{ params.nats_conn_id }}",
        poke_interval=float(_env("POKE_INTERVAL", "10")),
        timeout=6 * 3600,
    )
    wait >> scale_out_and_drain()
