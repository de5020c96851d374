"""Benchmark: what a table commit costs as the table ages.

One writer lands ``--commits`` small batches (``--rows`` rows each) into one table through the
sink's whole two-phase protocol (prepare, acking mark, commit record, table commit), with no
table commit interval, so every batch is one table commit: a table followed for hours at a
commit a second. Every ``--every`` commits it times the next ``--window`` commits and reads:

  commit   the batch's commit, its table commit included (median ms of the window)
  load     opening the table as a reader does: delta-rs ``DeltaTable`` (log from the last
           checkpoint), pyiceberg ``load_table`` (the catalog, the metadata file)
  plan     a reader's plan of the newest batch (``origin_seq`` at or past its first): the files
           to read, from Delta's log or Iceberg's manifests

Cases: ``delta``, ``iceberg`` (this version), ``delta-maintained``: Delta with ``cg maintain``'s
compaction, checkpoint and log clean-up every ``--maintain-every`` commits (outside the timed
windows: a table followed at a commit a second, maintained every quarter hour), and
``iceberg-add-files``: the previous version's
Iceberg publish (pyiceberg ``add_files`` with its duplicate check, one fast-append manifest per
commit, no snapshot expiry), for ``--legacy-commits`` commits, as the baseline. Prints a table
(each window's figures as a ratio to its case's window at 100 commits; ``delta``, unmaintained,
for 3,000 commits: its commit grows with its files), writes
``benchmarks/results/table_age.json`` and ``table_age.png``.

    .venv/bin/python benchmarks/bench_table_age.py [--commits 10000] [--legacy-commits 2000]
        [--cases delta-maintained,iceberg,iceberg-add-files,delta:3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.landing.rows import BatchId  # noqa: E402
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import PreparedWrite  # noqa: E402
from tests.support.sink_rows import refs_for, rows  # noqa: E402

RESULTS = Path(__file__).parent / "results"


class LegacyIcebergPublish:
    """The previous version's Iceberg publish: ``add_files`` (opens every manifest of the
    current snapshot to refuse duplicates, reads each file's footer), one fast append per
    commit, nothing expired or merged."""

    def __init__(self, sink) -> None:
        from airflow_provider_cg.core.landing.sinks.iceberg import writer as iceberg

        self.sink, self.iceberg = sink, iceberg

    def commit_files(self, records, files, schema, state) -> None:
        sink = self.sink

        def write(tbl, tx, summary) -> None:
            tx.add_files([sink.store.uri(f.path) for f in files], snapshot_properties=summary)

        keep = self.iceberg.snapshots_to_expire
        self.iceberg.snapshots_to_expire = lambda *a, **k: []  # nothing expired
        try:
            sink._publish(records, schema, state, "commit", write)
        finally:
            self.iceberg.snapshots_to_expire = keep


def open_case(case: str, root: Path):
    if case.startswith("delta"):
        from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

        return DeltaLakeSink(str(root / case))
    from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

    sink = IcebergSink(f"sqlite:///{root}/catalog-{case}.db", f"lake.{case.replace('-', '_')}",
                       warehouse=str(root / f"warehouse-{case}"))
    if case == "iceberg-add-files":
        legacy = LegacyIcebergPublish(sink)
        sink.commit_files = legacy.commit_files  # type: ignore[method-assign]
    return sink


def land(sink, i: int, n: int) -> float:
    seqs = range(1 + i * n, 1 + (i + 1) * n)
    p: PreparedWrite = sink.prepare(BatchId("ORDERS", "g", "m1", i + 1), rows(seqs), message_refs=refs_for(seqs))
    p = sink.mark_acking(p)
    t = time.perf_counter()
    sink.commit(p)
    return time.perf_counter() - t


def reader(case: str, root: Path, sink):
    """(load seconds, plan seconds) of a reader of the newest batch."""
    if case.startswith("delta"):
        from deltalake import DeltaTable

        t = time.perf_counter()
        dt = DeltaTable(str(root / case))
        loaded = time.perf_counter() - t
        newest = dt.version()
        t = time.perf_counter()
        dt.file_uris(partition_filters=None)
        return loaded, time.perf_counter() - t, newest
    t = time.perf_counter()
    tbl = sink.catalog.load_table(sink.identifier)
    loaded = time.perf_counter() - t
    from pyiceberg.expressions import GreaterThanOrEqual

    first = int(tbl.properties.get("airflow-provider-cg.position", 0))
    t = time.perf_counter()
    list(tbl.scan(row_filter=GreaterThanOrEqual("origin_seq", max(first - 1, 0) * 1)).plan_files())
    return loaded, time.perf_counter() - t, len(tbl.snapshots())


def maintain(case: str, sink) -> None:
    """``cg maintain``'s Delta maintenance: compaction, a checkpoint, vacuum and log clean-up."""
    from airflow_provider_cg.core.landing.sinks.delta.maintenance import maintain_delta

    maintain_delta(sink, True, None, 0)


