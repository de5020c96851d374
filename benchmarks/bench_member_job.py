"""Benchmark: the member job in the layouts users run, against the naive nats-py loop, in one run.

For each message count (default 1,000,000 and 10,000,000) it starts a fresh embedded
nats-server and publishes N messages of 200 bytes over 2,000 keys into an origin stream that
several elastic groups source (each its own work-queue stream), then times, one after another:

  naive     a plain pull consumer on a 1-partition group: ``fetch(1000)`` then
            ``await msg.ack()`` per message (nothing written anywhere);
  job-1p    the member job holding 1 partition (direct gets + one purge per partition a batch);
  job-2p    the member job holding 2 partitions;
  job-6p    the member job holding 6 partitions;
  job-2of6  the member job holding 2 of its group's 6 partitions (3 members): it reads them by
            filtered direct gets, one purge per partition (a third of N is its share);
  pull-1p   the member job reading through its consumer (``--read consumer``: pulls and a double
            ack per message, the path of earlier versions), 1 partition;

each member job under real ``spark-submit --master local[2]`` into the Parquet lake sink, timed
by its own ``duration_s`` (NATS connect to last commit; JVM start-up excluded), with the peak
RSS of its Python driver sampled from /proc. Static groups (origin streams with the partition
token at ingest, direct gets on; the job reads the origin and moves the member's durable after
each batch) are measured on ``--static-messages`` with 1 and 6 partitions held of 1 and 6, and 2
held of 6 (3 members). The large count runs only naive-free ``job-1p`` and ``job-6p`` (driver
memory against N). It prints a table, writes ``benchmarks/results/member_job.json`` and a plot
``benchmarks/results/member_job.png``. Rates are only comparable within one run: use the ratios.

    make bench        # or: .venv/bin/python benchmarks/bench_member_job.py [--messages 1000000,10000000]
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

import pyarrow.parquet as pq

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing.contract import SUMMARY_PREFIX  # noqa: E402
from airflow_provider_cg.core.landing.sinks.lake.reader import committed_files
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer

STREAM = "BENCH"
KEYS = 2000
SIZE = 200
RESULTS = Path(__file__).parent / "results"
ELASTIC = {"naive": 1, "job-1p": 1, "job-2p": 2, "job-6p": 6, "job-2of6": 6, "pull-1p": 1}
MEMBERS = {"job-2of6": ("m1", "m2", "m3"), "static-2of6": ("m1", "m2", "m3")}  # the measured member is m1
STATIC = {"static-1p": 1, "static-6p": 6, "static-2of6": 6}


async def _wait_messages(api: JsApi, stream: str, n: int) -> None:
    while int((await api.stream_info(stream))["state"]["messages"]) < n:  # noqa: ASYNC110 - server state
        await asyncio.sleep(0.5)


async def prepare(url: str, n: int, groups: dict[str, int], static: dict[str, int], static_n: int) -> float:
    """Origin stream + one elastic group per variant (member m1 holds every partition), and a
    static origin per static variant; returns the publish rate."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    api, cg = JsApi(nc), ConsumerGroups(nc)
    await api.add_stream({"name": STREAM, "subjects": ["bench.*"], "storage": "file"})
    for g, parts in groups.items():
        await cg.create(STREAM, g, ElasticGroupConfig(parts, (PartitioningFilter("bench.*", (1,)),),
                                                      members=MEMBERS.get(g, ("m1",))))
    payload = os.urandom(SIZE)
    t = time.perf_counter()
    await publish_many(nc, ((f"bench.k{i % KEYS}", payload) for i in range(n)))
    rate = n / (time.perf_counter() - t)
    for g, parts in static.items():
        name = f"S-{g}"
        await api.add_stream({"name": name, "subjects": [f"{g}.*"], "storage": "file", "allow_direct": True,
                              "subject_transform": {
            "src": f"{g}.*", "dest": f"{{{{Partition({parts},1)}}}}.{g}.{{{{Wildcard(1)}}}}"}})
        await cg.create(name, "g", StaticGroupConfig(parts, (f"{g}.*",), members=MEMBERS.get(g, ("m1",))))
        await publish_many(nc, ((f"{g}.k{i % KEYS}", payload) for i in range(static_n)))
    for g in groups:  # the sourcing into every work-queue stream
        await _wait_messages(api, f"{STREAM}-{g}", n)
    await nc.close()
    return rate


