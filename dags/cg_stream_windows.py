"""Example DAG 7: Spark Structured Streaming over a consumer group, one query per member.

Each member's task submits the example streaming application (``spark_apps/cg_stream_windows.py``):
a query over the ``cg_member`` source that counts the orders and their revenue per customer and
1-minute window of the time the group's stream stored them (the
``timestamp`` column), with a 10-second watermark, and appends each
closed window's row to a Delta table. The query holds its member's pin while it runs, keeps its
aggregation state in its checkpoint (one per member), and the source acknowledges a micro-batch's
orders only after Spark committed it: a task killed and retried goes on from its checkpoint, each
order counted once.

Every ``CG_STREAM_SECONDS`` (10 minutes) a run lands what the members hold (``available-now``)
and ends, as the landing tasks do. A window's row lands once the watermark has passed it: the
last minute's windows close in a later run. It reads its own group (``CG_STREAM_GROUP``,
``orders-windows``, which it creates elastic with three members beside DAG 1's): every group of
the stream gets every order. Settings: ``CG_STREAM_STREAM``, ``CG_STREAM_GROUP``,
``CG_STREAM_MEMBERS`` (``w1,w2,w3``), ``CG_STREAM_SECONDS``, ``CG_STREAM_WINDOW``, ``CG_STREAM_WATERMARK``, ``CG_STREAM_TABLE`` (default
``<lake>/order_windows``),
``CG_STREAM_CHECKPOINTS``, ``CG_STREAM_DELTA_PACKAGE``, ``CG_STREAM_NATS_CONN_ID``,
``CG_STREAM_SPARK_CONN_ID``.
"""

from __future__ import annotations

import datetime as dt
import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, lake_dir, spark_app
from airflow_provider_cg.operators.groups import CreateConsumerGroupOperator
from airflow_provider_cg.operators.members import ConsumerGroupMembersOperator
from airflow_provider_cg.operators.streaming import ConsumerGroupStreamingAppOperator

DAG_ID = "cg_stream_windows"


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CG_STREAM_{name}") or default


STREAM = _env("STREAM", "ORDERS")
GROUP = _env("GROUP", "orders-windows")
TABLE = _env("TABLE", lake_dir("order_windows"))
CHECKPOINTS = _env("CHECKPOINTS", lake_dir("_checkpoints", "order_windows"))
DELTA = _env("DELTA_PACKAGE", "io.delta:delta-spark_2.13:4.4.0")
NATS_CONN = _env("NATS_CONN_ID", "nats_default")
MEMBERS = [m.strip() for m in _env("MEMBERS", "w1,w2,w3").split(",") if m.strip()]

with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Structured Streaming over a consumer group: windowed revenue per customer into Delta",
    schedule=dt.timedelta(seconds=float(_env("SECONDS", "600"))),
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one query per member at a time: its checkpoint is the member's
    tags=["nats", "consumer-groups", "spark", "streaming", "example"],
    doc_md=__doc__,
) as dag:
    group = CreateConsumerGroupOperator(
        task_id="group", stream=STREAM, group=GROUP, max_members=6,
        partitioning_filters=[{"filter": "orders.*", "partitioning_wildcards": [1]}],
        members=MEMBERS, create_stream={"subjects": ["orders.>"]}, nats_conn_id=NATS_CONN)
    members = ConsumerGroupMembersOperator(task_id="members", stream=STREAM, group=GROUP, nats_conn_id=NATS_CONN)
    windows = ConsumerGroupStreamingAppOperator.partial(
        task_id="windows",
        application=spark_app("cg_stream_windows.py"),
        application_args=["--table", TABLE, "--checkpoint", CHECKPOINTS + "/{{ task.member }}",
                          "--trigger", "available-now", "--window", _env("WINDOW", "1 minute"),
                          "--watermark", _env("WATERMARK", "10 seconds")],
        stream=STREAM,
        group=GROUP,
        packages=DELTA,
        conf={"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
              "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"},
        nats_conn_id=NATS_CONN,
        conn_id=_env("SPARK_CONN_ID", "spark_default"),
        check_backlog=True,  # an available-now run: no Spark for a member with nothing to read
        map_index_template="{{ task.member }}",
    ).expand_kwargs(members.output)
    group >> members >> windows