def run_case(case: str, commits: int, n: int, every: int, window: int, root: Path, maintain_every: int) -> list[dict]:
    sink = open_case(case, root)
    out = []
    marks = sorted({m for m in [100, *range(every, commits + 1, every)] if m <= commits})
    i = 0
    started = time.perf_counter()
    for mark in marks:
        while i < mark - window:
            land(sink, i, n)
            i += 1
            if case == "delta-maintained" and i % maintain_every == 0:
                maintain(case, sink)
        times, loads, plans = [], [], []
        history = 0
        while i < mark:
            times.append(land(sink, i, n))
            loaded, planned, history = reader(case, root, sink)
            loads.append(loaded)
            plans.append(planned)
            i += 1
        row = {"case": case, "commits": mark, "commit_ms": round(float(np.median(times)) * 1000, 2),
               "commit_p90_ms": round(float(np.percentile(times, 90)) * 1000, 2),
               "load_ms": round(float(np.median(loads)) * 1000, 2), "plan_ms": round(float(np.median(plans)) * 1000, 2),
               "history": history, "elapsed_s": round(time.perf_counter() - started, 1)}
        out.append(row)
        print(json.dumps(row), flush=True)
    sink.close()
    return out


def plot(rows_: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for case in dict.fromkeys(r["case"] for r in rows_):
        pts = [r for r in rows_ if r["case"] == case]
        for ax, key in zip(axes, ("commit_ms", "load_ms", "plan_ms"), strict=True):
            ax.plot([r["commits"] for r in pts], [r[key] for r in pts], marker="o", label=case)
    for ax, title in zip(axes, ("table commit (median ms)", "reader's table load (median ms)",
                                "reader's plan of the newest batch (median ms)"), strict=True):
        ax.set_xlabel("commits so far")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--legacy-commits", type=int, default=2_000)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--maintain-every", type=int, default=900)
    ap.add_argument("--keep", action="store_true",
                    help="keep the rows of other cases already in results/table_age.json (a case run alone)")
    ap.add_argument("--cases", default="delta-maintained,iceberg,iceberg-add-files,delta:3000",
                    help="cases, each optionally with its own number of commits (delta:3000)")
    args = ap.parse_args()
    rows_: list[dict] = []
    ran = {spec.partition(":")[0] for spec in args.cases.split(",")}
    if args.keep and (RESULTS / "table_age.json").exists():
        rows_ = [r for r in json.loads((RESULTS / "table_age.json").read_text())["rows"] if r["case"] not in ran]
    with tempfile.TemporaryDirectory(prefix="cg-table-age-") as tmp:
        for spec in args.cases.split(","):  # a case, or case:commits
            case, _, given = spec.partition(":")
            commits = int(given) if given else args.legacy_commits if case == "iceberg-add-files" else args.commits
            rows_ += run_case(case, commits, args.rows, args.every, args.window, Path(tmp), args.maintain_every)
    print(f"\n{'case':<20}{'commits':>8}{'commit ms':>11}{'x@100':>7}{'load ms':>9}{'x@100':>7}{'plan ms':>9}"
          f"{'x@100':>7}{'history':>9}")
    for r in rows_:
        base = next(b for b in rows_ if b["case"] == r["case"] and b["commits"] == 100)
        print(f"{r['case']:<20}{r['commits']:>8}{r['commit_ms']:>11.1f}{r['commit_ms'] / base['commit_ms']:>7.2f}"
              f"{r['load_ms']:>9.1f}{r['load_ms'] / base['load_ms']:>7.2f}{r['plan_ms']:>9.1f}"
              f"{r['plan_ms'] / base['plan_ms']:>7.2f}{r['history']:>9}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "table_age.json").write_text(json.dumps({"args": vars(args), "rows": rows_}, indent=1) + "\n")
    plot(rows_, RESULTS / "table_age.png")


if __name__ == "__main__":
    main()
