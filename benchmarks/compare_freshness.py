"""Compare runs of ``bench_freshness.py`` made on two trees, alternating (before, after, before,
...), so that a change is measured against its baseline on the same host in the same hour.

Each run's ``--results`` JSON is given in order as ``before:PATH`` or ``after:PATH``. Prints
each case's CPU per landed message (start-up left out) and p50 and p99 freshness, run by run,
with the 6:1 ratio of each run, and writes ``benchmarks/results/<name>.json`` and ``.png``.

How the runs are made (the tree before in a git worktree, the same command in both)::

    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before python /tmp/before/benchmarks/bench_freshness.py ... --results /tmp/b1
    PYTHONPATH=$PWD python benchmarks/bench_freshness.py ... --results /tmp/a1
    python benchmarks/compare_freshness.py --name NAME before:/tmp/b1.json after:/tmp/a1.json ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def load(specs: list[str]) -> list[dict]:
    runs = []
    for spec in specs:
        tree, _, path = spec.partition(":")
        if tree not in ("before", "after") or not path:
            raise SystemExit(f"compare_freshness: {spec!r}: give before:PATH or after:PATH")
        data = json.loads(Path(path).read_text())
        cases = {f"{c['members']}m {c['fraction']}x": c for c in data["cases"] if c["schedule"] == "follow"}
        runs.append({"tree": tree, "sourcing_msg_s": data["sourcing_msg_s"], "cases": {
            k: {"cpu_us_per_msg_landing": c["cpu_us_per_msg_landing"], "p99_s": c["p99_s"],
                "p50_s": c["p50_s"], "sustained": c["sustained"], "rate_achieved": c["rate_achieved"]}
            for k, c in cases.items()}})
    return runs


def ratios(run: dict) -> dict[str, float]:
    out = {}
    for key, c in run["cases"].items():
        members, fraction = key.split(" ")
        one = run["cases"].get(f"1m {fraction}")
        if members != "1m" and one:
            out[key] = round(c["cpu_us_per_msg_landing"] / one["cpu_us_per_msg_landing"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="results name (benchmarks/results/NAME.json and .png)")
    ap.add_argument("runs", nargs="+", help="before:PATH or after:PATH, in the order they ran")
    args = ap.parse_args()
    runs = load(args.runs)
    keys = sorted({k for r in runs for k in r["cases"]}, key=lambda k: (int(k.split("m")[0]), k))
    print(f"{'case':>10} " + " ".join(f"{r['tree']:>8}" for r in runs))
    for k in keys:
        print(f"{k:>10} " + " ".join(f"{r['cases'][k]['cpu_us_per_msg_landing']:8.1f}" if k in r["cases"] else
                                     f"{'-':>8}" for r in runs) + "   us CPU per landed message")
    for figure in ("p50_s", "p99_s"):
        for k in keys:
            print(f"{k:>10} " + " ".join(f"{r['cases'][k][figure]:8.2f}" if k in r["cases"] else f"{'-':>8}"
                                         for r in runs) + f"   {figure[:3]} freshness, s")
    for k in keys:
        if not k.startswith("1m"):
            print(f"{k + ' / 1m':>10} " + " ".join(f"{ratios(r).get(k, float('nan')):8.2f}" for r in runs))
    out = {"runs": [{**r, "ratio_to_one_member": ratios(r)} for r in runs]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    for ax, figure, label in zip(axes, ("cpu_us_per_msg_landing", "p99_s"),
                                 ("jobs' CPU per landed message (µs)", "p99 freshness (s)"), strict=True):
        for i, r in enumerate(runs):
            xs = [j + i * width for j in range(len(keys))]
            ax.bar(xs, [r["cases"].get(k, {}).get(figure, 0) for k in keys], width,
                   color="#9aa7b8" if r["tree"] == "before" else "#017cee", label=r["tree"] if i < 2 else None)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("followers, trees before and after, alternating runs")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=110)
    print(f"wrote {RESULTS / args.name}.json and .png")


if __name__ == "__main__":
    main()
