"""Benchmark: what the Spark pipeline (decode + your transformation) costs the member job, in one run.

A fresh embedded nats-server; N JSON orders (default 1,000,000, ~110 B, 2,000 customer keys, 5%
cancelled) in an origin stream that four 1-partition elastic groups source, then one after another
under real ``spark-submit --master local[2]`` into the Parquet lake, batches of ``--batch-size``
(default 100,000):

  raw        the member job landing the payload bytes (the data path of the performance issue);
  json       decoding the JSON with Spark (``from_json`` with a schema);
  transform  decoding + the example transformation (filter the cancelled, derive a column);
  sql        decoding + a per-batch aggregation in Spark SQL (totals per customer).

Timed by the job's own ``duration_s``; driver peak RSS sampled from /proc. Prints a table (with
ratios to ``raw`` of the same run), writes ``benchmarks/results/transform.json`` and ``.png``.

    .venv/bin/python benchmarks/bench_transform.py [--messages 1000000] [--batch-size 100000] \
        [--variants raw,json,transform,sql] [--results transform]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_member_job import RESULTS, _wait_messages, job, settle  # noqa: E402

from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.tools.packaging import build_core_zip, example_dags_folder  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

STREAM, KEYS = "ORDERS", 2000
SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, status STRING"
SQL = "SELECT value.customer AS customer, count(*) AS orders, sum(value.amount) AS total FROM batch GROUP BY value.customer"
VARIANTS = {
    "raw": [],
    "json": ["--payload-format", "json", "--json-schema", SCHEMA],
    "transform": ["--payload-format", "json", "--json-schema", SCHEMA, "--transform", "cg_order_transforms:paid_orders"],
    "sql": ["--payload-format", "json", "--json-schema", SCHEMA, "--transform-sql", SQL],
    # the same work with the batches read by Spark's tasks instead of the driver
    "json-tasks": ["--payload-format", "json", "--json-schema", SCHEMA, "--read", "executors"],
    "transform-tasks": ["--payload-format", "json", "--json-schema", SCHEMA, "--transform",
                        "cg_order_transforms:paid_orders", "--read", "executors"],
}


async def prepare(url: str, n: int, groups=None) -> None:
    """N JSON orders in the origin stream, sourced into one 1-partition group per name in
    ``groups`` (default: one per variant)."""
    groups = list(groups or VARIANTS)
    nc = await NatsConnectionSettings(servers=[url]).connect()
    api, cg = JsApi(nc), ConsumerGroups(nc)
    await api.add_stream({"name": STREAM, "subjects": ["orders.*"], "storage": "file"})
    for g in groups:
        await cg.create(STREAM, g, ElasticGroupConfig(1, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    rnd = random.Random(7)

    def orders():
        for i in range(n):
            c = f"c{i % KEYS:05d}"
            body = {"order_id": i, "customer": c, "amount": round(rnd.uniform(1, 500), 2),
                    "status": "cancelled" if i % 20 == 3 else "paid"}
            yield f"orders.{c}", json.dumps(body, separators=(",", ":")).encode()

    await publish_many(nc, orders())
    for g in groups:
        await _wait_messages(api, f"{STREAM}-{g}", n)
    await nc.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=100_000)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset (raw is the baseline)")
    p.add_argument("--results", default="transform", help="name of the results files in benchmarks/results")
    p.add_argument("--standalone", action="store_true",
                   help="submit to a Spark standalone cluster on this machine (a master, 2 workers of 1 core)")
    args = p.parse_args()
    wanted = args.variants.split(",")
    for name in list(VARIANTS):
        if name not in wanted:
            del VARIANTS[name]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-tf-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        transforms = example_dags_folder() / "cg_order_transforms.py"
        asyncio.run(prepare(srv.url, args.messages))
        print(f"{args.messages:,} orders published", flush=True)
        cluster = None
        if args.standalone:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.support.spark_standalone import StandaloneCluster

            cluster = StandaloneCluster(Path(d) / "spark", cores=1, workers=2).start()
        try:
            for name, extra in VARIANTS.items():
                settle(srv.pid)
                s = job(srv.url, Path(d), f"{zip_path},{transforms}", STREAM, name, args.batch_size, extra,
                        master=cluster.master if cluster else "local[2]")
                if s["messages_read"] != args.messages:
                    raise SystemExit(f"{name}: consumed {s['messages_read']} of {args.messages}")
                rate = s["messages_read"] / s["duration_s"]
                rows.append({"variant": name, "messages": s["messages_read"], "rows": s["rows"],
                             "msg_s": round(rate), "duration_s": s["duration_s"], "peak_rss_mb": s.get("peak_rss_mb")})
                print(f"  {name}: {rate:,.0f} msg/s ({s['rows']:,} rows), driver peak RSS {s.get('peak_rss_mb')} MB",
                      flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    base = rows[0]["msg_s"]
    for r in rows:
        r["x_raw"] = round(r["msg_s"] / base, 2)
    print(f"\n{'variant':<10} {'msg/s':>10} {'x raw':>6} {'rows':>10} {'RSS MB':>7}")
    for r in rows:
        print(f"{r['variant']:<10} {r['msg_s']:>10,} {r['x_raw']:>6} {r['rows']:>10,} {r['peak_rss_mb'] or '-':>7}")
    RESULTS.mkdir(exist_ok=True)
    master = "standalone (2 workers x 1 core)" if args.standalone else "local[2]"
    (RESULTS / f"{args.results}.json").write_text(json.dumps({"batch_size": args.batch_size, "master": master,
                                                             "results": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar([r["variant"] for r in rows], [r["msg_s"] / 1000 for r in rows], color=["#999", "#3a7", "#37a", "#a73", "#7a3", "#73a"][:len(rows)])
    for bar, r in zip(bars, rows, strict=True):
        ax.annotate(f"{r['msg_s'] / 1000:.0f}k\n{r['x_raw']}x raw", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("thousand messages / s")
    ax.set_ylim(top=max(r["msg_s"] for r in rows) / 1000 * 1.25)
    ax.set_title(f"member job, {args.messages:,} JSON orders, batches of {args.batch_size:,}, {master}", fontsize=10)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.results}.png", dpi=110)


if __name__ == "__main__":
    main()
