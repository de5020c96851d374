"""Benchmark: how fresh the lake is, and the highest rate a group lands sustainably. Publish at
a steady rate while the members land, and measure per message the time from its publish to the
commit of its batch.

In one run, on a fresh embedded nats-server:

  sourcing   the reference: the server's own sourcing of an origin into a group's work queue
             (origin filled first with ``--reference-messages``, then the group created; the
             rate at which the work queue fills), measured alone;
  cases      for each member count (``--members``, default 1, 3 and 6 over ``--partitions`` 6)
             and schedule (``--schedules``: ``back-to-back``, each member's next job starts when
             its last one ends; ``every``, a job per member every ``--interval`` seconds, as a
             DAG would; ``follow``, each job a follower, ``--follow``: it keeps its pin and
             lands what arrives for the case's publishing time + 4 s (+ 40 s with ``--spark``:
             one start per member), or ``--follow-seconds`` (shorter: hand-overs within the
             case), cutting batches every ``--commit-interval`` (several, e.g. 1,2,4: one
             follow schedule each, in the same run); its successor starts 5 s (15 s
             with ``--spark``) before its time is up and waits for the pin, as the next run of a
             DAG following ``until-next-run`` does; followers start warm, publishing begins once
             every member's job waits for messages and, through spark-submit, has warmed Spark
             up), publish rates
             that are fractions of the sourcing rate (``--fractions``) for ``--seconds`` each.

Publishing is ``--publishers`` processes (4), so one Python publisher is not the ceiling; the
rate *achieved* (the origin's count over the publishing time) is what counts. The jobs are the
member job's plain Python driver (``--no-spark``, raw payloads; ``--spark`` runs spark-submit
instead) into the Parquet lake, in the group's ``--layout``. Per message: freshness = commit time
of its batch (the lake's commit log) - its publish time (the origin's timestamp), as p50 / p99 /
max; landed msg/s; and whether the rate was *sustained*: the backlog (published - landed,
sampled each second) did not grow while publishing (its mean over the last third of the
publishing time exceeds its mean over the middle third by at most 5 % of the publish rate per
second), once publishing stopped what was left landed within one ``--interval`` + 10 s, and p99
freshness was at most ``--interval`` + 30 s. The jobs' CPU (user + system, each job's own, from
``wait4``) per landed message, and its ratio to one member's in the same schedule; for
followers also without their start-up (``cpu_us_per_msg_landing``: CPU spent before publishing
began left out) and the hand-overs: seconds from a run's last commit to its successor's first
(``handover_p50_s`` / ``handover_max_s``). Per member
count: the highest rate sustained, as a fraction of the server's sourcing. Prints a table, writes ``benchmarks/results/freshness.json``
and ``freshness.png``. Rates are comparable within a run.

    .venv/bin/python benchmarks/bench_freshness.py [--seconds 20] [--members 1,3,6] [--publishers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.groups.layouts import partition_streams as grouplayout
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import CommitLog
from airflow_provider_cg.core.landing.sinks.lake.storage import LocalStorage
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer

KEYS = 2000
SIZE = 200
RESULTS = Path(__file__).parent / "results"


async def sourcing_rate(url: str, n: int) -> float:
    """The server's sourcing alone: fill an origin, then create a group and time its work queue."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    api = JsApi(nc)
    await api.add_stream({"name": "REF", "subjects": ["ref.*"], "storage": "file"})
    payload = os.urandom(SIZE)
    await publish_many(nc, ((f"ref.k{i % KEYS}", payload) for i in range(n)))
    t = time.perf_counter()
    await ConsumerGroups(nc).create("REF", "g", ElasticGroupConfig(6, (PartitioningFilter("ref.*", (1,)),),
                                                                    members=("m1",)))
    while int((await api.stream_info("REF-g"))["state"]["messages"]) < n:  # noqa: ASYNC110 - server state
        await asyncio.sleep(0.02)
    rate = n / (time.perf_counter() - t)
    await api.delete_stream("REF-g")
    await api.delete_stream("REF")
    await nc.close()
    return rate


