"""What the example DAGs share: where the demo's tables live, and the one pipeline that lands
the ``ORDERS`` group (JSON orders through ``cg_order_transforms:paid_orders`` into the
``paid_orders`` table), so the scheduled run, the overflow drain and the backfill of one group
write one shape into one table, never different shapes into one lake."""

from __future__ import annotations

import datetime as dt
import os
from typing import TYPE_CHECKING, Any

from airflow_provider_cg.core.landing.contract import COUNTS
from airflow_provider_cg.core.landing.modes import PayloadFormat

if TYPE_CHECKING:
    from airflow.sdk import Asset

__all__ = [
    "EXAMPLE_DEFAULT_ARGS",
    "ICEBERG_NAMESPACE",
    "ORDERS_JSON_SCHEMA",
    "ORDERS_TABLE",
    "ORDERS_TRANSFORM",
    "iceberg_defaults",
    "lake_dir",
    "landing_asset",
    "landing_report",
    "orders_landing",
    "orders_table",
    "paid_orders_asset",
    "spark_app",
    "table_formats",
]

ORDERS_JSON_SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, status STRING"
ORDERS_TRANSFORM = "cg_order_transforms:paid_orders"
ORDERS_TABLE = "paid_orders"
#: the example DAGs' task defaults: a retryable failure (a server, a database or Airflow's own
#: API away for a moment: the member job's exit 2) is retried; invalid input (exit 1) fails the
#: task at once (the operator raises AirflowFailException), so retries never repeat it
EXAMPLE_DEFAULT_ARGS = {"retries": 3, "retry_delay": dt.timedelta(seconds=20), "retry_exponential_backoff": True}
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


def table_formats() -> tuple[str, ...]:
    """The sinks the example DAGs can land the orders into: those whose table is an Asset."""
    from airflow_provider_cg.core.landing.sinks.registry import sink_kinds

    return tuple(k.name for k in sink_kinds() if k.has_asset)


def orders_table(sink: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options of the orders table in ``sink`` at its default location (the embedded
    default's lake directory or SQLite catalog), each replaced by ``values``'s."""
    from airflow_provider_cg.core.landing.sinks.registry import sink_kind

    given = {k: v for k, v in (values or {}).items() if v is not None}
    defaults = {"sink_path": lake_dir(ORDERS_TABLE), **iceberg_defaults(), **given}
    return {"sink": sink, **{k: v for k, v in defaults.items() if k in sink_kind(sink).option_fields()}}


def paid_orders_asset() -> Asset:
    """The ``paid_orders`` table (its default location) as the Asset the landing tasks update;
    each event's extra names the table it actually wrote (``airflow_provider_cg.assets``)."""
    from airflow_provider_cg.assets import table_asset

    return table_asset(sink="delta", sink_path=lake_dir(ORDERS_TABLE))


def landing_asset(landing: dict[str, Any]) -> Asset:
    """The Asset of the table ``orders_landing(...)``'s arguments write."""
    from airflow_provider_cg.assets import table_asset
    from airflow_provider_cg.core.landing.sinks.options import SINK_FIELDS

    return table_asset(**{k: landing[k] for k in SINK_FIELDS if landing.get(k) is not None})


def orders_landing(env_prefix: str) -> dict[str, Any]:
    """Operator arguments that land the orders as example DAG 1 does, each overridable by an
    environment variable ``<env_prefix><NAME>``: ``SINK`` (delta, iceberg, parquet),
    ``SINK_PATH``, ``PAYLOAD_FORMAT``, ``TRANSFORM`` (``none``: land the rows as read) and
    ``AWS_CONN_ID`` (a table on S3-compatible storage)."""

    def env(name: str, default: str | None) -> str | None:
        return os.environ.get(env_prefix + name) or default

    transform = env("TRANSFORM", ORDERS_TRANSFORM)
    payload_format = env("PAYLOAD_FORMAT", "json")
    sink = env("SINK", "delta") or "delta"
    table = orders_table(sink, {k: env(k.upper(), None) for k in ("sink_path", *iceberg_defaults())})
    out: dict[str, Any] = {
        **{k: v for k, v in table.items() if v is not None},
        "payload_format": payload_format,
        "json_schema": ORDERS_JSON_SCHEMA if payload_format == PayloadFormat.JSON else None,
        "transform": None if transform == "none" else transform,
        "aws_conn_id": env("AWS_CONN_ID", None),
    }
    return out




def landing_report(summaries: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    """The landing tasks' summaries as one report: per member its result, each count under
    its own name and the messages read per partition; the totals; printed as a table (the
    task log). Messages and rows are never added up together: a transformation that drops
    cancelled orders writes fewer rows than it reads messages. A group of one member gives
    one summary, not a list (``xcom_pull`` of a task mapped once)."""
    if isinstance(summaries, dict):
        summaries = [summaries]
    members: list[dict[str, Any]] = []
    for s in sorted((s for s in summaries if s), key=lambda s: str(s.get("member"))):
        parts = {int(p): info.get("messages", 0) for p, info in (s.get("partitions") or {}).items()}
        members.append({"member": s.get("member"), "result": s.get("result"),
                        **{k: int(s.get(k) or 0) for k in COUNTS}, "partitions": dict(sorted(parts.items()))})
    totals = {k: sum(m[k] for m in members) for k in COUNTS}
    header = f"{'member':<10} {'result':<10}" + "".join(f" {k:>18}" for k in COUNTS) + "  messages read per partition"
    lines = [header]
    for m in members:
        lines.append(f"{m['member']!s:<10} {m['result']!s:<10}" + "".join(f" {m[k]:>18}" for k in COUNTS)
                     + "  " + (", ".join(f"{p}: {n}" for p, n in m["partitions"].items()) or "-"))
    lines.append(f"{'total':<10} {'':<10}" + "".join(f" {totals[k]:>18}" for k in COUNTS))
    print("\n".join(lines))
    return {"members": members, "totals": totals}


def spark_app(name: str) -> str:
    """The path of one of the package's spark-submit applications (``spark_apps/<name>``), e.g.
    the example streaming application ``cg_stream_windows.py`` (example DAG 7)."""
    from airflow_provider_cg.core.tools.packaging import spark_app_path

    return str(spark_app_path(name))
