"""A server's disk lost for good under a running group, over several seeds
(``tests/support/lost_disk.py`` says what one run does): the partition-streams layout with and
without a lull in traffic before the loss, with a move to the work-queue layout and back after
it, the work-queue layout as the control, and two servers of three down at once (stores kept). Per run: messages lost, duplicated and out of
per-key order (the run fails on any), what the lost server's partition streams held, and how
long after the replacement started the group was healthy.

Prints a table, writes ``benchmarks/results/lost_disk.json`` and ``lost_disk.png``.

    .venv/bin/python benchmarks/lost_disk.py [--seeds 1,2,3] [--cases ps-lull,ps-steady,ps-move,wq-lull,ps-two-down]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.tools.packaging import build_core_zip  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsCluster  # noqa: E402
from tests.support.lost_disk import LostDiskRun  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CASES = {  # name: (layout, lull, move, two servers down instead of a disk lost)
    "ps-lull": ("partition-streams", True, False, False),
    "ps-steady": ("partition-streams", False, False, False),
    "ps-move": ("partition-streams", True, True, False),
    "wq-lull": ("work-queue", True, False, False),
    "ps-two-down": ("partition-streams", True, False, True),
}


def one(case: str, seed: int, zip_path: Path) -> dict:
    layout, lull, move, two_down = CASES[case]
    run = LostDiskRun(layout, seed, lull=lull, move=move, disk=not two_down, two_down=two_down)
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cg-lost-disk-") as d, EmbeddedNatsCluster(3, Path(d) / "cluster") as c:
        error = None
        try:
            asyncio.run(run.run(c, zip_path, Path(d)))
        except AssertionError as e:  # the verdict: lost, duplicated, out of order, or not landed
            error = str(e).splitlines()[0]
        except Exception:  # noqa: BLE001 - reported, the other runs go on
            error = traceback.format_exc(limit=3).splitlines()[-1]
    return {"case": case, "seed": seed, "ok": error is None, "error": error, "lost": run.lost,
            "lost_server_held": sum(run.lost_server_streams.values()), "healthy_after_s": run.healthy_after_s,
            "landed_after_s": run.landed_after_s,
            "run_s": round(time.monotonic() - t, 1), "events": run.events}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cg-zip-") as d:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        rows = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            for case in args.cases.split(","):
                r = one(case, seed, zip_path)
                rows.append(r)
                print({k: v for k, v in r.items() if k != "events"}, flush=True)
    print("\ncase | seed | ok | lost | the lost server's partition streams held | healthy after | all landed after | run")
    for r in rows:
        print(f"{r['case']} | {r['seed']} | {'yes' if r['ok'] else 'NO: ' + str(r['error'])} | {r['lost']} | "
              f"{r['lost_server_held']} | {r['healthy_after_s']} s | {r['landed_after_s']} s | {r['run_s']} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lost_disk.json").write_text(json.dumps(rows, indent=2))
    plot(rows, RESULTS / "lost_disk.png")
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for i, case in enumerate(cases):
        ys = [r["healthy_after_s"] for r in rows if r["case"] == case and r["healthy_after_s"] is not None]
        ax.scatter([i] * len(ys), ys, label=case)
    ax.set_xticks(range(len(cases)), cases)
    ax.set(ylabel="seconds from the replacement's start", ylim=(0, None),
           title="group healthy again after a disk lost for good (each dot a seed; 0 lost in every run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
