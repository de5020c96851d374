"""The partition-streams layout's speed on two trees, in one run: ``bench_group_scale.py`` (its
``cpu``, ``read`` and ``2of6`` cases, partition-streams only) on a checkout of ``--before`` (a
git worktree made here) and on this tree, alternating, ``--rounds`` times each, so both see the
same machine at about the same times. Prints a table of every figure per tree (the median of
the rounds, and the after/before ratio), writes ``benchmarks/results/<--results>.json`` and a
plot.

    .venv/bin/python benchmarks/compare_group_scale.py --before 8d32c14 [--rounds 2]
        [--messages 150000] [--read-messages 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
RESULTS = HERE / "results"
FIGURES = {  # (case, the row's identity, the figure)
    "cpu": (("members",), ("landed_msg_s", "sourcing_us", "server_us", "jobs_us")),
    "read": (("partitions",), ("msg_s", "server_us", "group_server_us")),
    "2of6": (("layout", "partitions"), ("msg_s",)),
}


def run_bench(tree: Path, name: str, args) -> dict:
    cmd = [sys.executable, str(HERE / "bench_group_scale.py"), "--parts", "cpu,read,2of6",
           "--layouts", "partition-streams", "--messages", str(args.messages),
           "--read-messages", str(args.read_messages), "--results", name]
    subprocess.run(cmd, check=True, env=dict(os.environ, CG_TREE=str(tree)), stdout=subprocess.DEVNULL)
    return json.loads((RESULTS / f"{name}.json").read_text())


def rows_of(result: dict) -> dict[tuple, float]:
    out = {}
    for case, (ident, figures) in FIGURES.items():
        for r in result.get(case) or []:
            key = (case, *(r[k] for k in ident))
            for f in figures:
                out[(*key, f)] = r[f]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="the commit to compare with (e.g. the last one before a change)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--messages", type=int, default=150_000)
    p.add_argument("--read-messages", type=int, default=100_000)
    p.add_argument("--results", default="group_scale_ab")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cg-before-") as d:
        before = Path(d) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for i in range(args.rounds):
                for label, tree in (("before", before), ("after", ROOT)):
                    runs[label].append(run_bench(tree, f"_{args.results}_{label}_{i}", args))
                    print(f"round {i + 1}: {label} done", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
    for label in runs:
        for i in range(args.rounds):
            for ext in ("json", "png"):
                (RESULTS / f"_{args.results}_{label}_{i}.{ext}").unlink(missing_ok=True)
    table = []
    per = {label: [rows_of(r) for r in rs] for label, rs in runs.items()}
    for key in per["after"][0]:
        b = [r[key] for r in per["before"] if key in r]
        a = [r[key] for r in per["after"] if key in r]
        if not b:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        table.append({"case": " ".join(map(str, key[:-1])), "figure": key[-1], "before": b, "after": a,
                      "before_median": mb, "after_median": ma, "after_x_before": round(ma / mb, 3) if mb else None})
    print("\ncase | figure | before (runs) | after (runs) | after / before")
    for t in table:
        print(f"{t['case']} | {t['figure']} | {t['before']} | {t['after']} | {t['after_x_before']}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results}.json").write_text(json.dumps({"before": args.before, "rounds": args.rounds,
                                                              "messages": args.messages,
                                                              "read_messages": args.read_messages,
                                                              "figures": table, "runs": runs}, indent=2))
    plot(table, RESULTS / f"{args.results}.png", args.before)


def plot(table: list[dict], path: Path, before: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels = [f"{t['case']}\n{t['figure']}" for t in table]
    ax.bar(range(len(table)), [t["after_x_before"] or 0 for t in table], color="tab:blue")
    ax.axhline(1.0, color="black", lw=0.8)
    for y in (0.9, 1.1):
        ax.axhline(y, color="grey", lw=0.6, ls="--")
    ax.set_xticks(range(len(table)), labels, rotation=70, fontsize=7)
    ax.set(ylabel=f"after / before ({before}), median of rounds",
           title="partition-streams layout: each figure after the change against before, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