class Publisher:
    """``processes`` publisher processes (``--publish-child``), each at ``rate / processes``
    msg/s in 20 ms ticks for ``seconds``, so one Python process is never the ceiling. The
    origin's message count is what was published; the backlog (published - landed) is sampled
    each second."""

    def __init__(self, url: str, stream: str, rate: float, seconds: float, processes: int) -> None:
        self.url, self.stream, self.rate, self.seconds, self.processes = url, stream, rate, seconds, processes
        self.published = 0
        self.elapsed = 0.0  # how long publishing took (a publisher behind schedule runs over)
        self.samples: list[tuple[float, int]] = []  # (t, published - landed): the backlog

    async def run(self, landed) -> None:
        nc = await NatsConnectionSettings(servers=[self.url]).connect()
        api = JsApi(nc)
        share = self.rate / self.processes
        children = [subprocess.Popen([sys.executable, __file__, "--publish-child", self.url, self.stream,  # noqa: ASYNC220 - started once per case
                                      str(share), str(self.seconds), str(i)], stdout=subprocess.DEVNULL)
                    for i in range(self.processes)]
        start = time.perf_counter()
        next_sample = 1.0
        try:
            while any(c.poll() is None for c in children):
                now = time.perf_counter() - start
                if now >= next_sample:
                    published = int((await api.stream_info(self.stream))["state"]["messages"])
                    self.samples.append((now, published - await landed()))
                    next_sample += 1.0
                await asyncio.sleep(0.05)
            if any(c.returncode for c in children):
                raise SystemExit("a publisher process failed")
        finally:
            for c in children:
                if c.poll() is None:
                    c.kill()
            self.elapsed = time.perf_counter() - start
            self.published = int((await api.stream_info(self.stream))["state"]["messages"])
            await nc.close()


async def publish_child(url: str, stream: str, rate: float, seconds: float, index: int) -> None:
    """One publisher process: its share of the rate, keys of its own residue class."""
    nc = await NatsConnectionSettings(servers=[url]).connect()
    payload = os.urandom(SIZE)
    start, published = time.perf_counter(), 0
    while (now := time.perf_counter() - start) < seconds:
        due = min(int(rate * now) - published, max(1, int(rate / 4)))
        if due > 0:
            base = published
            await publish_many(nc, ((f"{stream.lower()}.k{(index + (base + i) * 7) % KEYS}", payload)
                                    for i in range(due)))
            published += due
        await asyncio.sleep(0.02)
    await nc.close()


