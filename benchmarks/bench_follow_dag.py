"""Benchmark: example DAG 6 (``cg_follow_orders``) under Airflow's own scheduler, run after run.

What users copy to land continuously: ``@continuous``, followers of ``CG_FOLLOW_SECONDS`` each,
one spark-submit per member and run. Started here as Airflow runs it (its api-server, scheduler,
dag-processor and triggerer from this environment, LocalExecutor on SQLite, a fresh
``AIRFLOW_HOME``), on an embedded nats-server, with the group the other example DAGs make
(``orders-lake``: 6 partitions, members m1-m3). Orders are published at ``--rate`` per second
from the moment the first run is pinned until ``--runs`` runs have ended (and ``--tail`` seconds
after), so every hand-over between runs happens under load.

Measured from the Delta table (its ``_delta_log``, read without the sink): per paid order
published while the runs go on (not the first 300, which wait for the first run's Spark), the
freshness = the commit time of the table version that added it - the time it was stored in the
group's work queue (the row's ``timestamp``: the publish plus the sourcing's milliseconds), as
p50 / p90 / p99 / max; the gaps between the table's consecutive commits while orders arrive
(the largest is the longest the table stood still); each run's start and end, and how the
members' pins passed (``stop_reason``). Compare two settings in one run with
``--handover 0,120`` (one Airflow each, one after the other). Prints a table, writes
``benchmarks/results/follow_dag.json`` and ``follow_dag.png``.

    .venv/bin/python benchmarks/bench_follow_dag.py [--follow 90] [--handover 0,60] [--runs 3] [--rate 40]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))
from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.tools.packaging import example_dags_folder  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402
from airflow_provider_cg.demo import _orders  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DAG_ID = "cg_follow_orders"
GROUP = "orders-lake"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Airflow:
    """Airflow's four services on a fresh ``AIRFLOW_HOME``, stopped by their PIDs."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.port = home, _free_port()
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CG_"))}, **env,
                    "AIRFLOW_HOME": str(home), "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.port}",
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                    "AIRFLOW__CORE__DAGS_FOLDER": str(example_dags_folder()),
                    "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        self.procs: list[subprocess.Popen] = []

    def run(self, *args: str) -> str:
        r = subprocess.run([str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"airflow {' '.join(args)}: {r.stderr[-2000:]}")
        return r.stdout

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.run("db", "migrate")
        for name, args in (("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(self.port)]),
                           ("scheduler", ["scheduler", "--skip-serve-logs"]), ("dag-processor", ["dag-processor"]),
                           ("triggerer", ["triggerer", "--skip-serve-logs"])):
            log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - the child's
            self.procs.append(subprocess.Popen([str(BIN / "airflow"), *args], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=5):
                    return
            except OSError:
                time.sleep(2)
        raise TimeoutError("Airflow's api-server did not answer")

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, sig)
            deadline = time.monotonic() + 30
            while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
                time.sleep(0.5)

    def runs(self) -> list[dict]:
        out = self.run("dags", "list-runs", DAG_ID, "-o", "json")
        lines = [ln for ln in out.splitlines() if ln.startswith("[")]
        return json.loads(lines[-1]) if lines else []


def _epoch(iso: str | None) -> float | None:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


def table_commits(lake: Path, since: float = 0.0) -> tuple[list[float], dict[int, float]]:
    """The Delta table's commit times (s) in version order, and per landed ``origin_seq`` stored
    at ``since`` or later the freshness: its version's commit time minus the row's
    ``timestamp`` (the orders published before, for the first run's first batches, waited for
    its Spark start: they are not the hand-overs' figure)."""
    import pyarrow.parquet as pq

    times: list[float] = []
    fresh: dict[int, float] = {}
    for f in sorted((lake / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        at = float(info.get("timestamp", 0)) / 1000
        adds = [a["add"]["path"] for a in actions if "add" in a]
        if not adds:
            continue
        times.append(at)
        for path in adds:
            t = pq.read_table(lake / path, columns=["origin_seq", "timestamp"])
            stored = t.column("timestamp").cast("int64").to_numpy() / 1e6  # microseconds
            for seq, ts in zip(t.column("origin_seq").to_pylist(), stored, strict=True):
                if ts >= since:
                    fresh[seq] = at - ts
    return times, fresh


def publish(url: str, rate: float, stop: threading.Event, first: int) -> None:
    """``rate`` orders a second (in 10 rounds a second) until ``stop``."""
    async def go() -> None:
        nc = await NatsConnectionSettings(servers=[url]).connect()
        n, next_at = first, time.monotonic()
        per = max(1, round(rate / 10))
        while not stop.is_set():
            await publish_many(nc, _orders(per, 3000, first=n))
            n += per
            next_at += per / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await nc.close()

    asyncio.run(go())


def run_setting(workdir: Path, handover: float, args: argparse.Namespace) -> dict:
    lake = workdir / "lake" / "paid_orders"
    with EmbeddedNatsServer(workdir / "nats") as srv:
        async def setup() -> None:
            nc = await NatsConnectionSettings(servers=[srv.url]).connect()
            api = JsApi(nc)
            await api.add_stream({"name": "ORDERS", "subjects": ["orders.>"], "storage": "file",
                                  "allow_direct": True})
            await ConsumerGroups(nc).create("ORDERS", GROUP, ElasticGroupConfig(
                6, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2", "m3")))
            await publish_many(nc, _orders(300, 3000, first=1))  # the first run's first batches
            await nc.close()

        asyncio.run(setup())
        airflow = Airflow(workdir / "airflow", {
            "AIRFLOW_CONN_NATS_DEFAULT": json.dumps({"conn_type": "nats", "host": "127.0.0.1", "port": srv.port}),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "CG_FOLLOW_SECONDS": str(args.follow), "CG_FOLLOW_HANDOVER_SECONDS": str(handover),
            "CG_FOLLOW_SINK_PATH": str(lake), "CG_DEMO_DIR": str(workdir)})
        stop = threading.Event()
        publisher = threading.Thread(target=publish, args=(srv.url, args.rate, stop, 301), daemon=True)
        try:
            airflow.start()
            deadline = time.monotonic() + 300
            while DAG_ID not in airflow.run("dags", "list") and time.monotonic() < deadline:
                time.sleep(3)
            airflow.run("dags", "unpause", DAG_ID)
            deadline = time.monotonic() + 600
            while not (lake / "_delta_log").exists() and time.monotonic() < deadline:
                time.sleep(1)  # the first run is pinned and landed: publishing begins
            started = time.time()
            publisher.start()
            deadline = time.monotonic() + (args.runs + 2) * (args.follow + handover + 240)
            while time.monotonic() < deadline:
                done = [r for r in airflow.runs() if r["state"] in ("success", "failed")]
                if len(done) >= args.runs + 1:  # the first is the one that started before publishing
                    break
                time.sleep(5)
            time.sleep(args.tail)
            stop.set()
            publisher.join(30)
            ended = time.time()
            time.sleep(args.follow / 2)  # what was published last lands
            runs = sorted(airflow.runs(), key=lambda r: _epoch(r["start_date"]) or 0)
        finally:
            stop.set()
            airflow.stop()
    times, fresh = table_commits(lake, started)
    during = [t for t in times if started <= t <= ended]
    gaps = np.diff(during) if len(during) > 1 else np.zeros(1)
    values = np.array(list(fresh.values()))
    q = np.percentile(values, [50, 90, 99]) if len(values) else np.zeros(3)
    return {"handover_s": handover, "follow_s": args.follow, "rate_msg_s": args.rate,
            "runs": [{"state": r["state"], "start": r["start_date"], "end": r["end_date"]} for r in runs],
            "orders_landed": len(values), "freshness_p50_s": round(float(q[0]), 2),
            "freshness_p90_s": round(float(q[1]), 2), "freshness_p99_s": round(float(q[2]), 2),
            "freshness_max_s": round(float(values.max()), 2) if len(values) else None,
            "largest_commit_gap_s": round(float(gaps.max()), 2), "commits_while_publishing": len(during),
            "gaps_over_2s": int((gaps > 2.0).sum()),
            # where the table stood still, seconds after publishing began: to set against the runs
            "gaps_at": [[round(float(during[i] - started), 1), round(float(g), 1)] for i, g in enumerate(gaps)
                        if g > 2.0],
            "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
            "hand_overs": hand_overs(workdir / "airflow" / "logs")}


def hand_overs(logs: Path) -> list[dict]:
    """Each follow task's own words on its pin: when it was pinned, handed over or ended, and
    its Spark start (from its task log)."""
    out = []
    words = ("cg pinned", "handing over to", "Spark warmed up in", "Spark session started in", "follow ended",
             "handed over to its successor", "cg result", "waiting for the pin")
    for path in sorted(logs.glob(f"dag_id={DAG_ID}/run_id=*/task_id=follow/map_index=*/attempt=*.log")):
        lines = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line).get("event", "")
            except ValueError:
                continue
            if any(w in event for w in words):
                lines.append(event[:200])
        out.append({"task": str(path.relative_to(logs)), "said": lines})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--follow", type=float, default=90.0, help="CG_FOLLOW_SECONDS: each run's follow time")
    p.add_argument("--handover", default="0,60", help="CG_FOLLOW_HANDOVER_SECONDS to compare, comma-separated")
    p.add_argument("--runs", type=int, default=3, help="runs that begin and end while orders arrive")
    p.add_argument("--rate", type=float, default=40.0, help="orders a second")
    p.add_argument("--tail", type=float, default=10.0, help="seconds of orders after the last run counted")
    p.add_argument("--keep", action="store_true", help="keep each setting's directory (logs, table, store)")
    args = p.parse_args()
    out = []
    for handover in (float(h) for h in args.handover.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix="cg-follow-dag-"))
        try:
            row = run_setting(workdir, handover, args)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        out.append(row)
        print(f"handover_wait {handover:>5.0f} s: {row['orders_landed']:>6} orders, freshness p50 "
              f"{row['freshness_p50_s']:.1f} s p90 {row['freshness_p90_s']:.1f} s p99 {row['freshness_p99_s']:.1f} s "
              f"max {row['freshness_max_s']} s; largest commit gap {row['largest_commit_gap_s']:.1f} s "
              f"({row['gaps_over_2s']} over 2 s) over {len(row['runs'])} runs", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "follow_dag.json").write_text(json.dumps(out, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    labels = [f"handover_wait {r['handover_s']:.0f} s" for r in out]
    xs = np.arange(len(out))
    for i, (key, label) in enumerate((("freshness_p50_s", "p50"), ("freshness_p99_s", "p99"),
                                      ("largest_commit_gap_s", "largest commit gap"))):
        ax.bar(xs + (i - 1) * 0.27, [r[key] for r in out], 0.27, label=label)
    ax.set_xticks(xs, labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title(f"DAG 6 under Airflow's scheduler, {args.runs} runs, {args.rate:.0f} orders/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "follow_dag.png", dpi=110)


if __name__ == "__main__":
    main()
