"""Benchmark: one group as it grows, in both layouts (``core/groups/layouts/``), one run.

Every case gets a fresh embedded nats-server and an origin of ``--messages`` messages of 200
bytes over 20,000 keys (filled before the group exists); member jobs are the plain Python
driver (``--no-spark``, raw payloads, the Parquet lake), all of a case's jobs at once.

  cpu        6 partitions held by 1, 3 and 6 members, in each layout. Measured after the group
             has sourced (and, for partition streams, mirrored) everything: the server's CPU
             seconds (``/proc/<pid>/stat``) and the jobs' (``RUSAGE_CHILDREN``) per landed
             message, and the landed rate; the sourcing phase's server CPU per message apart.
             Ratios are to one member holding all 6 partitions in the same layout, and to the
             work-queue layout's one member (the issue's baseline).
  read       one member reading its single partition of a group of 6, 64 and 256 partitions
             (``--read-messages`` in the stream), by the job's own reader (direct gets, purge
             per batch): msg/s and server CPU per message; ratios to 6 partitions. Then every
             other partition drained by its own reader, all read before any acknowledges (as
             members running at once): the server's CPU per landed message of the whole group,
             sourcing and mirroring included.
  2of6       the member job holding 2 of 6 partitions (3 members) against the job holding the
             one partition of a 1-partition group (the single-member rate) with as many messages
             as the 2-of-6 member's share; each the median of 3 runs (3 groups on one origin).
  startup    the CPU of a member run that finds nothing to land (what each run pays first).
  large      1 and 6 members of the partition-streams layout at ``--large-messages``: the
             runs' fixed costs spread over more messages; and the 6 members' jobs one after
             another (what their CPU is without 7 processes sharing 2 cores).
  model      the landed rate a machine with more cores would reach, from the cpu figures (see
             ``model``), written next to them.

Prints tables, writes ``benchmarks/results/group_scale.json`` and ``group_scale.png`` (or
``<--results>.json``). This machine is shared and noisy: read the ratios within one run.
``CG_TREE``: the checkout whose provider is measured (default: this one), so that
``compare_group_scale.py`` runs the same cases on two trees.

    .venv/bin/python benchmarks/bench_group_scale.py [--messages 300000] [--read-messages 200000]
        [--layouts work-queue,partition-streams] [--parts cpu,startup,large,read,2of6] [--results NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, os.environ.get("CG_TREE") or str(Path(__file__).parent.parent))
import pyarrow.parquet as pq  # noqa: E402
from bench_member_job import settle  # noqa: E402  (idle server between cases)

from airflow_provider_cg.core.groups import layouts  # noqa: E402
from airflow_provider_cg.core.groups.admin import ConsumerGroups  # noqa: E402
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, MemberMapping, PartitioningFilter  # noqa: E402
from airflow_provider_cg.core.groups.layouts import partition_streams as grouplayout  # noqa: E402
from airflow_provider_cg.core.jetstream.api import JsApi  # noqa: E402
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings  # noqa: E402
from airflow_provider_cg.core.jetstream.direct_gets import PartitionReader  # noqa: E402
from airflow_provider_cg.core.jetstream.publish import publish_many  # noqa: E402
from airflow_provider_cg.core.landing.contract import SUMMARY_PREFIX  # noqa: E402
from airflow_provider_cg.core.landing.reads.direct import PartitionPositions, PartitionStreamPositions  # noqa: E402
from airflow_provider_cg.core.landing.sinks.lake.reader import committed_files  # noqa: E402
from airflow_provider_cg.core.tools.packaging import member_job_path  # noqa: E402
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer  # noqa: E402

STREAM, GROUP, KEYS, SIZE = "SCALE", "g", 20_000, 200
LAYOUTS = (grouplayout.WORK_QUEUE, grouplayout.PARTITION_STREAMS)
RESULTS = Path(__file__).parent / "results"


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def fill(url: str, n: int) -> None:
    nc = await NatsConnectionSettings(servers=[url]).connect()
    await JsApi(nc).add_stream({"name": STREAM, "subjects": ["scale.*"], "storage": "file"})
    payload = os.urandom(SIZE)
    await publish_many(nc, ((f"scale.k{i % KEYS}", payload) for i in range(n)))
    await nc.close()


async def make_group(url: str, partitions: int, members=None, mappings=None, layout=grouplayout.WORK_QUEUE,
                     n: int = 0, group: str = GROUP) -> None:
    """The group, then wait until its partitions hold all ``n`` messages."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    cg, api = ConsumerGroups(nc), JsApi(nc)
    await cg.create(STREAM, group, ElasticGroupConfig(partitions, (PartitioningFilter("scale.*", (1,)),),
                                                      members=members or (), member_mappings=mappings or ()),
                    layout=layout)
    wq = f"{STREAM}-{group}"
    while True:  # polled lightly: the polls' own cost is charged to the sourcing (and mirroring)
        if layouts.named(layout).reads_partition_streams:
            held = sum((await grouplayout.partition_streams_left(api, wq, partitions)).values())
        else:
            held = int((await api.stream_info(wq))["state"]["messages"])
        if held >= n:
            break
        await asyncio.sleep(1.0)
    await nc.close()