class Lander:
    """Starts member jobs per schedule until stopped. Followers hand over as a DAG scheduled
    every follow period does with ``follow="until-next-run"``: a member's next job starts
    ``HANDOVER_LEAD`` seconds before its follower's time is up and waits for the pin as its
    standby, so the hand-over is a pin passed between two running jobs."""

    # a successor's start-up is over before the pin comes: a driver's, or a JVM's, its session's
    # and Spark's first job (the follower's warm-up: up to 10 s here beside the publishers)
    HANDOVER_LEAD = 5.0
    HANDOVER_LEAD_SPARK = 15.0
    #: what a job's log says once it is warm (``all_ready``), and whether a waiting job keeps a
    #: pull open on its consumer (the member job's followers do)
    READY_MARKER = b"cg Spark warmed up"
    WAITS_PULLING = True

    def __init__(self, url: str, workdir: Path, stream: str, members: list[str], interval: float | None,
                 spark: bool, zip_path: Path, follow: tuple[float, float] | None = None, extra: tuple[str, ...] = (),
                 job_logs: Path | None = None, sink: str = "parquet", driver_jvm: str = "operator",
                 master: str = "local[2]") -> None:
        self.master = master  # local[2], or a standalone master's URL (--standalone)
        self.job_logs = job_logs or workdir / "logs"  # a log file per job there
        self.driver_jvm = driver_jvm  # "operator": the driver JVM's options the operator gives; "jvm-default": none
        self.sink = sink
        self.url, self.workdir, self.stream, self.members = url, workdir, stream, members
        self.extra = extra  # more job arguments (a transformation)
        self.interval, self.spark, self.zip_path = interval, spark, zip_path
        self.follow = follow  # (seconds, commit interval) of each job, or None
        self.lake = workdir / f"lake-{stream}"  # the Parquet lake, or the Delta table
        self.catalog = f"sqlite:///{workdir}/catalog.db"
        # where the table's protocol log is: the lake, the Delta table, the Iceberg table's location
        self.root = workdir / "warehouse" / "lake.db" / stream.lower() if sink == "iceberg" else self.lake
        self.jobs = 0
        self.cpu_s = 0.0  # the jobs' own CPU, user + system
        self.stop = threading.Event()
        self._running: dict[str, list[tuple[float, subprocess.Popen]]] = {}  # member -> (start, job)

    def _ended(self, proc: subprocess.Popen) -> bool:
        """Whether a job ended (reaped here with its own CPU time, which ``poll`` would lose)."""
        if proc.returncode is not None:
            return True
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == 0:
            return False
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s += usage.ru_utime + usage.ru_stime
        return True

    def cpu_so_far(self) -> float:
        """The jobs' CPU until now: the ended ones' and the running ones' (``/proc``)."""
        ticks = os.sysconf("SC_CLK_TCK")
        running = 0.0
        for jobs in list(self._running.values()):
            for _, proc in list(jobs):
                try:
                    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    running += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
                except (OSError, IndexError, ValueError):
                    pass
        return self.cpu_s + running

    def _jvm_conf(self) -> list[str]:
        """What the operator adds for a local-mode follower's driver JVM (``LOCAL_FOLLOWER_JVM``)."""
        if self.driver_jvm != "operator" or not self.follow or not self.master.startswith("local"):
            return []
        from airflow_provider_cg.hooks.spark_submit import LOCAL_FOLLOWER_JVM

        return [a for k, v in LOCAL_FOLLOWER_JVM.items() for a in ("--conf", f"{k}={v}")]

    def _start(self, member: str) -> subprocess.Popen:
        env = dict(os.environ, CG_NATS_SERVERS=self.url, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
                   PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        launch = (["spark-submit", "--master", self.master, "--conf", "spark.ui.enabled=false",
                   "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
                   "--conf", "spark.sql.shuffle.partitions=2", *self._jvm_conf(), "--py-files", str(self.zip_path),
                   str(member_job_path())]
                  if self.spark else [sys.executable, str(member_job_path()), "--no-spark"])
        self.jobs += 1
        following = ["--follow", str(self.follow[0]), "--commit-interval", str(self.follow[1])] if self.follow else []
        log = self._log(member)
        try:
            return subprocess.Popen([*launch, "--stream", self.stream, "--group", "g", "--member", member,
                                     *self.sink_args(), "--batch-size", "20000",
                                     "--idle-timeout", "0.5", "--standby-timeout", "5", *following, *self.extra],
                                    env=env, cwd=self.workdir, stdout=log, stderr=log)
        finally:
            log.close()

    def sink_args(self) -> list[str]:
        if self.sink == "iceberg":
            return ["--sink", "iceberg", "--iceberg-table", f"lake.{self.stream.lower()}", "--iceberg-catalog-uri",
                    self.catalog, "--iceberg-warehouse", str(self.workdir / "warehouse")]
        return ["--sink", self.sink, "--sink-path", str(self.lake)]

    def summaries(self) -> list[dict]:
        """Every job's summary (its log's ``CG_SUMMARY`` line)."""
        out = []
        for f in self.job_logs.glob(f"{self.stream}-*.log"):
            for line in f.read_text(errors="replace").splitlines():
                if line.startswith("CG_SUMMARY "):
                    out.append(json.loads(line[len("CG_SUMMARY "):]))
        return out

    def _log(self, member: str):
        """A file per job for its output (under spark-submit the driver's Python log is in its
        standard output): kept with ``--workdir``."""
        self.job_logs.mkdir(parents=True, exist_ok=True)
        return open(self.job_logs / f"{self.stream}-{member}-{self.jobs}.log", "wb")  # noqa: SIM115

    def _due(self, member: str, now: float, next_round: float) -> bool:
        jobs = self._running[member] = [(t, p) for t, p in self._running.get(member, []) if not self._ended(p)]
        if self.follow:  # the successor starts as the follower's time nears its end
            lead = self.HANDOVER_LEAD_SPARK if self.spark else self.HANDOVER_LEAD
            return not jobs or (len(jobs) == 1 and now - jobs[0][0] >= self.follow[0] - lead)
        return not jobs and (self.interval is None or now >= next_round)

    def run(self) -> None:
        next_round = 0.0
        start = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic() - start
            for m in self.members:
                if self._due(m, now, next_round):
                    self._running[m].append((now, self._start(m)))
            if self.interval is not None and now >= next_round:
                next_round += self.interval
            time.sleep(0.05)
        deadline = time.monotonic() + 120
        for jobs in self._running.values():
            for _, proc in jobs:
                while not self._ended(proc) and time.monotonic() < deadline:
                    time.sleep(0.05)


async def all_ready(url: str, stream: str, members: list[str], logs: Path | None, timeout: float = 60.0,
                    marker: bytes = Lander.READY_MARKER, pulling: bool = True) -> None:
    """Wait until every member's consumer has a job's pull waiting (for its first message, and
    with it the pin; unless not ``pulling``), and with ``logs`` (spark-submit) until each
    member's job says ``marker`` (the member job: Spark has warmed up, ``SparkPipeline.warm_up``):
    the followers started warm."""

    def warmed(member: str) -> bool:
        return logs is None or any(marker in f.read_bytes() for f in logs.glob(f"{stream}-{member}-*.log"))

    nc = await NatsConnectionSettings(servers=[url]).connect()
    api = JsApi(nc)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [await api.consumer_info(f"{stream}-g", m) for m in members]
            if all(i and (int(i.get("num_waiting") or 0) > 0 or not pulling) for i in infos) \
                    and all(map(warmed, members)):
                return
            await asyncio.sleep(0.1)
        raise SystemExit(f"{stream}: not every member's job was waiting within {timeout:g} s")
    finally:
        await nc.close()


def freshness(root: Path, visible_at=None) -> np.ndarray:
    """Seconds from publish to the moment its row could be read, per landed message: its
    batch's commit (the Parquet lake's commit log), or ``visible_at(position)`` of a table
    (the first time a reader found the table at that log position or past it)."""
    log = CommitLog(LocalStorage(root, create=False))
    log.refresh()
    out = []
    for record in log.records:
        if record["op"] != "commit":
            continue
        committed = dt.datetime.fromisoformat(record["committed_at"]).timestamp() if visible_at is None \
            else visible_at(record["pos"])
        for f in record["files"]:
            path = root / f["path"] if (root / f["path"]).exists() else root / f["staged"]
            col = pq.read_table(path, columns=["timestamp"]).column("timestamp")
            ns = col.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_numpy()  # stored in microseconds
            out.append(committed - ns / 1e9)
    return np.concatenate(out) if out else np.zeros(0)


class TableWatch:
    """A reader of a Delta or Iceberg table polling it every ``every`` seconds for the log
    position its last commit recorded, as delta-rs and pyiceberg read it: when each position
    became readable, and how many table commits there were."""

    def __init__(self, lander: Lander, every: float = 0.05) -> None:
        self.lander, self.every = lander, every
        self.seen: list[tuple[float, int]] = []  # (time, position), positions increasing
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _position(self) -> int:
        if self.lander.sink == "delta":
            from airflow_provider_cg.core.landing.sinks.lake.tables import APP_ID

            if self._dt is None:
                from deltalake import DeltaTable

                self._dt = DeltaTable(str(self.lander.lake))
            else:
                self._dt.update_incremental()
            return self._dt.transaction_version(APP_ID) or 0
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import POSITION_PROPERTY

        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            self._catalog = SqlCatalog("default", uri=self.lander.catalog)
        return int(self._catalog.load_table(f"lake.{self.lander.stream.lower()}").properties.get(POSITION_PROPERTY, 0))

    def _run(self) -> None:
        self._dt = self._catalog = None
        while not self.stop.is_set():
            try:
                pos = self._position()
            except Exception:  # noqa: BLE001 - no table yet
                pos = 0
            if pos and (not self.seen or pos > self.seen[-1][1]):
                self.seen.append((time.time(), pos))
            time.sleep(self.every)

    def visible_at(self, pos: int) -> float:
        for at, p in self.seen:
            if p >= pos:
                return at
        return float("nan")

    def commits(self) -> int:
        """Table commits that recorded a log position (every commit of the sinks does)."""
        if self.lander.sink == "delta":
            from deltalake import DeltaTable

            return sum(1 for h in DeltaTable(str(self.lander.lake)).history() if "cg.position" in h)
        from pyiceberg.catalog.sql import SqlCatalog

        tbl = SqlCatalog("default", uri=self.lander.catalog).load_table(f"lake.{self.lander.stream.lower()}")
        return int(tbl.metadata.last_sequence_number or 0)


def _all_visible(root: Path, watch: TableWatch) -> bool:
    log = CommitLog(LocalStorage(root, create=False))
    log.refresh()
    last = max((r["pos"] for r in log.records if r["op"] == "commit" and r["files"]), default=0)
    return bool(watch.seen) and watch.seen[-1][1] >= last


def handovers(lake: Path) -> list[float]:
    """Seconds from a run's last commit to the next run's first commit of the same member (the
    lake's commit log). A run's batch ids count up from its start time in ms (a batch rolled
    back skips one), so a new run is where a member's next commit jumps by a second or more."""
    log = CommitLog(LocalStorage(lake, create=False))
    log.refresh()
    by_member: dict[str, list[tuple[float, int]]] = {}
    for record in log.records:
        if record["op"] == "commit":
            at = dt.datetime.fromisoformat(record["committed_at"]).timestamp()
            by_member.setdefault(record["batch"]["member"], []).append((at, int(record["batch"]["batch_seq"])))
    gaps = []
    for commits in by_member.values():
        commits.sort()
        gaps += [b[0] - a[0] for a, b in zip(commits, commits[1:], strict=False) if abs(b[1] - a[1]) >= 1000]
    return gaps


async def landed_so_far(api: JsApi, stream: str, partitions: int, layout: str) -> int:
    """Messages no longer waiting: the origin's count minus what the stream that sources it holds
    (the work queue, or in the partition-streams layout the partition log) and its source's lag."""
    origin = int((await api.stream_info(stream))["state"]["messages"])
    wq = f"{stream}-g"
    store = await api.stream_info(wq if layout == grouplayout.WORK_QUEUE else grouplayout.partition_log(wq))
    lag = int((store.get("sources") or [{}])[0].get("lag", 0))
    return origin - int(store["state"]["messages"]) - lag


def backlog_growth(samples: list[tuple[float, int]], seconds: float) -> float:
    """How fast the backlog grew while publishing (msg/s): the mean over the last third of the
    publishing time minus the mean over the middle third, over the time between their centres."""
    mid = [b for t, b in samples if seconds / 3 <= t < 2 * seconds / 3]
    last = [b for t, b in samples if t >= 2 * seconds / 3]
    if not mid or not last:
        return float("inf")
    return max(0.0, (float(np.mean(last)) - float(np.mean(mid))) / (seconds / 3))


def run_case(url: str, workdir: Path, name: str, schedule: str, interval: float | None, rate: float,
             seconds: float, partitions: int, members: int, spark: bool, zip_path: Path,
             publishers: int = 4, layout: str = grouplayout.WORK_QUEUE,
             follow: tuple[float, float] | None = None, extra: tuple[str, ...] = (), sink: str = "parquet",
             driver_jvm: str = "operator", master: str = "local[2]", lander_cls: type[Lander] = Lander) -> dict:
    stream = name.upper()
    names = [f"m{i + 1}" for i in range(members)]

    async def setup() -> None:
        nc = await NatsConnectionSettings(servers=[url]).connect()
        await JsApi(nc).add_stream({"name": stream, "subjects": [f"{stream.lower()}.*"], "storage": "file"})
        await ConsumerGroups(nc).create(stream, "g", ElasticGroupConfig(
            partitions, (PartitioningFilter(f"{stream.lower()}.*", (1,)),), members=tuple(names)), layout=layout)
        await nc.close()

    asyncio.run(setup())
    lander = lander_cls(url, workdir, stream, names, interval, spark, zip_path, follow, extra,
                        workdir / "logs", sink, driver_jvm, master)
    watch = TableWatch(lander) if sink != "parquet" else None
    thread = threading.Thread(target=lander.run, daemon=True)
    publisher = Publisher(url, stream, rate, seconds, publishers)

    async def go() -> bool:
        nc = await NatsConnectionSettings(servers=[url]).connect()
        api = JsApi(nc)

        async def landed() -> int:
            return await landed_so_far(api, stream, partitions, layout)

        thread.start()
        if watch is not None:
            watch.thread.start()
        if follow:  # followers start warm: publishing begins once every member's job waits for it
            await all_ready(url, stream, names, workdir / "logs" if spark else None,
                            marker=lander.READY_MARKER, pulling=lander.WAITS_PULLING)
        nonlocal warm_cpu
        warm_cpu = lander.cpu_so_far()
        await publisher.run(landed)
        stopped = time.perf_counter()
        limit = stopped + (interval or 0) + 30
        while await landed() < publisher.published:
            if time.perf_counter() > limit:
                break
            await asyncio.sleep(0.2)
        drain_s = time.perf_counter() - stopped
        drained = await landed() >= publisher.published
        if watch is not None:  # what landed is also readable: the table holds every commit record
            readable = time.perf_counter() + 30
            while time.perf_counter() < readable and not _all_visible(lander.root, watch):  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # the table, polled
            drain_s = time.perf_counter() - stopped
        lander.stop.set()
        await nc.close()
        return drain_s if drained else None

    warm_cpu = 0.0  # the jobs' CPU before publishing began (followers' start-up)
    t = time.perf_counter()
    drain_s = asyncio.run(go())
    elapsed = time.perf_counter() - t
    thread.join(180)
    if watch is not None:
        time.sleep(0.2)
        watch.stop.set()
        watch.thread.join(10)
    f = freshness(lander.root, watch.visible_at if watch is not None else None)
    f = f[np.isfinite(f)]
    gaps = handovers(lander.root) if follow else []
    summaries = lander.summaries()
    table_commits = watch.commits() if watch is not None else None
    late = [round(s_["duration_s"] - follow[0], 1) for s_ in summaries
            if follow and s_.get("duration_s") and s_["duration_s"] > follow[0] + 2]
    achieved = publisher.published / publisher.elapsed
    # kept up: the backlog did not grow while publishing, what was left landed within one
    # scheduled interval (+10 s for a job's start), and p99 freshness is within the target
    p99 = float(np.percentile(f, 99)) if len(f) else float("inf")
    growth = backlog_growth(publisher.samples, publisher.elapsed)
    sustained = (drain_s is not None and drain_s <= (interval or 0) + 10 and p99 <= (interval or 0) + 30
                 and growth <= 0.05 * achieved)
    return {"sink": sink, "schedule": schedule, "members": members, "layout": layout, "publishers": publishers,
            "table_commits": table_commits,
            "table_commits_s": round(table_commits / elapsed, 2) if table_commits is not None else None,
            "table_conflicts": sum(int(s_.get("table_conflicts") or 0) for s_ in summaries),
            "followers_late_s": late,
            "rate_target": round(rate), "rate_achieved": round(achieved),
            "drain_s": None if drain_s is None else round(drain_s, 1), "published": publisher.published,
            "landed": int(len(f)), "landed_msg_s": round(len(f) / elapsed), "jobs": lander.jobs,
            "p50_s": round(float(np.percentile(f, 50)), 2) if len(f) else None,
            "p99_s": round(float(np.percentile(f, 99)), 2) if len(f) else None,
            "max_s": round(float(f.max()), 2) if len(f) else None,
            "backlog_max": max([b for _, b in publisher.samples] or [0]), "backlog_growth_msg_s": round(growth) if np.isfinite(growth) else None,
            "jobs_cpu_s": round(lander.cpu_s, 2),
            "cpu_us_per_msg": round(lander.cpu_s / len(f) * 1e6, 1) if len(f) else None,
            "warm_cpu_s": round(warm_cpu, 2),
            "cpu_us_per_msg_landing": round((lander.cpu_s - warm_cpu) / len(f) * 1e6, 1) if len(f) else None,
            "handovers": len(gaps), "handover_p50_s": round(float(np.percentile(gaps, 50)), 2) if gaps else None,
            "handover_max_s": round(max(gaps), 2) if gaps else None,
            "sustained": bool(sustained)}


def machine() -> dict:
    """What the figures ran on."""
    import platform

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}


