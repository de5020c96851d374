"""``make demo``: example DAG 1 end to end on this machine, from a fresh ``.demo/`` directory.

Migrates a SQLite Airflow in ``.demo/airflow``, starts an embedded nats-server on
127.0.0.1, creates the ``ORDERS`` stream and publishes 100,000 JSON orders
(``orders.<customer>``, about 5% cancelled), runs ``airflow dags test cg_scheduled_consumption``
(Spark ``local[*]``, the example transformation ``paid_orders``, into the Delta table
``.demo/lake/paid_orders``; ``--format iceberg`` or ``parquet`` picks another), reads the table
back without Spark, prints rows per partition and checks that every paid order landed exactly
once and no cancelled one did. The server is stopped (by its PID) however the demo ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.tools.packaging import example_dags_folder
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from airflow_provider_cg.examples import ORDERS_TABLE, iceberg_defaults, lake_dir, orders_table, table_formats

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa

PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages
DAG_ID = "cg_scheduled_consumption"
STREAM = "ORDERS"


def _orders(n: int, customers: int, seed: int = 7, first: int = 1) -> Iterator[tuple[str, bytes]]:
    rnd = random.Random(seed + first - 1)
    for i in range(first, first + n):
        c = f"c{rnd.randrange(customers):05d}"
        status = "cancelled" if rnd.random() < 0.05 else "paid"
        body = {"order_id": i, "customer": c, "amount": round(rnd.uniform(1, 500), 2), "status": status}
        yield f"orders.{c}", json.dumps(body, separators=(",", ":")).encode()


async def _prepare(url: str, n: int, customers: int, first: int = 1) -> tuple[float, set[int]]:
    """Create the ``ORDERS`` stream if missing (direct gets on, for static groups' fast reads)
    and publish ``n`` orders with ids from ``first``; return the time it took and the ids of
    the paid (not cancelled) ones."""
    from airflow_provider_cg.core.jetstream.api import JsApi

    nc = await NatsConnectionSettings(servers=[url]).connect()
    try:
        api = JsApi(nc)
        try:
            await api.stream_info(STREAM)
        except Exception:  # noqa: BLE001 - not there yet (or unreadable: creating it says why)
            await api.add_stream({"name": STREAM, "subjects": ["orders.>"], "storage": "file", "allow_direct": True})
        started = time.perf_counter()
        result = await publish_many(nc, _orders(n, customers, first=first))
        if result.published != n:
            raise RuntimeError(f"published {result.published} of {n}")
        paid = {o["order_id"] for o in (json.loads(body) for _, body in _orders(n, customers, first=first))
                if o["status"] == "paid"}
        return time.perf_counter() - started, paid
    finally:
        await nc.close()


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    with open(log, "w") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(cmd[1:4])} failed ({proc.returncode}); see {log}\n{tail}")


def read_table(fmt: str, columns: list[str]) -> pa.Table:
    """The landed table as a reader without Spark sees it (delta-rs, pyiceberg, pyarrow)."""
    from airflow_provider_cg.assets import read_table as read

    ice = iceberg_defaults()
    return read(fmt, sink_path=lake_dir(ORDERS_TABLE), iceberg_table=ice["iceberg_table"],
                iceberg_catalog_uri=ice["iceberg_catalog_uri"], columns=columns)


def how_to_read(fmt: str) -> list[str]:
    """Commands that read the orders table with other tools than ours."""
    from airflow_provider_cg.core.landing.sinks.options import SinkOptions

    options = SinkOptions.build(orders_table(fmt))
    return options.kind.how_to_read(options.kind.typed(options))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airflow_provider_cg.demo", description=__doc__.split("\n")[0])
    default_dir = PACKAGE_PARENT / ".demo" if (PACKAGE_PARENT / "setup.cfg").exists() else Path.cwd() / ".cg-demo"
    p.add_argument("--dir", default=str(default_dir), help="demo directory (recreated)")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--customers", type=int, default=3000)
    p.add_argument("--format", choices=table_formats(), default="delta", help="the table the DAG lands into")
    p.add_argument("--publish-to", metavar="URL", help="only create the ORDERS stream (if missing) on this NATS "
                   "server and publish --messages orders to it (for DAGs run under your own Airflow)")
    p.add_argument("--first-order", type=int, default=1, help="with --publish-to: the first order id")
    args = p.parse_args(argv)
    if args.publish_to:
        took, paid = asyncio.run(_prepare(args.publish_to, args.messages, args.customers, args.first_order))
        print(f"published {args.messages} orders (ids {args.first_order}-{args.first_order + args.messages - 1}, "
              f"{len(paid)} paid) to {STREAM} in {took:.1f} s")
        return 0

    t0 = time.perf_counter()
    demo = Path(args.dir).resolve()
    shutil.rmtree(demo, ignore_errors=True)
    home = demo / "airflow"
    home.mkdir(parents=True)
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(example_dags_folder()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "CG_DEMO_DIR": str(demo),
        "CG_SPARK_CACHE_DIR": str(demo / "cache"),
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    os.environ["CG_DEMO_DIR"] = str(demo)  # lake_dir() below reads it, as the DAG does
    airflow = [sys.executable, "-m", "airflow"]

    print(f"[demo] migrating the Airflow DB in {home} ...", flush=True)
    t = time.perf_counter()
    _run([*airflow, "db", "migrate"], env, demo / "db-migrate.log")
    t_migrate = time.perf_counter() - t

    server = EmbeddedNatsServer(demo / "nats")
    try:
        server.start()
        print(f"[demo] nats-server pid {server.pid} on {server.url}", flush=True)
        t_publish, paid = asyncio.run(_prepare(server.url, args.messages, args.customers))
        print(f"[demo] published {args.messages:,} orders ({args.customers} customers) in {t_publish:.1f} s",
              flush=True)
        env["AIRFLOW_CONN_NATS_DEFAULT"] = json.dumps({"conn_type": "nats", "host": "127.0.0.1", "port": server.port})
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[*]"})
        print(f"[demo] airflow dags test {DAG_ID} (Spark local[*], a {args.format} table) ...", flush=True)
        t = time.perf_counter()
        conf = json.dumps({"table_format": args.format})
        _run([*airflow, "dags", "test", DAG_ID, "--conf", conf], env, demo / "dags-test.log")
        t_dag = time.perf_counter() - t
    finally:
        server.stop()

    # the example DAG's transformation (cg_order_transforms.paid_orders) dropped cancelled orders
    table = read_table(args.format, ["partition", "order_id", "amount_cents"])
    counts: dict[int, int] = {}
    for part in table.column("partition").to_pylist():
        counts[part] = counts.get(part, 0) + 1
    order_ids = table.column("order_id").to_pylist()
    print(f"\n{'partition':>9} {'rows':>8}")
    for part, n in sorted(counts.items()):
        print(f"{part:>9} {n:>8}")
    print(f"{'total':>9} {table.num_rows:>8}   (published {args.messages}, paid {len(paid)}, "
          f"distinct orders {len(set(order_ids))})")
    ok = sorted(order_ids) == sorted(paid)
    print(f"\n[demo] {'OK' if ok else 'MISMATCH'}: db migrate {t_migrate:.0f} s, publish {t_publish:.1f} s, "
          f"DAG run {t_dag:.0f} s, total {time.perf_counter() - t0:.0f} s")
    from airflow_provider_cg.core.landing.sinks.options import SinkOptions

    options = SinkOptions.build(orders_table(args.format))
    where = options.kind.describe(options.kind.typed(options))
    print(f"[demo] {args.format} table: {where}  (DAG log: {demo / 'dags-test.log'})")
    for i, line in enumerate(how_to_read(args.format)):
        print(f"[demo] {'read it' if i == 0 else '     or'}: {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
