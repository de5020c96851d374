"""Benchmark: the member job vs. the naive nats-py loop, in one run, on one machine.

For each message count (default 1,000,000 and 3,000,000) it starts a fresh embedded
nats-server, publishes N messages of 200 bytes over 2,000 keys into an origin stream that two
elastic groups source (each its own work-queue stream), then times

  (a) the naive loop: a plain pull consumer on group A's member partitions,
      ``fetch(1000)`` then ``await msg.ack()`` per message (nothing written anywhere);
  (b) the member job under real ``spark-submit --master local[2]`` on group B into the
      Parquet lake sink, end to end, JVM start-up excluded (the job's own ``duration_s``,
      from NATS connect to its last commit);

and prints both rates, their ratio, and the peak RSS of the job's Python driver (sampled from
/proc while it runs). ``--partitions`` sets how many partitions the measured member holds: 1
gives its consumer one filter subject; more gives it several, which nats-server 2.15 serves
far more slowly (see the README's performance notes).

    .venv/bin/python benchmarks/bench_member_job.py [--messages 1000000,3000000] [--partitions 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from airflow_provider_cg.core.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.connection import NatsConnectionSettings
from airflow_provider_cg.core.groups import ConsumerGroups
from airflow_provider_cg.core.packaging import build_core_zip, member_job_path
from airflow_provider_cg.core.publish import publish_many
from airflow_provider_cg.core.server import EmbeddedNatsServer
from airflow_provider_cg.core.sinks.parquet import read_committed

STREAM = "BENCH"
KEYS = 2000
SIZE = 200


async def prepare(url: str, n: int, partitions: int) -> float:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=["bench.*"])
    groups = ConsumerGroups(nc)
    for g in ("naive", "job"):
        cfg = ElasticGroupConfig(max_members=partitions, partitioning_filters=(PartitioningFilter("bench.*", (1,)),),
                                 members=("m1",))
        await groups.create(STREAM, g, cfg)
    payload = os.urandom(SIZE)
    t = time.perf_counter()
    await publish_many(nc, ((f"bench.k{i % KEYS}", payload) for i in range(n)))
    rate = n / (time.perf_counter() - t)
    for g in ("naive", "job"):  # wait for the sourcing into both work-queue streams
        while (await js.stream_info(f"{STREAM}-{g}")).state.messages < n:  # noqa: ASYNC110 - polling server state
            await asyncio.sleep(0.5)
    await nc.close()
    return rate


async def naive(url: str, n: int, partitions: int) -> float:
    """fetch(1000) + ack() per message, nats-py's documented pull loop."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    js = nc.jetstream()
    from nats.js.api import AckPolicy, ConsumerConfig

    filters = [f"{p}.bench.*" for p in range(partitions)]
    cfg = ConsumerConfig(durable_name="naive", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=-1)
    if len(filters) == 1:
        cfg.filter_subject = filters[0]
    else:
        cfg.filter_subjects = filters
    await js.add_consumer(f"{STREAM}-naive", cfg)
    sub = await js.pull_subscribe_bind("naive", stream=f"{STREAM}-naive")
    got = 0
    t = time.perf_counter()
    while got < n:
        try:
            msgs = await sub.fetch(1000, timeout=5)
        except Exception:
            continue
        for m in msgs:
            await m.ack()
        got += len(msgs)
    d = time.perf_counter() - t
    await nc.close()
    return got / d


def _descendants(pid: int) -> list[int]:
    """PIDs below ``pid``, from the parent field of every /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _driver_peak_rss(proc: subprocess.Popen, result: dict) -> None:
    """Sample the peak RSS (VmHWM) of the job's Python driver until spark-submit exits."""
    peak = 0
    while proc.poll() is None:
        for pid in _descendants(proc.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"cg_member_job.py" not in cmd or b"python" not in cmd.split(b"\0")[0]:
                    continue
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
            except OSError:
                continue
        time.sleep(0.2)
    result["peak_rss_mb"] = round(peak / 1024, 1)


def job(url: str, workdir: Path, batch_size: int) -> dict:
    zip_path = build_core_zip(workdir / "cg_core.zip")
    env = dict(os.environ, CG_NATS_SERVERS=url, PYSPARK_PYTHON=sys.executable,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = ["spark-submit", "--master", "local[2]", "--driver-memory", "2g", "--py-files", str(zip_path),
           str(member_job_path()), "--stream", STREAM, "--group", "job", "--member", "m1",
           "--sink", "parquet", "--sink-path", str(workdir / "lake"), "--batch-size", str(batch_size)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    mem: dict = {}
    sampler = threading.Thread(target=_driver_peak_rss, args=(proc, mem), daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    wall = time.perf_counter() - started
    lines = [ln for ln in out.splitlines() if ln.startswith("CG_SUMMARY ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"member job failed (exit {proc.returncode})")
    summary = json.loads(lines[-1][len("CG_SUMMARY "):])
    summary.update(mem, wall_s=round(wall, 1))
    return summary


def run_one(n: int, partitions: int, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cg-bench-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        pub = asyncio.run(prepare(srv.url, n, partitions))
        naive_rate = asyncio.run(naive(srv.url, n, partitions))
        s = job(srv.url, Path(d), batch_size)
        rows = read_committed(str(Path(d) / "lake"), columns=["origin_seq"]).num_rows
        if s["consumed"] != n or rows != n:
            raise SystemExit(f"job landed {rows} rows / consumed {s['consumed']}, expected {n}")
        job_rate = s["consumed"] / s["duration_s"]
        return {"messages": n, "partitions": partitions, "publish_msg_s": round(pub), "naive_msg_s": round(naive_rate),
                "job_msg_s": round(job_rate), "ratio": round(job_rate / naive_rate, 2), "job_duration_s": s["duration_s"],
                "spark_submit_wall_s": s["wall_s"], "driver_peak_rss_mb": s.get("peak_rss_mb")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", default="1000000,3000000")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=100_000)
    args = p.parse_args()
    results = [run_one(int(n), args.partitions, args.batch_size) for n in args.messages.split(",")]
    cols = list(results[0])
    print("  ".join(f"{c:>20}" for c in cols))
    for r in results:
        print("  ".join(f"{r[c]!s:>20}" for c in cols))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