def plot(rows: list[dict], reference: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key in dict.fromkeys((r["schedule"], r["members"], r["sink"]) for r in rows):
        pts = [r for r in rows if (r["schedule"], r["members"], r["sink"]) == key]
        x = [r["rate_achieved"] / 1000 for r in pts]
        label = f"{key[2]}, {key[0]}, {key[1]} member{'s' if key[1] > 1 else ''}"
        a.plot(x, [r["p99_s"] for r in pts], marker="o", label=f"{label} p99")
        b.plot(x, [r["landed_msg_s"] / 1000 for r in pts], marker="o", label=label)
    for ax in (a, b):
        ax.axvline(reference / 1000, color="#999", linestyle=":", label="server sourcing alone")
        ax.set_xlabel("publish rate (thousand msg/s)")
        ax.legend(fontsize=7)
    a.set_ylabel("publish -> readable, p99 (s)")
    a.set_title("freshness: publish to readable")
    b.set_ylabel("landed (thousand msg/s)")
    b.set_title("landed rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


class _Stopping:
    """A standalone cluster as ``contextlib.closing`` wants it: ``close`` stops it."""

    def __init__(self, cluster) -> None:
        self.cluster, self.master = cluster, cluster.master

    def close(self) -> None:
        self.cluster.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--publish-child":
        url, stream, rate, seconds, index = sys.argv[2:7]
        asyncio.run(publish_child(url, stream, float(rate), float(seconds), int(index)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="publishing time per case")
    p.add_argument("--fractions", default="0.1,0.2,0.3,0.5,0.75", help="publish rates, as fractions of sourcing")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between scheduled runs")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--members", default="1,3,6", help="member counts to run (each holds partitions / members)")
    p.add_argument("--schedules", default="back-to-back,follow",
                   help="back-to-back, every and/or follow (comma-separated)")
    p.add_argument("--follow-seconds", type=float, default=None,
                   help="a follower's time (default: the case's publishing time + 4 s, + 40 s with --spark: one "
                        "start per member; "
                        "shorter: hand-overs within the case)")
    p.add_argument("--commit-interval", default="1",
                   help="a follower's commit interval in seconds; several (1,2,4): each a follow schedule of its own")
    p.add_argument("--results", default="freshness", help="the name of the results' .json and .png")
    p.add_argument("--publishers", type=int, default=4, help="publisher processes")
    p.add_argument("--sinks", default="parquet", help="parquet, delta and/or iceberg (comma-separated): the same cases "
                                                     "into each, freshness being when a reader of the table sees a row")
    p.add_argument("--layout", default=grouplayout.WORK_QUEUE, choices=layouts.NAMES)
    p.add_argument("--reference-messages", type=int, default=300_000)
    p.add_argument("--spark", action="store_true", help="jobs under spark-submit (JVM start in every run)")
    p.add_argument("--standalone", action="store_true",
                   help="with --spark: submit to a Spark standalone master with two 1-core workers on this machine")
    p.add_argument("--driver-jvm", default="operator",
                   help="with --spark: operator (the driver JVM's options the operator gives a local follower: "
                        "C1 only) and/or jvm-default (none), comma-separated: each case with each")
    p.add_argument("--transform-sql", default=None,
                   help="the jobs' --transform-sql (with --spark), e.g. \"SELECT * FROM batch WHERE origin_seq %% 10 <> 7\"")
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep the server's store, the lakes and each job's log there (default: a temporary directory)")
    args = p.parse_args()
    ran_on = machine()
    fractions = [float(x) for x in args.fractions.split(",")]
    member_counts = [int(x) for x in args.members.split(",")]
    known = {"back-to-back": None, "every": args.interval, "follow": None}
    label = {"back-to-back": "back-to-back", "every": f"every-{args.interval:g}s", "follow": "follow"}
    commit_intervals = [float(x) for x in args.commit_interval.split(",")]
    # (label, scheduled interval, a follower's commit interval or None)
    schedules = [(label[name], known[name], None) for name in args.schedules.split(",") if name != "follow"]
    if "follow" in args.schedules.split(","):
        schedules += [("follow" if len(commit_intervals) == 1 else f"follow, commit every {ci:g} s", None, ci)
                      for ci in commit_intervals]
    # a follower outlives the case's publishing, which begins once it waits, warm: a driver's
    # start-up is about a second, spark-submit's (JVM, session, the warm-up's Spark jobs) up to
    # 25 s here beside the server and the publishers
    follow_s = args.follow_seconds or args.seconds + (40 if args.spark else 4)
    RESULTS.mkdir(exist_ok=True)
    rows: list[dict] = []
    with (contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory(prefix="cg-fresh-")) as d, \
            EmbeddedNatsServer(Path(d) / "nats") as srv, contextlib.ExitStack() as stack:
        zip_path = build_core_zip(Path(d) / "cg_core.zip")
        reference = asyncio.run(sourcing_rate(srv.url, args.reference_messages))
        print(f"server sourcing alone: {reference:,.0f} msg/s", flush=True)
        cluster = None
        if args.standalone:  # a master and two 1-core workers on this machine, stopped by their PIDs
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.support.spark_standalone import StandaloneCluster

            cluster = stack.enter_context(contextlib.closing(_Stopping(StandaloneCluster(
                Path(d) / "spark", cores=1, workers=2).start())))
        for k, members in enumerate(member_counts):
            for i, (schedule, interval, commit_interval) in enumerate(schedules):
                for j, frac in enumerate(fractions):
                    cases = [(sink, jvm) for sink in args.sinks.split(",") for jvm in args.driver_jvm.split(",")]
                    for n, (sink, jvm) in enumerate(cases):  # the same case into each table, with each JVM
                        row = run_case(srv.url, Path(d), f"F{k}x{i}x{j}x{n}", schedule, interval, reference * frac,
                                       args.seconds, args.partitions, members, args.spark, zip_path, args.publishers,
                                       args.layout, (follow_s, commit_interval) if commit_interval is not None else None,
                                       ("--transform-sql", args.transform_sql) if args.transform_sql else (), sink,
                                       jvm, cluster.master if cluster else "local[2]")
                        row["fraction"], row["commit_interval_s"], row["driver_jvm"] = frac, commit_interval, jvm
                        rows.append(row)
                        print(f"  {sink} ({jvm}): {members} members, {schedule} at {frac:.2f}x sourcing ({row['rate_achieved']:,} msg/s "
                              f"published): p50 {row['p50_s']} s, p99 {row['p99_s']} s, max {row['max_s']} s, landed "
                              f"{row['landed_msg_s']:,} msg/s, {row['jobs']} jobs, {row['cpu_us_per_msg']} us CPU/msg "
                              f"({row['cpu_us_per_msg_landing']} landing), hand-overs {row['handovers']} "
                              f"(p50 {row['handover_p50_s']} s, max {row['handover_max_s']} s), "
                              f"table commits {row['table_commits_s']}/s, conflicts {row['table_conflicts']}, followers "
                              f"late {row['followers_late_s']}, sustained {row['sustained']}", flush=True)
    cols = ["sink", "members", "schedule", "fraction", "rate_target", "rate_achieved", "published", "landed",
            "landed_msg_s", "p50_s", "p99_s", "max_s", "backlog_max", "backlog_growth_msg_s", "drain_s", "jobs",
            "cpu_us_per_msg", "cpu_us_per_msg_landing", "handover_p50_s", "handover_max_s",
            "table_commits_s", "table_conflicts", "sustained"]
    print("\n" + " ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c, '')!s:>13}" for c in cols))
    best = {}
    for key in dict.fromkeys((r["sink"], r["members"], r["schedule"]) for r in rows):
        rate = max([r["rate_achieved"] for r in rows if (r["sink"], r["members"], r["schedule"]) == key
                    and r["sustained"]] or [0])
        tried = max(r["rate_achieved"] for r in rows if (r["sink"], r["members"], r["schedule"]) == key)
        best[f"{key[0]}, {key[1]} members, {key[2]}"] = {"msg_s": rate, "x_sourcing": round(rate / reference, 2),
                                                         "highest_published": tried}
        print(f"{key[0]}, {key[1]} members, {key[2]}: highest sustained rate {rate:,} msg/s = {rate / reference:.2f}x the "
              f"server's sourcing (highest published {tried:,} msg/s)")
    cpu = {}  # the jobs' CPU per landed message against one member's, same schedule and rate
    cpu_landing = {}  # the same without the CPU spent before publishing began
    for r in rows:
        one = next((o for o in rows if o["members"] == 1 and o["schedule"] == r["schedule"]
                    and o["fraction"] == r["fraction"] and o["sink"] == r["sink"]), None)
        if one and one.get("cpu_us_per_msg") and r.get("cpu_us_per_msg"):
            r["cpu_x_one_member"] = round(r["cpu_us_per_msg"] / one["cpu_us_per_msg"], 2)
            r["cpu_landing_x_one_member"] = round(r["cpu_us_per_msg_landing"] / one["cpu_us_per_msg_landing"], 2)
            cpu[f"{r['sink']}, {r['members']} members, {r['schedule']}, {r['fraction']}x"] = r["cpu_x_one_member"]
            cpu_landing[f"{r['sink']}, {r['members']} members, {r['schedule']}, {r['fraction']}x"] = \
                r["cpu_landing_x_one_member"]
    for key, ratio in cpu.items():
        print(f"jobs' CPU per landed message, {key}: {ratio}x one member's ({cpu_landing[key]}x without start-up)")
    out = {"sourcing_msg_s": round(reference), "interval_s": args.interval, "partitions": args.partitions,
           "follow_s": follow_s,
           "commit_interval_s": commit_intervals[0] if len(commit_intervals) == 1 else commit_intervals, "cpu_x_one_member": cpu,
           "cpu_landing_x_one_member": cpu_landing, "machine": ran_on,
           "publishers": args.publishers, "layout": args.layout, "spark": args.spark,
           "master": "standalone (2 workers x 1 core)" if args.standalone else "local[2]",
           "transform_sql": args.transform_sql, "cases": rows,
           "highest_sustained": best}
    (RESULTS / f"{args.results}.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, reference, RESULTS / f"{args.results}.png")
    print(f"\nwrote {RESULTS / f'{args.results}.json'} and {RESULTS / f'{args.results}.png'}")


if __name__ == "__main__":
    main()
