"""Benchmark: production-shaped tables, in one run -- partitioned against unpartitioned, merge
against append, landing while maintenance runs, and the files a table collects.

Each case lands ``--batches`` batches of ``--rows`` order rows (``--keys`` keys, 8 regions, a
day column) through the sink's whole two-phase protocol (prepare, acking mark, commit and the
table commit), one member, tables on local disk, no NATS and no Spark (the driver's path), so
the figures are the table side's alone:

  delta/append            Delta, unpartitioned (the baseline of the Delta rows)
  delta/partitioned       Delta, partition_by region (8 values)
  delta/merge             Delta, merge_keys order_id (delta-rs MERGE per batch)
  delta/append+maintain   Delta append while ``cg maintain`` (compaction, checkpoint, vacuum)
                          runs in a loop beside it
  iceberg/append, iceberg/partitioned (region, day(ts)), iceberg/merge   likewise (SQL catalog)

Prints rows/s, ms per batch, data files after the run and after one compaction (Delta), each
with its ratio to its format's append of the same run; then what a member landing every 1, 5 or
15 minutes leaves per day (files per commit measured here) with and without nightly
compaction. Writes ``benchmarks/results/tables.json`` and ``tables.png``.

    .venv/bin/python benchmarks/bench_tables.py [--batches 40] [--rows 5000] [--keys 20000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.landing.rows import BatchId  # noqa: E402
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions  # noqa: E402
from tests.support.sink_rows import refs_for, rows  # noqa: E402

RESULTS = Path(__file__).parent / "results"
REGIONS = 8


def _batch(first: int, n: int, keys: int) -> pa.Table:
    seqs = np.arange(first, first + n, dtype=np.int64)
    rng = np.random.default_rng(first)
    order = rng.integers(0, keys, n)
    return rows(seqs, extra=lambda s: {
        "order_id": pa.array(order),
        "region": pa.array([f"r{x % REGIONS}" for x in order]),
        # an order every 10 ms: a batch of 5,000 spans under a minute, as a member landing every minute sees
        "ts": pa.array((1_767_225_600_000_000 + s * 10_000).astype("datetime64[us]"), pa.timestamp("us", "UTC")),
        "amount": pa.array(rng.random(n) * 100),
    })


def _options(fmt: str, variant: str, where: Path) -> SinkOptions:
    extra = {}
    if variant == "partitioned":
        extra["partition_by"] = "region" if fmt == "delta" else "region, day(ts)"
    if variant == "merge":
        extra["merge_keys"] = "order_id"
    if fmt == "delta":
        return SinkOptions(sink="delta", sink_path=str(where / "t"), **extra)
    return SinkOptions(sink="iceberg", iceberg_table="lake.t", iceberg_catalog_uri=f"sqlite:///{where}/c.db",
                       iceberg_warehouse=str(where / "wh"), **extra)


def _data_files(options: SinkOptions) -> int:
    if options.sink == "delta":
        from deltalake import DeltaTable

        return len(DeltaTable(options.sink_path).file_uris())
    tbl = open_sink(options).load_table()
    return len(list(tbl.scan().plan_files()))


def _maintain(options: SinkOptions) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "airflow_provider_cg.core.tools.cli", "maintain", "--json"]
    for k, v in options.given().items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def case(fmt: str, variant: str, batches: int, n: int, keys: int, root: Path) -> dict:
    where = root / f"{fmt}-{variant}"
    where.mkdir()
    options = _options(fmt, "append" if variant == "append+maintain" else variant, where)
    sink = open_sink(options)
    stop, maint_runs = threading.Event(), [0]

    def maintainer() -> None:
        while not stop.is_set():
            if _maintain(options).returncode == 0:
                maint_runs[0] += 1

    loop = threading.Thread(target=maintainer, daemon=True) if variant == "append+maintain" else None
    per_batch = []
    started = time.perf_counter()
    for b in range(batches):
        if b == 1 and loop is not None:
            loop.start()  # once the table exists
        t0 = time.perf_counter()
        table = _batch(1 + b * n, n, keys)
        p = sink.prepare(BatchId("ORDERS", "g", "m1", b + 1), table, message_refs=refs_for(range(1 + b * n,
                                                                                                1 + (b + 1) * n)))
        sink.commit(sink.mark_acking(p))
        per_batch.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    stop.set()
    if loop is not None:
        loop.join(300)
    files = _data_files(options)
    compacted = None
    if fmt == "delta":
        r = _maintain(options)
        compacted = _data_files(options) if r.returncode == 0 else None
    return {"case": f"{fmt}/{variant}", "format": fmt, "variant": variant, "rows": batches * n,
            "rows_per_s": batches * n / elapsed, "ms_per_batch": 1000 * float(np.median(per_batch)),
            "files": files, "files_per_commit": files / batches, "files_after_compaction": compacted,
            "maintenance_runs": maint_runs[0]}


def plot(rows_: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["case"] for r in rows_]
    a.barh(names, [r["rows_per_s"] / 1000 for r in rows_], color=["#4c72b0" if r["format"] == "delta" else "#dd8452"
                                                                   for r in rows_])
    a.set_xlabel("landed rows/s (thousands)")
    a.invert_yaxis()
    b.barh(names, [r["files_per_commit"] for r in rows_], color="#55a868")
    b.set_xlabel("data files in the table after the run, per batch landed")
    b.invert_yaxis()
    fig.suptitle("Tables: partitioned, merged, maintained (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--keys", type=int, default=20_000)
    args = ap.parse_args()
    cases = [("delta", "append"), ("delta", "partitioned"), ("delta", "merge"), ("delta", "append+maintain"),
             ("iceberg", "append"), ("iceberg", "partitioned"), ("iceberg", "merge")]
    out = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-tables-") as tmp:
        for fmt, variant in cases:
            r = case(fmt, variant, args.batches, args.rows, args.keys, Path(tmp))
            out.append(r)
            print(f"  {r['case']:<22} {r['rows_per_s']:>10,.0f} rows/s", flush=True)
    base = {r["format"]: r for r in out if r["variant"] == "append"}
    print(f"\n{args.batches} batches of {args.rows:,} rows, {args.keys:,} keys, tables on local disk, one run\n")
    print(f"{'case':<22} {'rows/s':>10} {'ratio':>6} {'ms/batch':>9} {'files':>6} {'files/commit':>13} "
          f"{'after compaction':>17} {'maint. runs':>11}")
    for r in out:
        r["ratio"] = r["rows_per_s"] / base[r["format"]]["rows_per_s"]
        after = "-" if r["files_after_compaction"] is None else str(r["files_after_compaction"])
        print(f"{r['case']:<22} {r['rows_per_s']:>10,.0f} {r['ratio']:>6.2f} {r['ms_per_batch']:>9.1f} "
              f"{r['files']:>6} {r['files_per_commit']:>13.2f} {after:>17} {r['maintenance_runs']:>11}")
    print("\ndata files one member adds per day without compaction (files per commit above x commits a day):")
    print(f"{'case':<22} {'every 1 min':>12} {'every 5 min':>12} {'every 15 min':>13}")
    for r in out:
        if r["variant"] not in ("append", "partitioned"):
            continue
        per_day = [1440 / m * r["files_per_commit"] for m in (1, 5, 15)]
        r["files_per_day"] = dict(zip(("1min", "5min", "15min"), per_day, strict=True))
        print(f"{r['case']:<22} {per_day[0]:>12,.0f} {per_day[1]:>12,.0f} {per_day[2]:>13,.0f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tables.json").write_text(json.dumps({"args": vars(args), "cases": out}, indent=2))
    plot(out, RESULTS / "tables.png")
    print(f"\nwrote {RESULTS / 'tables.json'} and {RESULTS / 'tables.png'}")


if __name__ == "__main__":
    main()
