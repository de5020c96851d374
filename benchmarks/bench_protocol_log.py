"""Benchmark: a job's start-up cost on a table's protocol log as the table ages.

For each history (``--histories``, default 1,000, 10,000 and 100,000 landed batches, two log
records and one key file each, as a member job writes them), the same log is opened two ways
in one run:

  before   the log as this provider wrote it until folding: a checkpoint holding every record
           so far, found by listing ``_cg_log/`` (the newest one is written here; the old
           layout wrote one every 100 positions, each larger than the last)
  folded   the same log after a checkpoint that folds all but the last 1,000 records
           (``protocol_log.py``), found through ``_last_checkpoint.json``; then after
           ``cg maintain``'s clean-up deleted the folded records and key files

and measured: opening the sink and reading the log (``open``), then landing a first batch of
100 new messages and a replay of 100 landed ones (``first batch``), median of ``--repeat``.
Prints a table, writes ``benchmarks/results/protocol_log.json`` and ``protocol_log.png``.

    .venv/bin/python benchmarks/bench_protocol_log.py [--histories 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.landing.rows import BatchId  # noqa: E402
from airflow_provider_cg.core.landing.sinks import ParquetLakeSink  # noqa: E402
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import (  # noqa: E402
    KEYS_DIR,
    LOG_DIR,
    POINTER,
    CommitLog,
    clean_protocol_log,
    fs_name,
    npy_bytes,
    pos_name,
)
from tests.support.sink_rows import refs_for, rows  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PER_BATCH = 100
MEMBERS = 6


def write_history(root: Path, batches: int) -> None:
    """``batches`` landed batches' records (acking, then commit) and key files, written
    straight into the log as the protocol writes them (no data files: opening reads none)."""
    sink = ParquetLakeSink(root, fsync=False, checkpoint_interval=0)
    store = sink.store
    pos = 0
    for b in range(batches):
        member = f"m{b % MEMBERS}"
        batch = BatchId("ORDERS", "g", member, b // MEMBERS + 1)
        seqs = np.arange(b * PER_BATCH + 1, (b + 1) * PER_BATCH + 1, dtype=np.int64)
        keys_dir = f"{KEYS_DIR}/{fs_name(batch.gid)}"
        store.ensure_dir(keys_dir)
        key_path = f"{keys_dir}/k-0.npy"
        store.write(key_path, npy_bytes(seqs))
        info = {"min": int(seqs[0]), "max": int(seqs[-1])}
        acking = {"v": 1, "op": "acking", "gid": batch.gid, "batch": batch.to_dict(),
                  "streams": {"ORDERS": {**info, "keys": f"_cg_staging/{fs_name(batch.gid)}/keys-0.npy"}}}
        commit = {"v": 1, "op": "commit", "gid": batch.gid, "batch": batch.to_dict(), "rows_written": PER_BATCH,
                  "duplicates_skipped": 0, "committed_at": "2026-11-26T00:00:00+00:00",
                  "files": [{"path": f"data/part-{b}.parquet", "staged": f"_cg_staging/x/{b}.parquet",
                             "rows": PER_BATCH}],
                  "streams": {"ORDERS": {**info, "count": PER_BATCH, "keys": key_path}}}
        for record in (acking, commit):
            pos += 1
            store.create(f"{LOG_DIR}/{pos_name(pos)}", json.dumps(record, separators=(",", ":")).encode())


def write_before(root: Path) -> None:
    """The old layout's newest checkpoint (every record), no pointer."""
    log = CommitLog(ParquetLakeSink(root, fsync=False).store)
    log.refresh()
    (root / POINTER).unlink(missing_ok=True)
    body = json.dumps({"pos": log.pos, "records": log.records}, separators=(",", ":")).encode()
    log.store.write(f"{LOG_DIR}/{log.pos:020d}.checkpoint.json", body)


