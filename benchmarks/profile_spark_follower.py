"""Profile: where a follower's CPU goes at a steady rate, with Spark work and without.

One member job at a time follows a group of two partitions while this script publishes at
``--rate`` messages a second for ``--seconds`` (about 200-byte JSON orders); the job lands them
into the Parquet lake. Variants, alternating in the same run (``--rounds`` each):

  spark     spark-submit --master local[2] with the SQL transformation the freshness
            benchmark uses (as the operator runs a follower)
  spark-c1  the same with the driver's JVM compiling with C1 only (``-XX:TieredStopAtLevel=1``)
  spark-c1-serial  and Java's serial garbage collector (``-XX:+UseSerialGC``)
  no-spark  the job's plain Python driver, raw payloads (``--no-spark``)

Once the job has landed a first message (its start and warm-up done), the CPU of every process
of the job's tree (user + system, from ``/proc``) is read at the window's start and once all the
window's messages have landed, and split by kind: the JVM (Spark's driver and, in local mode,
its executors), the driver's Python, Spark's Python workers. With ``--py-spy`` the driver's Python
is sampled by py-spy through the window (on-CPU samples only) and its heaviest functions of the
provider and of PySpark are listed. Prints tables, writes
``benchmarks/results/<results>.json`` and ``.png``.

    .venv/bin/python benchmarks/profile_spark_follower.py [--rate 7000] [--seconds 30] [--rounds 2] [--py-spy]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))
from bench_spark_start import stacked_bars  # noqa: E402

from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

RESULTS = Path(__file__).parent / "results"
KINDS = ("jvm", "driver_python", "python_workers", "other")
SQL = "SELECT * FROM batch WHERE origin_seq % 10 <> 7"
TICKS = os.sysconf("SC_CLK_TCK")
#: the Spark variants: the driver JVM's options (local mode: the driver's JVM runs the tasks too)
JAVA_OPTIONS = {
    "spark": "",
    "spark-c1": "-XX:TieredStopAtLevel=1",  # C1 compiles only: less JIT work, slower peak code
    "spark-c1-serial": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",  # and one GC thread, no concurrent marking
}


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, now."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    if comm == "java":
        return "jvm"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd or "pyspark/daemon" in cmd:
        return "python_workers"
    if "cg_member_job" in cmd:
        return "driver_python"
    return "other"


def cpu_by_kind(root: int) -> dict[int, tuple[str, float]]:
    """Each live process of the tree: its kind and its CPU seconds so far."""
    out = {}
    for pid in _tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (_kind(pid), (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def rows_of(messages: int, variant: str) -> int:
    """The rows the first ``messages`` of a run's stream land as (the transformation drops
    origin sequences ending in 7)."""
    return messages - (messages + 3) // 10 if variant.startswith("spark") else messages


def jvm_threads(root: int) -> dict[str, float]:
    """CPU seconds so far of the tree's JVM threads, by thread name (digits dropped: a pool's
    threads together)."""
    out: collections.Counter = collections.Counter()
    for pid in _tree(root):
        if _kind(pid) != "jvm":
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            out["".join(c for c in name if not c.isdigit()).strip(" -#")] += (int(fields[11]) + int(fields[12])) / TICKS
    return dict(out)


def landed(lake: Path) -> int:
    from airflow_provider_cg.core.landing.sinks.lake.reader import read_committed

    try:
        return read_committed(lake).num_rows
    except (FileNotFoundError, OSError, ValueError):
        return 0


async def publish(url: str, stream: str, rate: float, seconds: float, first: int) -> int:
    """``rate`` messages a second for ``seconds``, in slices of 50 ms; returns how many."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    sent, start = 0, time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(rate * min(elapsed + 0.05, seconds)) - sent
            if due > 0:
                msgs = [(f"{stream.lower()}.k{(first + sent + i) % 64}",
                         b'{"id":%d,"amount":%d.25,"note":"%s"}' % (first + sent + i, i % 997, b"x" * 150))
                        for i in range(due)]
                await publish_many(nc, msgs)
                sent += due
            await asyncio.sleep(max(0.0, start + (sent / rate) - time.monotonic()))
    finally:
        await nc.close()
    return sent


