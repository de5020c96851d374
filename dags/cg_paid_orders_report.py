"""Example DAG 4: a downstream pipeline scheduled on the landed data, not on a clock.

Scheduled on the ``paid_orders`` table's Asset: each landing task of example DAGs 1-3 emits
an asset event whose extra says what it landed (per origin stream and partition the
sequence range, the counts, the batch ids: ``airflow_provider_cg.assets``). This DAG runs
on such events and reads exactly the rows they landed -- here it totals the new paid orders
per customer. Airflow gives a run the events up to the moment it was queued; events that
arrive while it is queued go to the next run. Nothing to configure: it runs when orders land.

Each landed row is counted once: an event goes on the Asset of the table its run actually
wrote (DAG 1 names it through the ``cg_landed_tables`` AssetAlias, so a run into another
``sink_path`` does not count here), an event's ranges cover only the inputs its run landed (a
run that read inputs again after a recovery does not announce them twice), and no two writers
of the table ever commit the same order.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_cg.examples import EXAMPLE_DEFAULT_ARGS, paid_orders_asset

DAG_ID = "cg_paid_orders_report"
PAID_ORDERS = paid_orders_asset()

with DAG(
    default_args=EXAMPLE_DEFAULT_ARGS,
    dag_id=DAG_ID,
    description="Downstream of the landing: report the paid orders each landing added",
    schedule=[PAID_ORDERS],
    catchup=False,
    max_active_runs=1,
    tags=["nats", "consumer-groups", "assets", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def new_paid_orders(triggering_asset_events: Any = None) -> dict[str, Any]:
        """The rows the triggering events landed, totalled per customer."""
        from airflow_provider_cg.assets import landed_rows

        extras = [e.extra for e in triggering_asset_events[PAID_ORDERS] if e.extra]
        # a landing that writes no row emits no event (its task is skipped); an event of another
        # writer of the table, or one without rows, lands nothing to report here
        landed = [e for e in extras if e.get("rows_written")]
        if not landed:
            print(f"{len(extras)} asset events, none of them a landing of rows: nothing new to report")
            return {"events": len(extras), "orders": 0, "amount_cents": 0, "customers": 0, "ranges": {}}
        by_table: dict[str, list[dict]] = {}
        for e in landed:
            by_table.setdefault(e["table"], []).append(e)
        orders, cents, customers = 0, 0, {}
        for events in by_table.values():
            rows = landed_rows(events, ["origin_seq", "customer", "amount_cents"])
            for r in rows.to_pylist() if rows is not None else []:
                orders += 1
                cents += r["amount_cents"]
                customers[r["customer"]] = customers.get(r["customer"], 0) + r["amount_cents"]
        top = sorted(customers.items(), key=lambda kv: -kv[1])[:5]
        print(f"{len(extras)} landing events, {orders} new paid orders, {cents / 100:.2f} in total; "
              f"top customers: {top}")
        ranges = {f"{e['member']}": e["origin"] for e in landed}
        return {"events": len(extras), "orders": orders, "amount_cents": cents, "customers": len(customers),
                "ranges": ranges}

    new_paid_orders()
