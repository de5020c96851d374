"""Benchmark: what a Spark follower's start costs, step by step, and what cuts it.

One member job at a time through ``spark-submit --master local[2]`` (as the operator runs it),
following an empty group for a few seconds, so each run is all start: its log's timestamps
split it into

  jvm      spark-submit's launch to the Python driver's first line (spark-submit's JVM, the
           Python driver and the provider's imports)
  session  that line to the SparkSession being ready (the driver's JVM gateway and Spark's
           context)
  warm-up  the session to the job's ``cg Spark warmed up`` line (Spark's first job: its
           Python workers, the Arrow path, a tiny Parquet write), which runs while the job
           waits for the pin
  ready    launch to warmed up: from then on a batch pays only its own work

Variants, alternating in the same run (``--rounds`` each): ``default`` (what the operator
submits), ``c1-jit`` (the driver's JVM with ``-XX:TieredStopAtLevel=1``: C1 compiles only,
a cheaper start, slower hot code) and ``cds`` (the driver's JVM maps the classes from a
class-data-sharing archive that one member job's run dumped as it exited). Prints a table (medians, and each step's ratio to ``default``), writes
``benchmarks/results/spark_start.json`` and ``spark_start.png``.

    .venv/bin/python benchmarks/bench_spark_start.py [--rounds 3] [--variants default,c1-jit]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

RESULTS = Path(__file__).parent / "results"
STEPS = ("jvm", "session", "warm_up", "ready")
VARIANTS = {
    "default": ([], {}),
    "c1-jit": (["--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"], {}),
    # the driver's JVM maps the classes a member job's run loaded from a class-data-sharing
    # archive dumped at that run's exit (``dump_archive``, once before the rounds)
    "cds": (["--conf", "spark.driver.extraJavaOptions=-XX:SharedArchiveFile={archive}"], {}),
}
PY_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")  # the job's own log lines
SPARK_LINE = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d) ")  # log4j's


def _py_time(line: str) -> float | None:
    m = PY_LINE.match(line)
    if not m:
        return None
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.UTC).timestamp()


def one_run(url: str, zip_path: Path, workdir: Path, variant: str, n: int, java_options: str | None = None) -> dict:
    extra, env_extra = VARIANTS[variant]
    extra = [a.format(archive=workdir / "member-job.jsa") for a in extra]
    if java_options is not None:
        extra = ["--conf", f"spark.driver.extraJavaOptions={java_options}"]
    env = dict(os.environ, CG_NATS_SERVERS=url, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TZ="UTC",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env_extra)
    cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
           "--conf", "spark.sql.shuffle.partitions=2", *extra, "--py-files", str(zip_path), str(member_job_path()),
           "--stream", "START", "--group", "g", "--member", "m1", "--sink", "parquet",
           "--sink-path", str(workdir / f"lake-{n}"), "--follow", "4", "--standby-timeout", "30",
           "--transform-sql", "SELECT * FROM batch WHERE origin_seq % 10 <> 7"]
    launched = time.time()
    out = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=600)
    ended = time.time()
    lines = (out.stdout + out.stderr).splitlines()
    first = next((t for t in map(_py_time, lines) if t is not None), None)
    session = next((_py_time(ln) for ln in lines if "cg Spark session ready" in ln), None)
    warmed = next((_py_time(ln) for ln in lines if "cg Spark warmed up" in ln or "cg Spark started" in ln), None)
    said = next((float(m.group(1)) for ln in lines if (m := re.search(r"cg Spark warmed up in ([\d.]+) s", ln))), None)
    row = {"variant": variant, "returncode": out.returncode, "total": round(ended - launched, 2),
           "jvm": round(first - launched, 2) if first else None,
           "warm_up_said": said,
           "ready": round(warmed - launched, 2) if warmed else None}
    if session is not None and first is not None:
        row["session"] = round(session - first, 2)
        row["warm_up"] = round(warmed - session, 2) if warmed else None
    elif warmed is not None and first is not None and said is not None:
        row["session"] = round(max(0.0, warmed - first - said), 2)  # what the warm-up's own clock leaves
        row["warm_up"] = said
    if out.returncode != 0:
        row["tail"] = "\n".join(lines[-15:])
    return row


async def setup(url: str) -> None:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    try:
        await nc.jetstream().add_stream(name="START", subjects=["start.>"])
        await ConsumerGroups(nc).create("START", "g", ElasticGroupConfig(2, (PartitioningFilter("start.*", (1,)),),
                                                                         members=("m1",)))
    finally:
        await nc.close()


def stacked_bars(path: Path, names: list[str], layers: dict[str, list[float]], ylabel: str, title: str,
                 width: float = 8.0) -> None:
    """A bar per name, its ``layers`` (label: one value per name) stacked, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 4))
    bottom = [0.0] * len(names)
    for label, vals in layers.items():
        ax.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(summary: dict, path: Path) -> None:
    names = list(summary)
    stacked_bars(path, names, {step: [summary[n].get(step) or 0.0 for n in names] for step in ("jvm", "session", "warm_up")},
                 "seconds (median)", "A Spark follower's start: launch to warmed up")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="default,c1-jit")
    p.add_argument("--results", default="spark_start")
    args = p.parse_args()
    variants = args.variants.split(",")
    rows: list[dict] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cg-spark-start-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        asyncio.run(setup(srv.url))
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        n = 0
        if "cds" in variants:  # the archive: what one member job's run loaded, dumped as its JVM exits
            dumped = one_run(srv.url, zip_path, Path(d), "default", 0,
                             java_options=f"-XX:ArchiveClassesAtExit={Path(d) / 'member-job.jsa'}")
            size = (Path(d) / "member-job.jsa").stat().st_size if (Path(d) / "member-job.jsa").exists() else 0
            print(f"class-data-sharing archive dumped by a run of {dumped['total']} s: {size / 2**20:.0f} MiB",
                  flush=True)
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else reversed(variants):  # alternate: the machine's drift hits all
                n += 1
                row = one_run(srv.url, zip_path, Path(d), v, n)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for v in variants:
        ok = [r for r in rows if r["variant"] == v and r["returncode"] == 0]
        summary[v] = {s: round(statistics.median([r[s] for r in ok if r.get(s) is not None]), 2)
                      for s in (*STEPS, "total") if any(r.get(s) is not None for r in ok)}
    base = summary.get("default", {})
    print(f"\n{'variant':<12}" + "".join(f"{s:>16}" for s in STEPS))
    for v, s in summary.items():
        cells = [f"{s.get(k, float('nan')):6.2f} s" + (f" {s[k] / base[k]:4.2f}x" if base.get(k) and s.get(k) else "")
                 for k in STEPS]
        print(f"{v:<12}" + "".join(f"{c:>16}" for c in cells))
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load]},
           "rounds": args.rounds, "runs": rows, "median": summary}
    (RESULTS / f"{args.results}.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(summary, RESULTS / f"{args.results}.png")


if __name__ == "__main__":
    main()
