"""Randomized outside faults against running member jobs, then a clean drain.

``ChaosRun`` publishes an order stream in chunks while member jobs (two instances per member:
a pinned one and a standby) consume it, and injects faults from outside only, at random
moments drawn from one seed: SIGKILL of a job, SIGSTOP past the ack wait then SIGCONT, a
step-down, a membership change (a member added; a member dropped, sometimes right after its
job was killed mid-batch; a dropped member re-added), nats-server restarts (on a cluster:
the node leading the work-queue stream) and, for a table on object storage, restarts of the
S3-compatible server under the jobs' writes. Afterwards every member is drained by fresh jobs and
``check`` asserts no loss, no duplicate, per-key order, an empty work queue, no prepared write
left behind, and no traceback in any job's output. The seed and every fault are in
``events``: ``CG_CHAOS_SEED=<seed>`` replays the same schedule.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    JetStreamApiError,
    ServerUnavailable,
)
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import StaticGroupConfig
from airflow_provider_cg.core.groups.names import static_consumer_name
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from tests.support.member_job import (
    MemberJob,
    assert_exactly_once,
    create_group,
    delta_landed,
    iceberg_landed,
    parquet_landed,
    postgres_landed,
    publish_orders,
    start_member_job,
    wq_messages,
)

ACK_WAIT = 3.0
HEALTHY_WITHIN = 30.0  # seconds a cluster has to report every server healthy after a restart
MERGE_RULE = "payload_text = 'deleted'"
JOB_ARGS = ["--batch-size", "400", "--ack-wait", str(ACK_WAIT), "--standby-timeout", "6",
            "--idle-timeout", "1.5", "--max-seconds", "45", "--progress-interval", "30"]


@dataclass
class ChaosConfig:
    seed: int
    seconds: float = 40.0
    messages: int = 100_000
    keys: int = 3_000
    partitions: int = 6
    members: tuple[str, ...] = ("m1", "m2", "m3")
    sink: str = "parquet"  # or "postgres", "delta", "iceberg"
    spark: bool = False  # True: every job through spark-submit (slower to start)
    server_restarts: int = 2
    store_restarts: int = 0  # restarts of the object store (needs ``ChaosRun.object_store``)
    replicas: int = 1
    chunks: int = 8
    static: bool = False  # a static group on an origin with direct gets (no membership changes)
    read: str | None = None  # the jobs' --read (``executors``: Spark's tasks read; needs ``spark``)
    merge: bool = False  # upserts by key (--merge-keys key): a change stream, about 1 in 8 records a delete
    layout: str = "work-queue"  # the elastic group's layout at the start (``groups/layouts/``)
    layout_moves: int = 0  # moves to the other layout during the faults (each waits for its side to be landed)
    routed_keys: int = 0  # routes by subject: every message into the table, and those of this many keys into a second
    partition_replicas: int | None = None  # the partition streams' replicas (default 1)
    restarts_on_schedule: bool = False  # server restarts only at their shares of the time (none drawn at random)
    followers: float = 0.0  # the share of member jobs started as followers (``follow_args``)


@dataclass
class ChaosRun:
    config: ChaosConfig
    nc: object
    servers: list[EmbeddedNatsServer]
    workdir: Path
    zip_path: Path
    sink_env: dict[str, str] = field(default_factory=dict)
    object_store: object = None  # a tests.support.minio.MinioServer: the table lives in its bucket
    bucket: str | None = None
    stream: str = "ORD"
    group: str = "g"

    def __post_init__(self) -> None:
        self.rng = random.Random(self.config.seed)
        self.current = list(self.config.members)
        self.ever = set(self.config.members)
        self.jobs: list[tuple[str, MemberJob]] = []
        self.suspended: dict[int, tuple[MemberJob, float]] = {}
        self.expected: dict[tuple[str, int], str] = {}
        self.deleted: set[tuple[str, int]] = set()  # merge: the records that are tombstones
        self.events: list[str] = [f"seed={self.config.seed}"]
        self.restarts_left = self.config.server_restarts
        self.moves_left = self.config.layout_moves
        self.healthy_after: list[float] = []  # per server restart (a cluster): seconds until /healthz was ok
        self.layout = self.config.layout
        self.moving: str | None = None  # the layout of a move not finished yet (filling or draining)
        self.groups = ConsumerGroups(self.nc)
        self.store_restarts_left = self.config.store_restarts
        self.started: float | None = None
        self.drain_started = False
        self.lake = self.workdir / "lake"
        self.catalog_uri = f"sqlite:///{self.workdir}/catalog.db"
        if self.object_store is not None:
            self.sink_env = {**self.object_store.env(), **self.sink_env}
            self.table, self.warehouse = f"s3://{self.bucket}/orders", f"s3://{self.bucket}/warehouse"
        else:
            self.table, self.warehouse = str(self.workdir / "orders"), str(self.workdir / "warehouse")
        self.t0 = time.monotonic()

    # --- helpers ---------------------------------------------------------------------------

    def log(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f}s {what}")
        if os.environ.get("CG_CHAOS_LIVE"):  # a run that hangs: watch it as it goes (pytest -s)
            print(self.events[-1], flush=True)

    @property
    def urls(self) -> str:
        return ",".join(s.url for s in self.servers)

    def sink_args(self) -> tuple[str | Path | None, list[str]]:
        """``(sink_path, extra arguments)`` of every job's sink."""
        sink = self.config.sink
        if sink == "parquet":
            return self.lake, []
        # upserts read the tombstone rule's column, payload_text: the payloads are decoded as text
        merge = ["--merge-keys", "key", "--delete-when", MERGE_RULE, "--payload-format", "text"] \
            if self.config.merge else []
        if sink == "iceberg":
            return None, ["--iceberg-table", "lake.orders", "--iceberg-catalog-uri", self.catalog_uri,
                          "--iceberg-warehouse", self.warehouse, *merge]
        if sink == "delta":
            return self.table, merge
        return None, ["--pg-table", "orders", *merge]

    def routes_args(self, sink_path) -> list[str]:
        """``routed_keys``: the table (``sink_path``: every message) and a second Parquet lake of
        the messages of the first ``routed_keys`` keys, both routed by subject."""
        few = [f"ord.k{i}" for i in range(self.config.routed_keys)]
        return ["--routes", json.dumps({"all": {"sink_path": str(sink_path), "subjects": ["ord.*"]},
                                        "few": {"sink_path": str(self.workdir / "few"), "subjects": few}})]

    def start_job(self, member: str) -> MemberJob:
        sink_path, sink_args = self.sink_args()
        if self.config.routed_keys:
            sink_path, sink_args = None, [*sink_args, *self.routes_args(sink_path)]
        job = start_member_job(
            self.zip_path, self.workdir / "jobs", nats_servers=self.urls, stream=self.stream, group=self.group,
            member=member, sink=self.config.sink, sink_path=sink_path,
            args=[*JOB_ARGS, *sink_args, *(["--read", self.config.read] if self.config.read else []),
                  *self.follow_args()],
            env=self.sink_env, spark=self.config.spark)
        self.jobs.append((member, job))
        return job

    def follow_args(self) -> list[str]:
        """A member job's ``--follow`` for the share ``followers`` of the jobs started while the
        faults go on: kept pinned 2-8 s (long enough for faults to meet it mid-batch), ending by
        about the end of the faults, batches every 0.3 s. The drain's jobs never follow."""
        if not self.config.followers or self.started is None or self.drain_started:
            return []
        left = self.config.seconds - (time.monotonic() - self.started)
        first = not any("--follow" in j.cmd for _, j in self.jobs)  # every such run has one
        if first or self.rng.random() < self.config.followers:
            return ["--follow", f"{max(1.5, min(self.rng.uniform(2, 8), left + 1)):.1f}", "--commit-interval", "0.3"]
        return []

    def followers_landed(self) -> tuple[int, int]:
        """(follower jobs started, those whose summary shows more than one batch)."""
        followers = [j for _, j in self.jobs if "--follow" in j.cmd]
        return len(followers), sum(1 for j in followers if ((j.result().summary or {}).get("batches") or 0) > 1)

    def running(self, member: str | None = None) -> list[MemberJob]:
        return [j for m, j in self.jobs if j.running() and (member is None or m == member)]

    async def setup(self) -> None:
        deadline = time.monotonic() + 30
        while True:  # a fresh cluster needs a moment to elect its JetStream meta leader
            try:
                if self.config.static:
                    await self._create_static_group()
                    return
                await create_group(self.nc, self.stream, self.group, partitions=self.config.partitions,
                                   members=self.config.members, subjects_prefix="ord",
                                   replicas=self.config.replicas)
                if self.layout != "work-queue":
                    await self.groups.move_layout(self.stream, self.group, self.layout, wait=10,
                                                  partition_replicas=self.config.partition_replicas)
                return
            except Exception:  # creating the same stream and group again is a no-op
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)

    async def _create_static_group(self) -> None:
        cfg = self.config
        await JsApi(self.nc).add_stream({
            "name": self.stream, "subjects": ["ord.*"], "num_replicas": cfg.replicas, "allow_direct": True,
            "subject_transform": {"src": "ord.*", "dest": f"{{{{Partition({cfg.partitions},1)}}}}.ord.{{{{Wildcard(1)}}}}"}})
        await self.groups.create(self.stream, self.group, StaticGroupConfig(cfg.partitions, ("ord.*",),
                                                                            members=cfg.members))

    async def backlog(self) -> int:
        """Messages not yet acknowledged: the work queue's, or the static durables' pending."""
        if not self.config.static and self.layout == "work-queue" and not self.moving:
            return await wq_messages(self.nc, self.stream, self.group)
        if not self.config.static:
            return (await self.groups.status(self.stream, self.group)).backlog
        api, left = JsApi(self.nc), 0
        for m in self.current:
            info = await api.consumer_info(self.stream, static_consumer_name(self.group, m))
            left += int(info["num_pending"]) + int(info["num_ack_pending"]) if info else 1
        return left

    async def publish_chunk(self, n: int) -> None:
        tombstones: set[int] = set()

        def payload(i: int) -> bytes:
            if self.config.merge and self.rng.random() < 0.125:
                tombstones.add(i)
                return b"deleted"
            return b'{"id":%d}' % i

        got = await publish_orders(self.nc, self.stream, self.group, n, self.config.keys, subjects_prefix="ord",
                                   wait_sourced=not self.config.static, payload=payload)
        self.deleted |= {k for i, k in enumerate(sorted(got, key=lambda k: k[1])) if i in tombstones}
        # a static group's key is the subject (its partition token stripped)
        self.expected |= {k: f"ord.{v}" for k, v in got.items()} if self.config.static else got
        self.log(f"published {n} (total {len(self.expected)})")

    # --- faults ----------------------------------------------------------------------------

    async def resume_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for pid, (job, at) in list(self.suspended.items()):
            if everything or now >= at:
                job.resume()
                del self.suspended[pid]
                self.log(f"SIGCONT job {pid}")

    def supervise(self) -> None:
        """Keep two instances per member (a pinned one and a standby) while faults go on."""
        for m in self.current:
            if len(self.running(m)) < 2 and self.rng.random() < 0.6:
                job = self.start_job(m)
                self.log(f"start job {job.pid} for {m}")

    async def fault(self) -> None:
        kind = self.rng.choices(["kill", "stop", "step-down", "membership", "restart", "store", "none"],
                                weights=[30, 20, 18, 12, 6 if self.restarts_left and not self.config.restarts_on_schedule
                                         else 0,
                                         6 if self.store_restarts_left else 0, 14])[0]
        if kind == "membership" and self.config.static:  # a static group's membership is fixed
            kind = "none"
        # Server and store restarts happen in every run, however short: one that is still
        # owed when its share of the time is up comes now.
        owed = self._owed_restarts()
        if owed:
            kind = owed[0]
        running = [j for j in self.running() if j.pid not in self.suspended]
        if kind == "kill" and running:
            publisher = self.publisher(running) if self.rng.random() < 0.7 else None
            job = publisher or self.rng.choice(running)
            job.kill()
            self.log(f"SIGKILL job {job.pid}{', the table commit slot holder' if publisher else ''}")
        elif kind == "stop" and running:
            job = self.rng.choice(running)
            job.suspend()
            self.suspended[job.pid] = (job, time.monotonic() + self.rng.uniform(ACK_WAIT + 1, ACK_WAIT + 5))
            self.log(f"SIGSTOP job {job.pid}")
        elif kind == "step-down" and self.current:
            m = self.rng.choice(self.current)
            try:
                await self.groups.step_down(self.stream, self.group, m)
                self.log(f"step-down {m}")
            except ConfigError:
                self.log(f"step-down {m}: no consumer")
            except (ServerUnavailable, JetStreamApiError) as e:  # e.g. the consumer's leader is being elected
                self.log(f"step-down {m}: not answered ({type(e).__name__}); a later fault goes on")
        elif kind == "membership":
            await self.change_membership()
        elif kind == "restart":
            await self.restart_server()
        elif kind == "store":
            await self.restart_object_store()
        elif kind == "layout":
            await self.move_layout()

    def publisher(self, running: list[MemberJob]) -> MemberJob | None:
        """The job that claimed the newest table commit slot of a Delta or Iceberg table on local
        disk (``_cg_publish/<slot>`` names its process), if it runs: likely committing for the
        others right now."""
        if self.config.sink not in ("delta", "iceberg") or self.object_store is not None:
            return None
        root = Path(self.table) if self.config.sink == "delta" else Path(self.warehouse) / "lake.db" / "orders"
        try:
            newest = max((n for n in os.listdir(root / "_cg_publish") if n.isdigit()), default=None)
            pid = json.loads((root / "_cg_publish" / newest).read_bytes())["pid"] if newest else None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return next((j for j in running if j.pid == pid), None)

    async def move_layout(self) -> None:
        """Move the group to its other layout under the running jobs (or take back a move not
        finished yet); ``finish_move`` finishes it once the side it leaves is landed."""
        to = "partition-streams" if self.layout == "work-queue" else "work-queue"
        try:
            move = await self.groups.move_layout(self.stream, self.group, to, wait=0,
                                                 partition_replicas=self.config.partition_replicas
                                                 if to == "partition-streams" else None)
        except ConsumerGroupError as e:  # e.g. across a server restart: the move is idempotent, do it again
            self.log(f"layout -> {to} interrupted ({type(e).__name__}: {e}); again later")
            return
        self.moves_left -= 1
        self.layout, self.moving = to, (None if move.done else to)
        self.log(f"layout -> {to}" + (f" ({move.layout} {sum(move.left.values())})" if self.moving else ""))

    async def finish_move(self) -> None:
        if self.moving:
            try:
                move = await self.groups.move_layout(self.stream, self.group, self.moving, wait=0)
            except ConsumerGroupError as e:
                self.log(f"finishing the layout move interrupted ({type(e).__name__}); again later")
                return
            if move.done:
                self.log(f"layout move to {self.moving} finished")
                self.moving = None

    async def change_membership(self) -> None:
        base = [m for m in self.config.members if m in self.current]
        if "m4" not in self.current and self.rng.random() < 0.5:
            await self.groups.add_members(self.stream, self.group, ["m4"])
            self.current.append("m4")
            self.ever.add("m4")
            self.log("add m4")
            self.start_job("m4")
            return
        if len(self.current) > 2:
            victim = "m4" if "m4" in self.current and self.rng.random() < 0.6 else self.rng.choice(base)
            if self.rng.random() < 0.5:
                for job in self.running(victim):  # killed mid-batch, then dropped: its orphan
                    job.kill()
                    self.log(f"SIGKILL job {job.pid} of {victim} before dropping it")
            await self.groups.drop_members(self.stream, self.group, [victim])
            self.current.remove(victim)
            self.log(f"drop {victim}")
            return
        missing = [m for m in self.config.members if m not in self.current]
        if missing:
            m = self.rng.choice(missing)
            await self.groups.add_members(self.stream, self.group, [m])
            self.current.append(m)
            self.log(f"re-add {m}")

    async def restart_server(self) -> None:
        self.restarts_left -= 1
        if len(self.servers) == 1:
            server = self.servers[0]
        else:  # the node leading the work-queue stream, or (partition streams) a partition's stream
            led = f"{self.stream}-{self.group}"
            if self.layout == "partition-streams" and not self.moving:
                led = f"{led}-p{self.rng.randrange(self.config.partitions)}"
            try:
                leader = ((await JsApi(self.nc).stream_info(led)).get("cluster") or {}).get("leader")
            except (ServerUnavailable, JetStreamApiError):
                leader = None
            server = next((s for s in self.servers if s.name == leader), self.rng.choice(self.servers))
            self.log(f"{led} led by {leader}")
        crash = self.rng.random() < 0.5
        self.log(f"{'SIGKILL' if crash else 'restart'} nats-server {server.name}")
        await asyncio.to_thread(server.kill if crash else server.stop)
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await asyncio.to_thread(server.start)
        back = time.monotonic()
        await self.wait_for_streams()
        self.log(f"nats-server {server.name} back")
        if len(self.servers) > 1 and all(s.http_port for s in self.servers):
            await self.wait_healthy(back)

    async def wait_healthy(self, since: float) -> None:
        """Every server's ``/healthz`` ok again (its streams current) after a restart: how long
        it took is recorded, and ``check`` holds it to ``HEALTHY_WITHIN``."""
        while True:
            states = [await asyncio.to_thread(s.healthz) for s in self.servers]
            if all(ok for ok, _ in states):
                self.healthy_after.append(time.monotonic() - since)
                self.log(f"cluster healthy {self.healthy_after[-1]:.1f}s after the restart")
                return
            if time.monotonic() - since > 3 * HEALTHY_WITHIN:
                self.healthy_after.append(float("inf"))
                self.log(f"cluster NOT healthy {3 * HEALTHY_WITHIN:.0f}s after the restart: "
                         + "; ".join(body for ok, body in states if not ok))
                return
            await asyncio.sleep(0.5)

    async def restart_object_store(self) -> None:
        """Stop (or SIGKILL) the S3-compatible server under the jobs' writes, then start it
        again on the same port and data: writes in flight fail, jobs must roll back or retry."""
        self.store_restarts_left -= 1
        crash = self.rng.random() < 0.5
        self.log(f"{'SIGKILL' if crash else 'stop'} object store")
        await asyncio.to_thread(self.object_store.kill if crash else self.object_store.stop)
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await asyncio.to_thread(self.object_store.start)
        self.log("object store back")

    async def wait_for_streams(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        api = JsApi(self.nc)
        while True:
            try:
                if not self.config.static:
                    await api.stream_info(f"{self.stream}-{self.group}")
                await api.stream_info(self.stream)
                if self.layout == "partition-streams" and not self.moving:  # each with a leader again
                    from airflow_provider_cg.core.groups.layouts.partition_streams import (
                        partition_stream_problems,
                    )

                    problems = await partition_stream_problems(api, f"{self.stream}-{self.group}",
                                                               range(self.config.partitions))
                    if problems:
                        raise ServerUnavailable(f"partition streams not current: {problems}")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    # --- the run ---------------------------------------------------------------------------

    def _owed_restarts(self) -> list[str]:
        """The server and store restarts (and layout moves) whose share of the fault phase is up,
        the one due first first: a layout move a little before the restart of its share, so a
        restart meets each layout."""
        due = [((total - left + 1) / (total + 1) - (0.05 if k == "layout" else 0), k) for k, left, total in (
            ("restart", self.restarts_left, self.config.server_restarts),
            ("store", self.store_restarts_left, self.config.store_restarts),
            ("layout", self.moves_left, self.config.layout_moves)) if left]
        return [k for at, k in sorted(due) if self._elapsed() >= at]

    def owed(self) -> bool:
        """A fault every run must have is due: it comes even while publishing catches up
        (a slow server restart can leave every later iteration a publishing one)."""
        return bool(self._owed_restarts())

    def _elapsed(self) -> float:
        """The share of the fault phase gone by (0 to 1)."""
        return min(1.0, (time.monotonic() - self.started) / self.config.seconds) if self.started else 0.0

    async def run(self) -> None:
        cfg = self.config
        await self.setup()
        self.started = time.monotonic()
        chunk = cfg.messages // cfg.chunks
        publish_every = cfg.seconds / (cfg.chunks + 1)
        next_publish = time.monotonic()
        deadline = time.monotonic() + cfg.seconds
        published = 0
        while time.monotonic() < deadline or published < cfg.messages or self.owed():
            await self.resume_due()
            await self.finish_move()
            self.supervise()
            publishing = published < cfg.messages and time.monotonic() >= next_publish
            if publishing:
                n = min(chunk, cfg.messages - published) if published + 2 * chunk <= cfg.messages else cfg.messages - published
                await self.publish_chunk(n)
                published += n
                next_publish += publish_every
            if (not publishing and time.monotonic() < deadline) or self.owed():
                await self.fault()
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        self.log("faults over")
        await self.resume_due(everything=True)
        await self.wait_for_streams()
        await asyncio.to_thread(self._wait_jobs, 120.0)
        await self.drain()

    def _wait_jobs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _, job in self.jobs:
            try:
                job.proc.wait(max(1.0, deadline - time.monotonic()))
            except Exception:
                job.kill()
                self.log(f"job {job.pid} did not end by itself: killed")

    async def drain(self, rounds: int = 6) -> None:
        self.drain_started = True
        for i in range(rounds):
            await self.finish_move()
            left = await self.backlog()
            if left == 0 and i > 0 and not self.moving:
                return
            self.log(f"drain round {i + 1}: {left} messages left")
            for job in [self.start_job(m) for m in self.current]:
                await asyncio.to_thread(job.wait, 240)
        await self.finish_move()
        left = await self.backlog()
        assert left == 0, f"{left} messages left after {rounds} drain rounds\n" + self.report()
        assert not self.moving, f"the move to {self.moving} never finished\n" + self.report()

    # --- the verdict ---------------------------------------------------------------------------

    def report(self) -> str:
        codes = Counter(j.proc.returncode for _, j in self.jobs)
        refused = [f"  job {j.pid} for {m} exited 1: {last_error(j)}" for m, j in self.jobs
                   if j.proc.returncode == 1]
        return "\n".join(self.events + refused) + f"\njobs: {len(self.jobs)}, exit codes {dict(codes)}"

    def landed(self, pg_params=None):
        sink = self.config.sink
        if sink == "parquet":
            return parquet_landed(self.lake)
        if sink == "delta":
            return delta_landed(self.table, self.storage_options())
        if sink == "iceberg":
            return iceberg_landed(self.catalog_uri, "lake.orders")
        return postgres_landed(pg_params, "orders")

    def storage_options(self) -> dict | None:
        if self.object_store is None:
            return None
        from airflow_provider_cg.core.landing.sinks.delta.writer import delta_storage_options
        from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

        return delta_storage_options(ObjectStoreSettings.from_env(self.sink_env))

    def open_sink(self):
        """The job's own sink class on the run's table (for what is left prepared)."""
        sink = self.config.sink
        if sink == "parquet":
            from airflow_provider_cg.core.landing.sinks.lake.writer import ParquetLakeSink

            return ParquetLakeSink(self.lake)
        if sink == "delta":
            from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

            return DeltaLakeSink(self.table)
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        return IcebergSink(self.catalog_uri, "lake.orders")

    def last_state(self) -> dict[str, int]:
        """Merge: each key's last record (its origin_seq), computed here from what was published;
        a key whose last record is a tombstone is absent."""
        last: dict[str, tuple[str, int]] = {}
        for k, key in sorted(self.expected.items(), key=lambda kv: kv[0][1]):
            last[key] = k
        return {key: k[1] for key, k in last.items() if k not in self.deleted}

    def table_state(self, pg_params=None) -> dict[str, int]:
        """Merge: the table's key -> origin_seq, as delta-rs, pyiceberg or psycopg2 read it."""
        sink = self.config.sink
        if sink == "delta":
            from tests.support.member_job import read_delta

            t = read_delta(self.table, ["key", "origin_seq"], self.storage_options())
            rows = list(zip(t.column("key").to_pylist(), t.column("origin_seq").to_pylist(), strict=True))
        elif sink == "iceberg":
            t = self.open_sink().load_table().scan(selected_fields=("key", "origin_seq")).to_arrow()
            rows = list(zip(t.column("key").to_pylist(), t.column("origin_seq").to_pylist(), strict=True))
        else:
            import psycopg2

            with psycopg2.connect(**pg_params) as conn, conn.cursor() as cur:
                cur.execute("SELECT key, origin_seq FROM orders")
                rows = cur.fetchall()
            conn.close()
        assert len(rows) == len({k for k, _ in rows}), "a key has two rows\n" + self.report()
        return dict(rows)

    async def check(self, pg_params=None) -> dict:
        try:
            if self.config.merge:
                want, got = self.last_state(), self.table_state(pg_params)
                wrong = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
                assert not wrong, (f"{len(wrong)} keys differ from their last state, e.g. "
                                   f"{[(k, want.get(k), got.get(k)) for k in wrong[:5]]} (key, want, table)")
            else:
                assert_exactly_once(self.landed(pg_params), self.expected)
            if self.config.routed_keys:  # the second table: its keys' messages, once each, in order
                few = {f"k{i}" for i in range(self.config.routed_keys)}
                assert_exactly_once(parquet_landed(self.workdir / "few"),
                                    {k: v for k, v in self.expected.items() if v in few})
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.report()}") from None
        assert await self.backlog() == 0, self.report()
        assert all(t <= HEALTHY_WITHIN for t in self.healthy_after), \
            f"the cluster was not healthy within {HEALTHY_WITHIN:g}s of a restart\n{self.report()}"
        tracebacks = [j for _, j in self.jobs if "Traceback" in j.output_so_far()]
        assert not tracebacks, (f"{len(tracebacks)} jobs crashed with a traceback, e.g.:\n"
                                + tracebacks[0].result().describe() + "\n" + self.report())
        # A job refuses (exit 1) only when its member was dropped from the group under it.
        refused = [j for _, j in self.jobs if j.proc.returncode == 1
                   and "is not a member of group" not in last_error(j)]
        assert not refused, f"a job refused its input: {last_error(refused[0])}\n{self.report()}"
        left = self.prepared_left(pg_params)
        assert not left, f"prepared writes left behind: {left}\n{self.report()}"
        stats = {"jobs": len(self.jobs), "events": len(self.events), "landed": len(self.expected)}
        if self.config.followers:
            started, following = self.followers_landed()
            assert started, f"no follower among the writers\n{self.report()}"
            stats["followers"] = f"{started} started, {following} landed more than one batch"
        return stats

    def prepared_left(self, pg_params=None) -> list[str]:
        if self.config.sink != "postgres":
            sinks = [self.open_sink()]
            if self.config.routed_keys:
                from airflow_provider_cg.core.landing.sinks.lake.writer import ParquetLakeSink

                sinks.append(ParquetLakeSink(self.workdir / "few"))
            parts = range(self.config.partitions)
            return sorted({w.gid for sink in sinks for m in self.ever
                           for w in sink.recover(self.stream, self.group, m, parts)})
        import psycopg2

        with psycopg2.connect(**pg_params) as conn, conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'cg:%'")
            gids = [r[0] for r in cur.fetchall()]
        conn.close()
        return gids


def chaos_seed(request) -> int:
    """``--chaos-seed``, else ``$CG_CHAOS_SEED``, else a new seed."""
    seed = request.config.getoption("--chaos-seed")
    if seed is None:
        seed = int(os.environ.get("CG_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
    return seed


def with_chaos_options(request, cfg):
    """``cfg`` with ``--chaos-seconds`` and ``--chaos-messages`` applied (a longer run)."""
    opt = request.config.getoption
    if opt("--chaos-seconds"):
        cfg.seconds = opt("--chaos-seconds")
    if opt("--chaos-messages"):
        cfg.messages = opt("--chaos-messages")
    return cfg


def last_error(job: MemberJob) -> str:
    """The job's error line (its summary's ``error``, else its last output line)."""
    lines = [ln for ln in job.output_so_far().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["(no output)"])[-1][:300]