async def setup(url: str, stream: str) -> None:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    try:
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream.lower()}.*"])
        await ConsumerGroups(nc).create(stream, "g", ElasticGroupConfig(
            2, (PartitioningFilter(f"{stream.lower()}.*", (1,)),), members=("m1",)))
    finally:
        await nc.close()


def _py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(exe):
        print("py-spy is not installed (pip install py-spy): no driver profile", flush=True)
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                             "--format", "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def heaviest(raw: Path, top: int = 14) -> list[tuple[str, float]]:
    """The provider's and PySpark's functions by inclusive share of the driver's samples."""
    total, per = 0, collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        seen = set()
        for frame in stack.split(";"):
            if "airflow_provider_cg" in frame or "pyspark" in frame or "pyarrow" in frame:
                name = frame.split(" (")[0] + " (" + frame.split(" (")[-1].split("/")[-1]
                if name not in seen:
                    seen.add(name)
                    per[name] += n
    return [(name, round(n / total, 3)) for name, n in per.most_common(top)] if total else []


def one_run(url: str, zip_path: Path, workdir: Path, variant: str, n: int, args: argparse.Namespace) -> dict:
    stream = f"P{n}"
    asyncio.run(setup(url, stream))
    lake = workdir / f"lake-{n}"
    env = dict(os.environ, CG_NATS_SERVERS=url, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    job = ["--stream", stream, "--group", "g", "--member", "m1", "--sink", "parquet", "--sink-path", str(lake),
           "--follow", str(args.seconds + 120), "--commit-interval", str(args.commit_interval),
           "--standby-timeout", "60", "--progress-interval", "5"]
    if variant.startswith("spark"):
        java = JAVA_OPTIONS[variant]
        cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
               *(["--conf", f"spark.driver.extraJavaOptions={java}"] if java else []),
               "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
               "--conf", "spark.sql.shuffle.partitions=2", "--py-files", str(zip_path), str(member_job_path()),
               *job, "--transform-sql", SQL]
    else:
        cmd = [sys.executable, str(member_job_path()), *job, "--no-spark"]
    log = (workdir / f"job-{n}.log").open("w")
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    row: dict = {"variant": variant, "rate": args.rate}
    try:
        sent = asyncio.run(publish(url, stream, 50, 1.0, 0))  # its start and warm-up: until these land
        deadline = time.monotonic() + 300
        while landed(lake) < rows_of(sent, variant):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / f"job-{n}.log").read_text().splitlines()[-20:]
                raise RuntimeError(f"the {variant} job landed nothing; its log ends:\n" + "\n".join(tail))
            time.sleep(0.2)
        time.sleep(2.0)
        threads_before = jvm_threads(proc.pid)
        before = cpu_by_kind(proc.pid)
        driver = next((pid for pid, (kind, _) in before.items() if kind == "driver_python"), None)
        spy = _py_spy(driver, args.seconds, workdir / f"py-spy-{n}.txt") if args.py_spy and driver else None
        started = time.monotonic()
        window = asyncio.run(publish(url, stream, args.rate, args.seconds, sent))
        published_for = time.monotonic() - started
        while landed(lake) < rows_of(sent + window, variant) and time.monotonic() - started < args.seconds + 120:
            time.sleep(0.1)
        caught_up = time.monotonic() - started
        after = cpu_by_kind(proc.pid)
        threads = {k: v - threads_before.get(k, 0.0) for k, v in jvm_threads(proc.pid).items()}
        row["jvm_threads_us_per_msg"] = dict(sorted(((k, round(v / max(window, 1) * 1e6, 1))
                                                     for k, v in threads.items() if v > 0.005),
                                                    key=lambda kv: -kv[1])[:12])
        if args.idle:  # the same JVM with nothing to land: what it costs a second by itself
            idle_before, idle_threads = cpu_by_kind(proc.pid), jvm_threads(proc.pid)
            time.sleep(args.idle)
            idle_after, idle_threads_after = cpu_by_kind(proc.pid), jvm_threads(proc.pid)
            row["idle_cpu_per_s"] = {k: round(sum(sec - (idle_before[pid][1] if pid in idle_before else 0.0)
                                                  for pid, (kind, sec) in idle_after.items() if kind == k)
                                              / args.idle, 3) for k in KINDS}
            row["idle_jvm_threads_per_s"] = dict(sorted(((k, round((v - idle_threads.get(k, 0.0)) / args.idle, 3))
                                                         for k, v in idle_threads_after.items()
                                                         if v - idle_threads.get(k, 0.0) > 0.005),
                                                        key=lambda kv: -kv[1])[:8])
        if spy is not None:
            spy.wait(timeout=args.seconds + 60)
            row["driver_profile"] = heaviest(workdir / f"py-spy-{n}.txt")
        cpu = dict.fromkeys(KINDS, 0.0)
        for pid, (kind, seconds) in after.items():
            cpu[kind] += seconds - (before[pid][1] if pid in before else 0.0)
        row.update({"published": window, "published_s": round(published_for, 2),
                    "caught_up_s": round(caught_up, 2),
                    "all_landed": landed(lake) == rows_of(sent + window, variant),
                    "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
                    "cpu_us_per_msg": {k: round(v / window * 1e6, 1) for k, v in cpu.items()},
                    "total_us_per_msg": round(sum(cpu.values()) / window * 1e6, 1)})
        return row
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def plot(summary: dict, path: Path) -> None:
    names = list(summary)
    stacked_bars(path, names, {kind.replace("_", " "): [summary[n]["cpu_us_per_msg"].get(kind, 0.0) for n in names]
                               for kind in KINDS},
                 "CPU µs per landed message (median)", "A follower's CPU by process, same rate", width=7.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rate", type=float, default=7000.0, help="messages a second through the window")
    p.add_argument("--seconds", type=float, default=30.0, help="the window's publishing time")
    p.add_argument("--commit-interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="spark,no-spark")
    p.add_argument("--py-spy", action="store_true", help="sample the driver's Python with py-spy")
    p.add_argument("--idle", type=float, default=10.0,
                   help="then seconds with nothing published: what the job costs a second idle")
    p.add_argument("--results", default="spark_follower_profile")
    args = p.parse_args()
    variants = args.variants.split(",")
    rows: list[dict] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cg-profile-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        n = 0
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else list(reversed(variants)):
                n += 1
                row = one_run(srv.url, zip_path, Path(d), v, n, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for v in variants:
        ok = [r for r in rows if r["variant"] == v and r.get("all_landed")]
        if not ok:
            continue
        summary[v] = {"total_us_per_msg": round(statistics.median(r["total_us_per_msg"] for r in ok), 1),
                      "cpu_us_per_msg": {k: round(statistics.median(r["cpu_us_per_msg"][k] for r in ok), 1)
                                         for k in KINDS},
                      "caught_up_s": round(statistics.median(r["caught_up_s"] for r in ok), 2)}
    base = summary.get("no-spark", {}).get("total_us_per_msg")
    print(f"\n{'variant':<10}{'total µs/msg':>14}{'x no-spark':>12}" + "".join(f"{k:>16}" for k in KINDS))
    for v, s in summary.items():
        ratio = f"{s['total_us_per_msg'] / base:.2f}x" if base else "-"
        print(f"{v:<10}{s['total_us_per_msg']:>14}{ratio:>12}" + "".join(f"{s['cpu_us_per_msg'][k]:>16}"
                                                                         for k in KINDS))
    for r in rows:
        if r.get("jvm_threads_us_per_msg"):
            print(f"\n{r['variant']}: the JVM's threads, µs of CPU per message: {r['jvm_threads_us_per_msg']}")
        if r.get("idle_cpu_per_s"):
            print(f"{r['variant']}: idle, CPU seconds per second: {r['idle_cpu_per_s']} "
                  f"(JVM threads: {r.get('idle_jvm_threads_per_s')})")
        if r.get("driver_profile"):
            print(f"\n{r['variant']}: the driver's Python, inclusive share of on-CPU samples")
            for name, share in r["driver_profile"]:
                print(f"  {share:6.1%}  {name}")
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load]},
           "rate": args.rate, "seconds": args.seconds, "commit_interval": args.commit_interval,
           "runs": rows, "median": summary}
    (RESULTS / f"{args.results}.json").write_text(json.dumps(out, indent=1) + "\n")
    if summary:
        plot(summary, RESULTS / f"{args.results}.png")


if __name__ == "__main__":
    main()
