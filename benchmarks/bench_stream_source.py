"""Benchmark: the ``cg_member`` Structured Streaming source beside the member job's follow
mode, on the same machine, in the same run: sustained rate and freshness.

For each publish rate (``--fractions`` of the server's own sourcing rate, measured first), two
cases in turn (their order alternating from one rate to the next), each on a group of its own
with one member over ``--partitions`` partitions of a stream of its own, into the Parquet lake:

  follow   the member job under spark-submit as a follower (``--follow``, a batch every
           ``--commit-interval`` seconds or ``--batch-size`` messages), as example DAG 6 runs it,
           with Spark's pipeline (``--transform-sql``, default ``SELECT * FROM batch``: without a
           transformation the job lands raw rows without Spark);
  stream   a query over the member through the ``cg_member`` source (processing-time trigger of
           ``--commit-interval`` seconds, ``maxMessagesPerTrigger`` ``--batch-size``), landing each
           micro-batch through ``SinkBatches`` (the two-phase writer: the same table, commit log
           and exactly-once as the member job).

Both start warm (publishing begins once the job has warmed Spark up, or the query ran its first
batch), publish with ``--publishers`` processes for ``--seconds``. Freshness per message: its
batch's commit in the lake's commit log minus its publish time (the origin's timestamp), p50 /
p99 / max; landed msg/s; sustained: the backlog did not grow while publishing, what was left
landed within 10 s after, p99 within 30 s (``bench_freshness.run_case``'s rule); the job's own CPU
per landed message. Prints a table, writes ``benchmarks/results/stream_source.json`` and
``stream_source.png``; the stream/follow ratios are same-run figures.

    .venv/bin/python benchmarks/bench_stream_source.py [--fractions 0.05,0.1,0.25] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_freshness import (  # noqa: E402 - the freshness benchmark's harness, reused
    RESULTS,
    Lander,
    machine,
    run_case,
    sourcing_rate,
)

from airflow_provider_cg.core.tools.packaging import build_core_zip  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

APP = Path(__file__).resolve().parent / "stream_app.py"


class StreamLander(Lander):
    """One streaming query per member instead of member jobs: the query runs for the case's
    follow time, its checkpoint its own."""

    READY_MARKER = b"cg stream ready"
    WAITS_PULLING = False  # the source keeps its pin with pulls that take nothing, answered at once

    def _start(self, member: str) -> subprocess.Popen:
        env = dict(os.environ, CG_NATS_SERVERS=self.url, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
                   PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        seconds, trigger = self.follow or (60.0, 1.0)
        self.jobs += 1
        log = self._log(member)
        try:
            return subprocess.Popen(
                ["spark-submit", "--master", self.master, "--conf", "spark.ui.enabled=false",
                 "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
                 "--conf", "spark.sql.shuffle.partitions=2", *self._jvm_conf(), "--py-files", str(self.zip_path),
                 str(APP), self.stream, "g", member, str(self.lake), str(self.workdir / f"ck-{self.stream}-{member}"),
                 str(seconds), f"{trigger:g}", self.extra[0] if self.extra else "20000"],
                env=env, cwd=self.workdir, stdout=log, stderr=log)
        finally:
            log.close()

    def _due(self, member: str, now: float, next_round: float) -> bool:
        jobs = self._running[member] = [(t, p) for t, p in self._running.get(member, []) if not self._ended(p)]
        return not jobs and self.jobs == 0  # one query for the whole case


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for schedule, label in (("follow", "member job, follow"), ("stream", "cg_member query + SinkBatches")):
        pts = sorted((r for r in rows if r["schedule"] == schedule), key=lambda r: r["rate_achieved"])
        x = [r["rate_achieved"] / 1000 for r in pts]
        a.plot(x, [r["p99_s"] for r in pts], marker="o", label=f"{label}, p99")
        a.plot(x, [r["p50_s"] for r in pts], marker=".", linestyle="--", label=f"{label}, p50")
        b.plot(x, [r["landed_msg_s"] / 1000 for r in pts], marker="o", label=label)
    a.set_xlabel("publish rate (thousand msg/s)")
    a.set_ylabel("publish -> committed (s)")
    a.set_title("freshness")
    b.set_xlabel("publish rate (thousand msg/s)")
    b.set_ylabel("landed (thousand msg/s, over the case)")
    b.set_title("landed rate")
    for ax in (a, b):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--fractions", default="0.05,0.1,0.25")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--commit-interval", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=20000)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--reference-messages", type=int, default=300_000)
    p.add_argument("--transform-sql", default="SELECT * FROM batch",
                   help="the follower's transformation: Spark's pipeline in the job, as the query's reads are Spark's")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    ran_on = machine()
    fractions = [float(x) for x in args.fractions.split(",")]
    follow_s = args.seconds + 40  # one start per case: it outlives the publishing, which begins once warm
    rows: list[dict] = []
    RESULTS.mkdir(exist_ok=True)
    with (contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory(prefix="cg-ss-")) as d, \
            EmbeddedNatsServer(Path(d) / "nats") as srv:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        reference = asyncio.run(sourcing_rate(srv.url, args.reference_messages))
        print(f"server sourcing alone: {reference:,.0f} msg/s", flush=True)
        for j, frac in enumerate(fractions):
            order = ["follow", "stream"] if j % 2 == 0 else ["stream", "follow"]
            for n, schedule in enumerate(order):
                row = run_case(srv.url, Path(d), f"S{j}x{n}", schedule, None, reference * frac, args.seconds,
                               args.partitions, 1, True, zip_path, args.publishers,
                               follow=(follow_s, args.commit_interval),
                               extra=(("--batch-size", str(args.batch_size), "--transform-sql", args.transform_sql)
                                      if schedule == "follow" else (str(args.batch_size),)),
                               lander_cls=Lander if schedule == "follow" else StreamLander)
                row["fraction"] = frac
                rows.append(row)
                print(f"  {schedule} at {frac:.2f}x sourcing ({row['rate_achieved']:,} msg/s published): p50 "
                      f"{row['p50_s']} s, p99 {row['p99_s']} s, max {row['max_s']} s, landed {row['landed_msg_s']:,} "
                      f"msg/s, {row['cpu_us_per_msg_landing']} us CPU/msg landing, drained in {row['drain_s']} s, "
                      f"sustained {row['sustained']}", flush=True)
    cols = ["schedule", "fraction", "rate_achieved", "landed", "landed_msg_s", "p50_s", "p99_s", "max_s",
            "backlog_max", "drain_s", "cpu_us_per_msg_landing", "sustained"]
    print("\n" + " ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c, '')!s:>14}" for c in cols))
    ratios = {}
    for frac in fractions:
        f = next(r for r in rows if r["fraction"] == frac and r["schedule"] == "follow")
        s = next(r for r in rows if r["fraction"] == frac and r["schedule"] == "stream")
        ratios[f"{frac}x"] = {
            "p99_stream_over_follow": round(s["p99_s"] / f["p99_s"], 2) if s["p99_s"] and f["p99_s"] else None,
            "cpu_stream_over_follow": round(s["cpu_us_per_msg_landing"] / f["cpu_us_per_msg_landing"], 2)
            if s["cpu_us_per_msg_landing"] and f["cpu_us_per_msg_landing"] else None,
            "both_sustained": s["sustained"] and f["sustained"]}
        print(f"{frac}x sourcing: stream/follow p99 {ratios[f'{frac}x']['p99_stream_over_follow']}x, CPU per message "
              f"{ratios[f'{frac}x']['cpu_stream_over_follow']}x (sustained: follow {f['sustained']}, stream "
              f"{s['sustained']})")
    best = {sched: max([r["rate_achieved"] for r in rows if r["schedule"] == sched and r["sustained"]] or [0])
            for sched in ("follow", "stream")}
    out = {"sourcing_msg_s": round(reference), "partitions": args.partitions, "commit_interval_s": args.commit_interval,
           "batch_size": args.batch_size, "machine": ran_on, "cases": rows, "ratios": ratios,
           "highest_sustained_msg_s": best}
    (RESULTS / "stream_source.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, RESULTS / "stream_source.png")
    print(f"\nhighest sustained: follow {best['follow']:,} msg/s, stream {best['stream']:,} msg/s")
    print(f"wrote {RESULTS / 'stream_source.json'} and {RESULTS / 'stream_source.png'}")


if __name__ == "__main__":
    main()