def write_folded(root: Path) -> int:
    """A folded checkpoint at the log's end (keep 1,000), through the provider's own code."""
    sink = ParquetLakeSink(root, fsync=False)
    log = sink._log
    log.refresh()
    log.write_checkpoint(log.fold_point(), sink._load_keys, keep_files=True)
    return log.folded_pos if log.folded_pos else log.fold_point()


def measure(root: Path, batches: int, repeat: int, tag: int) -> dict:
    opens, firsts = [], []
    for r in range(repeat):
        t0 = time.perf_counter()
        sink = ParquetLakeSink(root, fsync=False, checkpoint_interval=0)
        sink._log.refresh()
        t1 = time.perf_counter()
        first = (batches + 10 + tag * repeat + r) * PER_BATCH + 1
        new = list(range(first, first + PER_BATCH))
        old = list(range(1, PER_BATCH + 1))
        for i, seqs in enumerate((new, old)):
            p = sink.prepare(BatchId("ORDERS", "g", "bench", 10_000_000 + tag * 100 + r * 2 + i), rows(seqs),
                             message_refs=refs_for(seqs))
            sink.commit(sink.mark_acking(p))
        t2 = time.perf_counter()
        opens.append(t1 - t0)
        firsts.append(t2 - t1)
    return {"open_s": statistics.median(opens), "first_batch_s": statistics.median(firsts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = []
    for batches in (int(x) for x in args.histories.split(",")):
        with tempfile.TemporaryDirectory(prefix="cg-bench-log-") as tmp:
            root = Path(tmp) / "lake"
            t = time.perf_counter()
            write_history(root, batches)
            print(f"history of {batches:,} batches written in {time.perf_counter() - t:.0f} s", flush=True)
            write_before(root)
            before = measure(root, batches, args.repeat, 0)
            objects_before = sum(1 for _ in (root / LOG_DIR).iterdir())
            write_folded(root)
            folded = measure(root, batches, args.repeat, 1)
            cleaned = clean_protocol_log(ParquetLakeSink(root, fsync=False).store, retention_hours=0)
            after_clean = measure(root, batches, args.repeat, 2)
            objects_after = sum(1 for _ in (root / LOG_DIR).iterdir())
            ckpts = sorted((root / LOG_DIR).glob("*.checkpoint.json"))
            out.append({"batches": batches, "before": before, "folded": folded, "cleaned": after_clean,
                        "log_objects_before": objects_before, "log_objects_after_clean": objects_after,
                        "checkpoint_bytes_folded": ckpts[-1].stat().st_size, "clean_up": cleaned.to_dict()})
            print(f"  before {before}  folded {folded}  cleaned {after_clean}", flush=True)
    print()
    print(f"{'batches':>9} | {'open before':>11} | {'open folded':>11} | {'ratio':>6} | {'1st batch before':>16} | "
          f"{'1st batch folded':>16} | {'log objects':>15}")
    for r in out:
        b, f = r["before"], r["cleaned"]
        print(f"{r['batches']:>9,} | {b['open_s'] * 1000:>9.1f}ms | {f['open_s'] * 1000:>9.1f}ms | "
              f"{f['open_s'] / b['open_s']:>6.3f} | {b['first_batch_s'] * 1000:>14.1f}ms | "
              f"{f['first_batch_s'] * 1000:>14.1f}ms | {r['log_objects_before']:>6} -> {r['log_objects_after_clean']:<6}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "protocol_log.json").write_text(json.dumps(out, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [r["batches"] for r in out]
    for key, label in (("before", "before (every record, listed)"), ("folded", "folded"),
                       ("cleaned", "folded + cleaned")):
        ax.plot(xs, [(r[key]["open_s"] + r[key]["first_batch_s"]) * 1000 for r in out], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batches landed before (table age)")
    ax.set_ylabel("open + first two batches (ms)")
    ax.set_title("Start-up on the protocol log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "protocol_log.png", dpi=110)


if __name__ == "__main__":
    main()
