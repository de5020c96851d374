"""Benchmark: the member job into a Delta table and an Iceberg table against the Parquet lake, in one run.

A fresh embedded nats-server; N JSON orders (default 1,000,000, ~110 B, 2,000 customer keys,
5% cancelled) in an origin stream that one 1-partition elastic group per (sink, variant)
sources; then, one after another under real ``spark-submit --master local[2]``, batches of
``--batch-size`` (default 100,000), tables on local disk:

  <sink>/raw        the payload bytes landed as read;
  <sink>/transform  JSON decoded by Spark + the example transformation (``paid_orders``);

for sink in parquet (the baseline), delta (delta-rs commits, SQLite-free) and iceberg (SQL
catalog on SQLite). ``--large 10000000`` adds a second run with that many messages for the
raw delta and iceberg jobs only: the driver's peak RSS against N (it must stay flat: files are
written by Spark tasks, the driver holds one batch's keys). Timed by the job's own
``duration_s``; driver peak RSS sampled from /proc. Prints a table with each sink's ratio to
Parquet of the same run and variant, writes ``benchmarks/results/lake.json`` and ``lake.png``.

    .venv/bin/python benchmarks/bench_lake.py [--messages 1000000] [--large 10000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_member_job import RESULTS, job, parquet_rows, settle  # noqa: E402
from bench_transform import prepare  # noqa: E402 - the same JSON orders

from airflow_provider_cg.core.tools.packaging import build_core_zip, example_dags_folder  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402
from airflow_provider_cg.examples import ORDERS_JSON_SCHEMA, ORDERS_TRANSFORM  # noqa: E402

STREAM = "ORDERS"
SINKS = ("parquet", "delta", "iceberg")
VARIANTS = {"raw": [], "transform": ["--payload-format", "json", "--json-schema", ORDERS_JSON_SCHEMA,
                                     "--transform", ORDERS_TRANSFORM]}


def sink_for(name: str, workdir: Path, group: str):
    """``(job arguments, landed-row counter)`` of one sink, its table in ``workdir``."""
    where = workdir / f"table-{group}"
    if name == "parquet":
        return ["--sink", "parquet", "--sink-path", str(where)], lambda: parquet_rows(where)
    if name == "delta":
        def delta_rows() -> int:  # not to_pyarrow_dataset(): its threads abort the interpreter at exit
            import pyarrow.parquet as pq
            from deltalake import DeltaTable

            return sum(pq.ParquetFile(u).metadata.num_rows for u in DeltaTable(str(where)).file_uris())

        return ["--sink", "delta", "--sink-path", str(where)], delta_rows
    catalog = f"sqlite:///{workdir}/catalog-{group}.db"

    def iceberg_rows() -> int:
        from pyiceberg.catalog.sql import SqlCatalog

        scan = SqlCatalog("default", uri=catalog).load_table("bench.orders").scan(selected_fields=("origin_seq",))
        return scan.to_arrow().num_rows

    return (["--sink", "iceberg", "--iceberg-table", "bench.orders", "--iceberg-catalog-uri", catalog,
             "--iceberg-warehouse", str(where)], iceberg_rows)


def run(n: int, cases: list[tuple[str, str]], batch_size: int) -> list[dict]:
    rows = []
    groups = [f"{sink}-{variant}" for sink, variant in cases]
    with tempfile.TemporaryDirectory(prefix="cg-bench-lake-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        work = Path(d)
        zip_path = build_core_zip(work / "cg_core.zip")
        transforms = example_dags_folder() / "cg_order_transforms.py"
        asyncio.run(prepare(srv.url, n, groups))
        print(f"{n:,} orders published, sourced into {len(groups)} groups", flush=True)
        for (sink, variant), group in zip(cases, groups, strict=True):
            settle(srv.pid)
            s = job(srv.url, work, f"{zip_path},{transforms}", STREAM, group, batch_size, VARIANTS[variant],
                    sink=sink_for(sink, work, group))
            expected_rows = n if variant == "raw" else n - len(range(3, n, 20))
            if s["messages_read"] != n or s["rows"] != expected_rows:
                raise SystemExit(f"{group}: consumed {s['messages_read']} of {n}, landed {s['rows']} of {expected_rows}")
            rate = n / s["duration_s"]
            rows.append({"sink": sink, "variant": variant, "messages": n, "rows": s["rows"], "msg_s": round(rate),
                         "duration_s": s["duration_s"], "batches": s["batches"], "peak_rss_mb": s.get("peak_rss_mb")})
            print(f"  {group}: {rate:,.0f} msg/s, {s['batches']} commits, driver peak RSS {s.get('peak_rss_mb')} MB",
                  flush=True)
    base = {r["variant"]: r["msg_s"] for r in rows if r["sink"] == "parquet"}
    for r in rows:
        if r["variant"] in base:
            r["x_parquet"] = round(r["msg_s"] / base[r["variant"]], 2)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = min(r["messages"] for r in rows)
    first = [r for r in rows if r["messages"] == small]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    colors = {"parquet": "#999999", "delta": "#3a7", "iceberg": "#37a"}
    labels = [f"{r['sink']}\n{r['variant']}" for r in first]
    bars = a.bar(labels, [r["msg_s"] / 1000 for r in first], color=[colors[r["sink"]] for r in first])
    for bar, r in zip(bars, first, strict=True):
        a.annotate(f"{r['msg_s'] / 1000:.0f}k\n{r.get('x_parquet', '')}x parquet",
                   (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    a.set_ylabel("thousand messages / s")
    a.set_ylim(top=max(r["msg_s"] for r in first) / 1000 * 1.25)
    a.set_title(f"member job into each table format, {small:,} JSON orders", fontsize=10)
    for sink in ("delta", "iceberg"):
        pts = sorted((r["messages"], r["peak_rss_mb"]) for r in rows if r["sink"] == sink and r["variant"] == "raw")
        if pts:
            b.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker="o", label=f"{sink} raw", color=colors[sink])
    b.set_xlabel("messages (millions)")
    b.set_ylabel("driver peak RSS (MB)")
    b.set_ylim(bottom=0)
    b.set_title("driver memory against N")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--large", type=int, default=10_000_000, help="0: skip the memory run")
    p.add_argument("--batch-size", type=int, default=100_000)
    args = p.parse_args()
    cases = [(s, v) for v in VARIANTS for s in SINKS]
    rows = run(args.messages, cases, args.batch_size)
    if args.large:
        rows += run(args.large, [("delta", "raw"), ("iceberg", "raw")], args.batch_size)
    cols = ["sink", "variant", "messages", "msg_s", "x_parquet", "batches", "duration_s", "peak_rss_mb"]
    print("\n" + " ".join(f"{c:>11}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c, '')!s:>11}" for c in cols))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lake.json").write_text(json.dumps({"batch_size": args.batch_size, "results": rows}, indent=1) + "\n")
    plot(rows, RESULTS / "lake.png")
    print(f"\nwrote {RESULTS / 'lake.json'} and {RESULTS / 'lake.png'}")


if __name__ == "__main__":
    main()