def start_job(url: str, workdir: Path, member: str, batch_size: int, group: str = GROUP) -> subprocess.Popen:
    env = dict(os.environ, CG_NATS_SERVERS=url)
    if os.environ.get("CG_TREE"):  # the jobs run that tree's provider too
        env["PYTHONPATH"] = os.environ["CG_TREE"]
    cmd = [sys.executable, str(member_job_path()), "--no-spark", "--stream", STREAM, "--group", group,
           "--member", member, "--sink", "parquet", "--sink-path", str(workdir / f"lake-{group}"),
           "--batch-size", str(batch_size), "--idle-timeout", "1"]
    return subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def summary_of(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"member job failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(SUMMARY_PREFIX):])


def landed_rows(workdir: Path, group: str = GROUP) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in committed_files(workdir / f"lake-{group}"))


def cpu_case(layout: str, members: int, n: int, batch_size: int, one_by_one: bool = False) -> dict:
    """``one_by_one``: the members' jobs one after another instead of at once (what the jobs'
    CPU is without several processes sharing this machine's cores)."""
    names = [f"m{i + 1}" for i in range(members)]
    with tempfile.TemporaryDirectory(prefix="cg-scale-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        work = Path(d)
        asyncio.run(fill(srv.url, n))
        settle(srv.pid)
        c0 = server_cpu(srv.pid)
        asyncio.run(make_group(srv.url, 6, members=tuple(names), layout=layout, n=n))
        settle(srv.pid)
        sourcing = server_cpu(srv.pid) - c0
        s0, j0, t0 = server_cpu(srv.pid), children_cpu(), time.perf_counter()
        if one_by_one:
            summaries = [summary_of(start_job(srv.url, work, m, batch_size)) for m in names]
        else:
            procs = [start_job(srv.url, work, m, batch_size) for m in names]
            summaries = [summary_of(p) for p in procs]
        wall = time.perf_counter() - t0
        server, jobs = server_cpu(srv.pid) - s0, children_cpu() - j0
        rows = landed_rows(work)
    if rows != n or sum(s["messages_read"] for s in summaries) != n:
        raise SystemExit(f"cpu {layout} {members}: landed {rows} of {n}")
    return {"layout": layout, "members": members, "one_by_one": one_by_one, "messages": n, "wall_s": round(wall, 2),
            "landed_msg_s": round(n / wall), "server_us": round(server / n * 1e6, 2),
            "sourcing_us": round(sourcing / n * 1e6, 2), "jobs_us": round(jobs / n * 1e6, 2)}


def partition_reader(nc, layout: str, partitions: int, p: int):
    """``(reader, positions)`` of a member holding partition ``p`` alone, as its job reads it."""
    wq = f"{STREAM}-{GROUP}"
    if layout == grouplayout.WORK_QUEUE:
        reader = PartitionReader(nc, wq)
        return reader, PartitionPositions(reader, [p], partitions, [f"{p}.scale.*"])
    readers = layouts.named(layout).partition_readers(nc, wq, (p,), "$JS.API")
    return readers, PartitionStreamPositions(readers, [p])


async def read_partition(url: str, layout: str, partitions: int, p: int = 0) -> tuple[int, float]:
    """Read and purge partition ``p`` to its end as the member job does; ``(messages, seconds)``."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    reader, positions = partition_reader(nc, layout, partitions, p)
    for r in getattr(reader, "readers", {p: reader}).values():
        await r.start()  # its reply subscription: once per job run, not per read
    got, t = 0, time.perf_counter()
    while True:
        batches, cut = await positions.read(10_000)
        if not batches:
            break
        got += sum(len(b) for b in batches)
        await positions.ack(batches, cut)
    seconds = time.perf_counter() - t
    await reader.close()
    await nc.close()
    return got, seconds


async def read_rest(url: str, layout: str, partitions: int) -> int:
    """Every other partition drained by its own reader, as members running at once would: each
    reads its whole partition before any of them acknowledges (so each read finds the others'
    messages still stored), then each purges what it read."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    readers, held = [], []
    for p in range(1, partitions):
        reader, positions = partition_reader(nc, layout, partitions, p)
        readers.append(reader)
        while True:
            batches, cut = await positions.read(10_000)
            if not batches:
                break
            held.append((positions, batches, cut))
    for positions, batches, cut in held:
        await positions.ack(batches, cut)
    for reader in readers:
        await reader.close()
    await nc.close()
    return sum(len(b) for _, batches, _ in held for b in batches)


def read_case(layout: str, partitions: int, n: int) -> dict:
    """Partition 0's reader: its rate and the server's CPU per message it read; then the whole
    group drained (every partition by its own reader): the server's CPU per landed message,
    sourcing (and mirroring) included."""
    mappings = (MemberMapping("m1", (0,)), MemberMapping("m2", tuple(range(1, partitions))))
    with tempfile.TemporaryDirectory(prefix="cg-scale-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        asyncio.run(fill(srv.url, n))
        settle(srv.pid)
        c0 = server_cpu(srv.pid)
        asyncio.run(make_group(srv.url, partitions, mappings=mappings, layout=layout, n=n))
        settle(srv.pid)
        c1 = server_cpu(srv.pid)
        got, seconds = asyncio.run(read_partition(srv.url, layout, partitions))
        c2 = server_cpu(srv.pid)
        rest = asyncio.run(read_rest(srv.url, layout, partitions))
        c3 = server_cpu(srv.pid)
    if got + rest != n:
        raise SystemExit(f"read {layout} {partitions}: drained {got + rest} of {n}")
    return {"layout": layout, "partitions": partitions, "messages": got, "msg_s": round(got / seconds),
            "server_us": round((c2 - c1) / max(got, 1) * 1e6, 2),
            "group_server_us": round((c3 - c0) / n * 1e6, 2)}


def job_case(layout: str, partitions: int, members: int, n: int, batch_size: int, repeats: int = 3) -> dict:
    """Member m1's job (of ``members`` over ``partitions``), on ``repeats`` groups of the same
    origin: the median of its rates."""
    names = [f"m{i + 1}" for i in range(members)]
    rates, read = [], 0
    with tempfile.TemporaryDirectory(prefix="cg-scale-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        asyncio.run(fill(srv.url, n))
        for i in range(repeats):
            asyncio.run(make_group(srv.url, partitions, members=tuple(names), layout=layout, n=n, group=f"g{i}"))
        for i in range(repeats):
            settle(srv.pid)
            s = summary_of(start_job(srv.url, Path(d), "m1", batch_size, group=f"g{i}"))
            rates.append(s["messages_read"] / s["duration_s"])
            read = s["messages_read"]
    return {"layout": layout, "partitions": partitions, "held": partitions // members, "messages": read,
            "msg_s": round(sorted(rates)[len(rates) // 2]), "runs": [round(r) for r in rates]}


def startup_case(runs: int = 3) -> dict:
    """CPU of a member run that finds nothing to land (the plain driver): what every run pays
    before its first message (interpreter, imports, connect, group lookup)."""
    with tempfile.TemporaryDirectory(prefix="cg-scale-") as d, EmbeddedNatsServer(Path(d) / "nats") as srv:
        asyncio.run(fill(srv.url, 0))
        asyncio.run(make_group(srv.url, 6, members=("m1",)))
        cpus = []
        for _ in range(runs):
            j0 = children_cpu()
            summary_of(start_job(srv.url, Path(d), "m1", 1000))
            cpus.append(children_cpu() - j0)
    return {"runs": runs, "cpu_s": round(sorted(cpus)[len(cpus) // 2], 3)}


def model(cpu_rows: list[dict], cores: tuple[int, ...] = (2, 4, 8, 16, 32)) -> list[dict]:
    """Landed msg/s on ``c`` cores if every core were busy with this work: c / (server + jobs
    CPU per message). The work-queue layout has a ceiling of its own: every member's reads,
    purges and the sourcing go through one stream, which one server serves (the issue's 16-core
    machine landed at most ~200k msg/s for one group however many members); partition streams
    spread that over one stream per partition, which a cluster places on different servers.
    A model, not a measurement: it ignores memory bandwidth, the network and the sinks."""
    out = []
    for r in cpu_rows:
        per = (r["server_us"] + r["sourcing_us"] + r["jobs_us"]) / 1e6
        out.append({"layout": r["layout"], "members": r["members"],
                    **{f"{c}_cores": round(min(c, r["members"] + 1) / per) for c in cores}})
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for layout in sorted({r["layout"] for r in result["cpu"]}):
        rows = [r for r in result["cpu"] if r["layout"] == layout]
        a.plot([r["members"] for r in rows], [r["server_us"] + r["sourcing_us"] for r in rows], "o-",
               label=f"{layout}: server")
        a.plot([r["members"] for r in rows], [r["jobs_us"] for r in rows], "s--", label=f"{layout}: jobs")
        rows = [r for r in result["read"] if r["layout"] == layout]
        b.plot([r["partitions"] for r in rows], [r["msg_s"] for r in rows], "o-", label=layout)
    a.set(xlabel="members (6 partitions)", ylabel="CPU µs per landed message", title="CPU per landed message")
    b.set(xlabel="partitions in the group", ylabel="msg/s", xscale="log", title="one member reading its partition")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict], cols: list[str]) -> str:
    lines = [" | ".join(cols)]
    lines += [" | ".join(str(r.get(c, "")) for c in cols) for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--read-messages", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=20_000)
    p.add_argument("--large-messages", type=int, default=1_000_000)
    p.add_argument("--parts", default="cpu,startup,large,read,2of6")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="the layouts of the cpu, read and 2of6 cases")
    p.add_argument("--results", default="group_scale", help="the results' file name in benchmarks/results/")
    args = p.parse_args()
    chosen = tuple(layouts.check("layouts", x) for x in args.layouts.split(","))
    parts = set(args.parts.split(","))
    result: dict = {"messages": args.messages, "read_messages": args.read_messages, "cpu": [], "read": [],
                    "2of6": []}
    if "cpu" in parts:
        for layout in chosen:
            for members in (1, 3, 6):
                r = cpu_case(layout, members, args.messages, args.batch_size)
                result["cpu"].append(r)
                print(r, flush=True)
        base = {r["layout"]: r for r in result["cpu"] if r["members"] == 1}
        for r in result["cpu"]:
            b = base[r["layout"]]
            r["server_x"] = round((r["server_us"] + r["sourcing_us"]) / (b["server_us"] + b["sourcing_us"]), 2)
            r["jobs_x"] = round(r["jobs_us"] / b["jobs_us"], 2)
            wq = base.get(grouplayout.WORK_QUEUE, b)
            r["server_x_wq1"] = round((r["server_us"] + r["sourcing_us"]) / (wq["server_us"] + wq["sourcing_us"]), 2)
        result["model"] = model(result["cpu"])
    if "startup" in parts:
        result["startup"] = startup_case()
        print(result["startup"], flush=True)
    if "large" in parts:  # the same group at --large-messages: each run's fixed cost amortised
        result["large"] = [cpu_case(grouplayout.PARTITION_STREAMS, m, args.large_messages, args.batch_size)
                           for m in (1, 6)]
        result["large"].append(cpu_case(grouplayout.PARTITION_STREAMS, 6, args.large_messages, args.batch_size,
                                        one_by_one=True))
        one = result["large"][0]
        for r in result["large"]:
            r["jobs_x"] = round(r["jobs_us"] / one["jobs_us"], 2)
            r["server_x"] = round((r["server_us"] + r["sourcing_us"]) / (one["server_us"] + one["sourcing_us"]), 2)
        print(result["large"], flush=True)
    if "read" in parts:
        for layout in chosen:
            for partitions in (6, 64, 256):
                r = read_case(layout, partitions, args.read_messages)
                result["read"].append(r)
                print(r, flush=True)
        for r in result["read"]:
            six = next(x for x in result["read"] if x["layout"] == r["layout"] and x["partitions"] == 6)
            r["x_6"] = round(r["msg_s"] / six["msg_s"], 2)
    if "2of6" in parts:  # the single member lands as many messages as the 2-of-6 member's share
        one = job_case(grouplayout.WORK_QUEUE, 1, 1, args.messages // 3, args.batch_size)
        result["2of6"].append(one)
        for layout in chosen:
            r = job_case(layout, 6, 3, args.messages, args.batch_size)
            r["x_1p"] = round(r["msg_s"] / one["msg_s"], 2)
            result["2of6"].append(r)
        print(result["2of6"], flush=True)
    print()
    if result["cpu"]:
        print(table(result["cpu"], ["layout", "members", "landed_msg_s", "sourcing_us", "server_us", "jobs_us",
                                    "server_x", "jobs_x", "server_x_wq1"]))
        print()
        print(table(result["model"], list(result["model"][0])))
        print()
    if result["read"]:
        print(table(result["read"], ["layout", "partitions", "messages", "msg_s", "server_us", "x_6",
                                     "group_server_us"]))
        print()
    if result["2of6"]:
        print(table(result["2of6"], ["layout", "partitions", "held", "messages", "msg_s", "x_1p"]))
    if result.get("startup"):
        print(f"\na member run with nothing to land: {result['startup']['cpu_s']} s of CPU")
    if result.get("large"):
        print()
        print(table(result["large"], ["layout", "members", "one_by_one", "messages", "landed_msg_s", "sourcing_us",
                                      "server_us", "jobs_us", "server_x", "jobs_x"]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results}.json").write_text(json.dumps(result, indent=2))
    if result["cpu"] and result["read"]:
        plot(result, RESULTS / f"{args.results}.png")


if __name__ == "__main__":
    main()
