"""Example DAG 1: scheduled partitioned consumption of a NATS JetStream consumer group.

Every 15 minutes (Variable ``cg_scheduled_consumption_schedule`` overrides the cron):
ensure the elastic group exists (idempotent), fan out one spark-submit per member (each
lands its partitions' backlog into the ``paid_orders`` table, exactly once, through the
transformation ``cg_order_transforms:paid_orders``: parse the orders, drop cancelled ones, add
a derived column), then summarise what landed: per member the messages read and landed, the
rows written (fewer than messages: cancelled orders are dropped), duplicates skipped and
dead-lettered messages.

The table's format is a parameter: ``delta`` (default; ``sink_path`` is a directory or an
``s3://bucket/prefix`` with ``aws_conn_id``), ``iceberg`` (``iceberg_table`` in the SQL catalog
``iceberg_catalog_uri``, created under ``iceberg_warehouse``) or ``parquet`` (the provider's
own commit log in a directory). Connections: ``nats_default`` (type ``nats``) and
``spark_default`` (type ``spark``, host ``local[*]`` or a cluster master).

What is guaranteed: every paid order published to ``ORDERS`` lands in the table once, and each
customer's orders in stream order, whatever else writes the same table at the same time
(``cg_backfill``, the overflow drain, a replay after ``cg reset``, a standby taking over) and
through kills, stalls and server restarts. A retryable failure is retried (exit 2); invalid
input fails at once (exit 1). If ``ORDERS`` is deleted and created again, the runs fail with
the creation times until the param ``stream_life`` (``new:<created>``) is given; its orders
then land as ``ORDERS#2``. Each run's asset event goes on the table it wrote.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import DAG, AssetAlias, Param, task

from airflow_provider_cg.assets import LANDED_TABLES
from airflow_provider_cg.examples import (
    EXAMPLE_DEFAULT_ARGS,
    ORDERS_JSON_SCHEMA,
    ORDERS_TABLE,
    ORDERS_TRANSFORM,
    iceberg_defaults,
    lake_dir,
    landing_report,
    table_formats,
)
from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator
from airflow_provider_cg.operators.members import ConsumerGroupMembersOperator
from airflow_provider_cg.operators.spark import ConsumerGroupSparkSubmitOperator

DAG_ID = "cg_scheduled_consumption"
DEFAULT_SCHEDULE = "*/15 * * * *"
SCHEDULE_VARIABLE = "cg_scheduled_consumption_schedule"


def _schedule() -> str:
    """The cron from the Airflow Variable (or ``AIRFLOW_VAR_...``), else every 15 minutes."""
    env = os.environ.get("AIRFLOW_VAR_" + SCHEDULE_VARIABLE.upper())
    if env:
        return env
    try:
        from airflow.sdk import Variable

        return Variable.get(SCHEDULE_VARIABLE, default=DEFAULT_SCHEDULE)
    except Exception:  # no metadata DB / API reachable while parsing
        return DEFAULT_SCHEDULE


def create_group_task() -> CreateConsumerGroupOperator:
    """The group, from the DAG's params (every argument of the operator is templated)."""
    return CreateConsumerGroupOperator(
        task_id="ensure_group",
        stream="{{ params.stream }}",
        group="{{ params.group }}",
        max_members="{{ params.max_members }}",
        members="{{ params.members }}",
        partitioning_filters=[
            {"filter": "{{ params.partitioning_filter }}", "partitioning_wildcards": "{{ params.partitioning_wildcards }}"}
        ],
        create_stream={"subjects": "{{ params.stream_subjects }}"},
        nats_conn_id="{{ params.nats_conn_id }}",
    )


with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Scheduled partitioned consumption: one spark-submit per consumer-group member",
    schedule=_schedule(),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    tags=["nats", "consumer-groups", "spark", "example"],
    params={
        "stream": Param("ORDERS", type="string"),
        "stream_subjects": Param(["orders.>"], type="array", description="when the stream must be created"),
        "group": Param("orders-lake", type="string"),
        "members": Param(["m1", "m2", "m3"], type="array"),
        "max_members": Param(6, type="integer", minimum=1),
        "partitioning_filter": Param("orders.*", type="string"),
        "partitioning_wildcards": Param([1], type="array"),
        "table_format": Param("delta", enum=list(table_formats()), description="the table the members land into"),
        "sink_path": Param(lake_dir(ORDERS_TABLE), type="string", description="delta, parquet: where the table is"),
        **{k: Param(v, type="string", description="iceberg") for k, v in iceberg_defaults().items()},
        "aws_conn_id": Param(None, type=["null", "string"], description="an aws connection for s3:// tables"),
        "stream_life": Param(None, type=["null", "string"],
                             description="after ORDERS was deleted and created again: new:<created>, as a "
                                         "failed run's error names it"),
        "payload_format": Param("json", enum=["raw", "text", "json"]),
        "json_schema": Param(ORDERS_JSON_SCHEMA, type="string"),
        "nats_conn_id": Param("nats_default", type="string"),
        "spark_conn_id": Param("spark_default", type="string"),
        "read": Param("auto", enum=["auto", "executors", "consumer"],
                      description="who reads each batch from NATS: the Spark driver (auto) or the batch's Spark "
                                  "tasks (executors: reading grows with the cluster)"),
    },
    doc_md=__doc__,
) as dag:
    ensure_group = create_group_task()

    members = ConsumerGroupMembersOperator(
        task_id="members",
        stream="{{ params.stream }}",
        group="{{ params.group }}",
        nats_conn_id="{{ params.nats_conn_id }}",
    )

    consume = ConsumerGroupSparkSubmitOperator.partial(
        task_id="consume",
        stream="{{ params.stream }}",
        group="{{ params.group }}",
        sink="{{ params.table_format }}",
        # each sink's own options only (an option of another sink is refused; rendered natively, None
        # is no option)
        sink_path="{{ params.sink_path if params.table_format != 'iceberg' else None }}",
        iceberg_table="{{ params.iceberg_table if params.table_format == 'iceberg' else None }}",
        iceberg_catalog_uri="{{ params.iceberg_catalog_uri if params.table_format == 'iceberg' else None }}",
        iceberg_warehouse="{{ params.iceberg_warehouse if params.table_format == 'iceberg' else None }}",
        aws_conn_id="{{ params.aws_conn_id }}",
        payload_format="{{ params.payload_format }}",
        json_schema="{{ params.json_schema }}",
        # your code goes here: a function of the batch (a DataFrame) and its context
        transform=ORDERS_TRANSFORM,
        read="{{ params.read }}",
        stream_life="{{ params.stream_life }}",
        nats_conn_id="{{ params.nats_conn_id }}",
        conn_id="{{ params.spark_conn_id }}",
        map_index_template="{{ task.member }}",
        max_active_tis_per_dagrun=6,
        # each member's run emits an asset event on the table it wrote (derived from the rendered
        # params: paid_orders by default), saying what it landed (cg_paid_orders_report reads it)
        outlets=[AssetAlias(LANDED_TABLES)],
    ).expand_kwargs(members.output)

    @task(trigger_rule="none_failed")
    def summarise(ti: Any = None) -> dict[str, Any]:
        """Per member: messages read and landed, rows written, duplicates skipped, dead-lettered,
        and the messages read per partition (``examples.landing_report``)."""
        return landing_report(ti.xcom_pull(task_ids="consume") or [])

    ensure_group >> members >> consume >> summarise()