async def naive(url: str, n: int) -> float:
    """fetch(1000) + ack() per message, nats-py's documented pull loop."""
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await NatsConnectionSettings(servers=[url]).connect()
    js = nc.jetstream()
    await js.add_consumer(f"{STREAM}-naive", ConsumerConfig(durable_name="naive", ack_policy=AckPolicy.EXPLICIT,
                                                            max_ack_pending=-1, filter_subject="0.bench.*"))
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


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(server_pid: int, limit: float = 60.0) -> None:
    """Wait until nats-server is idle (under 5% of a core for a second): a work-queue stream
    that just lost a million messages keeps the server busy removing them for a while, which
    would be charged to whichever variant runs next."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = _cpu_seconds(server_pid)
        time.sleep(1.0)
        if _cpu_seconds(server_pid) - before < 0.05:
            return


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


def parquet_rows(lake: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in committed_files(lake))


def job(url: str, workdir: Path, zip_path: Path, stream: str, group: str, batch_size: int, extra: list[str],
        sink: tuple[list[str], object] | None = None, master: str = "local[2]") -> dict:
    """One member job under spark-submit; ``sink`` is ``(its arguments, a function counting the
    landed rows)``, by default the Parquet lake in ``workdir``."""
    env = dict(os.environ, CG_NATS_SERVERS=url, PYSPARK_PYTHON=sys.executable,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if sink is None:
        lake = workdir / f"lake-{stream}-{group}"
        sink = (["--sink", "parquet", "--sink-path", str(lake)], lambda: parquet_rows(lake))
    sink_args, count_rows = sink
    cmd = ["spark-submit", "--master", master, "--driver-memory", "2g", "--py-files", str(zip_path),
           str(member_job_path()), "--stream", stream, "--group", group, "--member", "m1",
           *sink_args, "--batch-size", str(batch_size), *extra]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    mem: dict = {}
    sampler = threading.Thread(target=_driver_peak_rss, args=(proc, mem), daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    lines = [ln for ln in out.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"member job {stream}/{group} failed (exit {proc.returncode})")
    summary = json.loads(lines[-1][len(SUMMARY_PREFIX):])
    summary.update(mem, wall_s=round(time.perf_counter() - started, 1), rows=count_rows())
    return summary


def run_count(n: int, large: bool, static_n: int, batch_size: int, zip_path: Path,
              only: set[str] | None = None) -> list[dict]:
    groups = {g: p for g, p in ELASTIC.items() if (not large or g in ("job-1p", "job-6p")) and (not only or g in only)}
    static = {g: p for g, p in STATIC.items() if not large and (not only or g in only)}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        publish_rate = asyncio.run(prepare(srv.url, n, groups, static, static_n))
        print(f"{n:,} messages published at {publish_rate:,.0f} msg/s", flush=True)
        variants = [(g, STREAM, g, n, ["--read", "consumer"] if g.startswith("pull") else []) for g in groups
                    if g != "naive"]
        variants += [(g, f"S-{g}", "g", static_n, []) for g in static]
        settle(srv.pid)
        if "naive" in groups:
            rate = asyncio.run(naive(srv.url, n))
            rows.append({"variant": "naive", "messages": n, "partitions": 1, "msg_s": round(rate)})
            print(f"  naive: {rate:,.0f} msg/s", flush=True)
        for name, stream, group, count, extra in variants:
            settle(srv.pid)
            s = job(srv.url, Path(d), zip_path, stream, group, batch_size, extra)
            if name in MEMBERS:  # m1's share of the stream
                count = s["messages_read"] if s["messages_read"] == s["rows"] and 0 < s["messages_read"] < n else -1
            if s["messages_read"] != count or s["rows"] != count:
                raise SystemExit(f"{name}: landed {s['rows']} rows / consumed {s['messages_read']}, expected {count}")
            rate = count / s["duration_s"]
            held = 2 if name.endswith("2of6") else groups.get(name) or static.get(name)
            rows.append({"variant": name, "messages": count, "partitions": held,
                         "msg_s": round(rate), "duration_s": s["duration_s"], "peak_rss_mb": s.get("peak_rss_mb")})
            print(f"  {name}: {rate:,.0f} msg/s, driver peak RSS {s.get('peak_rss_mb')} MB", flush=True)
    by = {r["variant"]: r["msg_s"] for r in rows}
    for r in rows:
        if "naive" in by:
            r["x_naive"] = round(r["msg_s"] / by["naive"], 2)
        if "job-1p" in by and r["variant"].startswith(("job", "static")):
            r["x_1p"] = round(r["msg_s"] / by["job-1p"], 2)
    return rows


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = min(r["messages"] for r in results if r["variant"] == "job-1p")
    seen: set[str] = set()
    first = [r for r in results if r["variant"] not in seen and not seen.add(r["variant"])]  # the first count's
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2.2, 1]})
    names = [r["variant"] for r in first]
    colors = ["#999999" if n == "naive" else "#c77" if n.startswith(("pull", "static")) else "#3a7" for n in names]
    bars = a.bar(names, [r["msg_s"] / 1000 for r in first], color=colors)
    for bar, r in zip(bars, first, strict=True):
        label = f"{r['msg_s'] / 1000:.0f}k" + (f"\n{r['x_naive']}x naive" if "x_naive" in r else "")
        a.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    a.set_ylabel("thousand messages / s")
    a.set_ylim(top=max(r["msg_s"] for r in first) / 1000 * 1.2)
    a.set_title(f"member job into the Parquet lake, {small:,} x {SIZE} B (2of6, static: their own count)", fontsize=10)
    for variant, marker in (("job-1p", "o"), ("job-6p", "s")):
        pts = sorted((r["messages"], r["peak_rss_mb"]) for r in results if r["variant"] == variant)
        if pts:
            b.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker=marker, label=variant)
    b.set_xlabel("messages (millions)")
    b.set_ylabel("driver peak RSS (MB)")
    b.set_ylim(bottom=0)
    b.set_title("driver memory against N")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", default="1000000,10000000", help="the first runs every variant, the others "
                                                                 "job-1p and job-6p only")
    p.add_argument("--static-messages", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=100_000)
    p.add_argument("--variants", default="", help="comma-separated subset (default: all; job-1p is the reference)")
    args = p.parse_args()
    only = {v for v in args.variants.split(",") if v} or None
    counts = [int(n) for n in args.messages.split(",")]
    RESULTS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cg-bench-zip-") as d:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        results = [r for i, n in enumerate(counts)
                   for r in run_count(n, i > 0, args.static_messages, args.batch_size, zip_path, only)]
    cols = ["variant", "messages", "partitions", "msg_s", "x_naive", "x_1p", "duration_s", "peak_rss_mb"]
    print("\n" + " ".join(f"{c:>12}" for c in cols))
    for r in results:
        print(" ".join(f"{r.get(c, '')!s:>12}" for c in cols))
    if only:  # a partial run does not replace the matrix's results
        return
    (RESULTS / "member_job.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, RESULTS / "member_job.png")
    print(f"\nwrote {RESULTS / 'member_job.json'} and {RESULTS / 'member_job.png'}")


if __name__ == "__main__":
    main()
