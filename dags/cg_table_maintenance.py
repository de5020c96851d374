"""Example DAG 5: nightly maintenance of the ``paid_orders`` table, beside the landing.

Example DAGs 1-3 land into ``paid_orders`` every few minutes; each batch is its own commit
with its own files. Once a night this DAG compacts those small files (Delta's ``OPTIMIZE``
toward 128 MB files), writes a checkpoint, and removes what no version of the last 7 days
still needs (``VACUUM``; Iceberg: expired snapshots and orphan files). The member jobs keep
landing while it runs: maintenance changes nothing the exactly-once protocol reads, a commit
it loses to a member is retried, and it never removes a file younger than an hour (what a
member may be publishing). It reports what it did as its XCom.

Settings, as DAG 1's table (environment, fixed when the file is parsed): ``CG_DEMO_SINK``,
``CG_DEMO_SINK_PATH``, ``CG_DEMO_AWS_CONN_ID`` (see ``airflow_provider_cg.examples.orders_landing``).
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG

from airflow_provider_cg.core.landing.sinks.options import SINK_FIELDS
from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, orders_landing
from airflow_provider_cg.operators.maintenance import ConsumerGroupTableMaintenanceOperator

DAG_ID = "cg_table_maintenance"
TABLE = orders_landing("CG_DEMO_")

with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Compact and clean the paid_orders table nightly, while the members land",
    schedule="30 2 * * *",
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["nats", "consumer-groups", "maintenance", "example"],
    doc_md=__doc__,
) as dag:
    ConsumerGroupTableMaintenanceOperator(
        task_id="maintain_paid_orders",
        **{k: v for k, v in TABLE.items() if k in SINK_FIELDS and v is not None},
        target_file_size=128 << 20,
        retention_hours=168,
        aws_conn_id=TABLE.get("aws_conn_id"),
    )
