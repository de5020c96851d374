"""What the example DAGs share: where the demo's tables live, and the one pipeline that lands
the ``ORDERS`` group (JSON orders through ``cg_order_transforms:paid_orders`` into the
``paid_orders`` table), so the scheduled run, the overflow drain and the backfill of one group
write one shape into one table, never different shapes into one lake."""

from __future__ import annotations

import os
from typing import Any

TABLE_FORMATS = ("delta", "iceberg", "parquet")
ORDERS_JSON_SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, status STRING"
ORDERS_TRANSFORM = "cg_order_transforms:paid_orders"
ORDERS_TABLE = "paid_orders"
ICEBERG_NAMESPACE = "lake"


def lake_dir(*parts: str) -> str:
    """``$CG_DEMO_DIR/lake`` (``make demo`` sets it), else ``$AIRFLOW_HOME/cg_demo/lake``."""
    base = os.environ.get("CG_DEMO_DIR") or os.path.join(
        os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "cg_demo")
    return os.path.join(base, "lake", *parts)


def iceberg_defaults() -> dict[str, str]:
    """The embedded default's Iceberg catalog: SQLite next to the tables."""
    return {"iceberg_table": f"{ICEBERG_NAMESPACE}.{ORDERS_TABLE}",
            "iceberg_catalog_uri": f"sqlite:///{lake_dir('catalog.db')}",
            "iceberg_warehouse": lake_dir("warehouse")}


def orders_landing(env_prefix: str) -> dict[str, Any]:
    """Operator arguments that land the orders as example DAG 1 does, each overridable by an
    environment variable ``<env_prefix><NAME>``: ``SINK`` (delta, iceberg, parquet),
    ``SINK_PATH``, ``PAYLOAD_FORMAT``, ``TRANSFORM`` (``none``: land the rows as read) and
    ``AWS_CONN_ID`` (a table on S3-compatible storage)."""

    def env(name: str, default: str | None) -> str | None:
        return os.environ.get(env_prefix + name) or default

    transform = env("TRANSFORM", ORDERS_TRANSFORM)
    payload_format = env("PAYLOAD_FORMAT", "json")
    out: dict[str, Any] = {
        "sink": env("SINK", "delta"),
        "sink_path": env("SINK_PATH", lake_dir(ORDERS_TABLE)),
        "payload_format": payload_format,
        "json_schema": ORDERS_JSON_SCHEMA if payload_format == "json" else None,
        "transform": None if transform == "none" else transform,
        "aws_conn_id": env("AWS_CONN_ID", None),
    }
    if out["sink"] == "iceberg":
        out.update({k: env(k.upper(), v) for k, v in iceberg_defaults().items()})
    return out
