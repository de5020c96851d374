"""A server's disk lost for good under a running group (issue 52's scenario), for the suite
(``tests/integration/test_lost_disk.py``) and for several seeds (``benchmarks/lost_disk.py``).

Three nats-servers on loopback, an R3 origin ``ORDERS`` (``orders.<key>``), an elastic group
``lake`` (6 partitions, members m1-m3) in the layout asked for. A publisher paces messages over
``keys`` keys (each with a ``Nats-Msg-Id``, retried until acknowledged: a retry across a leader
change is dropped by the origin's duplicate window, so the origin holds each message once) while
each member's job (``--no-spark``) runs again after every exit and is SIGKILLed now and then.
Half way, after a lull in publishing (``lull``: the mirrors acknowledge what they moved), the
server holding the most partition streams (in the work-queue layout: the work queue's leader) is
SIGKILLed, its store deleted, and a replacement with the same name, config and an empty store
started; publishing goes on (``disk`` False: not this). With ``move``, the group is moved to
the other layout and back after the loss. With ``two_down``, later, two servers are SIGKILLed at
once (stores kept: no quorum for the R3 streams), the group is seen stalled (``cg status``
names its partition streams as not current, or gets no answer), and both start again. Then the members land what is left, and the result is read back: every origin
message once, in per-key order (``assert_exactly_once``), and how long after the replacement
started the group was healthy (``cg status``: no partition problem, backlog 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.groups.layouts import partition_streams as ps
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from tests.support.member_job import assert_exactly_once, parquet_landed, start_member_job

STREAM, GROUP, PARTITIONS, MEMBERS = "ORDERS", "lake", 6, ("m1", "m2", "m3")
JOB = ["--batch-size", "300", "--ack-wait", "3", "--idle-timeout", "1", "--standby-timeout", "5",
       "--max-seconds", "8"]


@dataclass
class LostDiskRun:
    layout: str
    seed: int
    lull: bool = True
    move: bool = False
    disk: bool = True
    two_down: bool = False
    messages: int = 6000
    keys: int = 600
    seconds: float = 16.0  # publishing
    events: list[str] = field(default_factory=list)
    healthy_after_s: float | None = None  # from the last disruption's end to cg status naming no problem
    landed_after_s: float | None = None  # from the replacement's start to everything landed
    lost: int = 0
    lost_server_streams: dict[str, int] = field(default_factory=dict)

    def log(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f}s {text}")

    async def run(self, cluster, zip_path: Path, workdir: Path) -> None:
        """Run the scenario on ``cluster`` (``EmbeddedNatsCluster``, started) and check it."""
        self.t0 = time.monotonic()
        rng = random.Random(self.seed)
        urls = ",".join(cluster.urls)
        nc = await NatsConnectionSettings(servers=cluster.urls).connect()
        lake = workdir / "lake"
        jobs: dict[str, object] = {}
        stop_jobs = asyncio.Event()

        def start(m: str):
            return start_member_job(zip_path, workdir / "jobs", nats_servers=urls, stream=STREAM, group=GROUP,
                                    member=m, sink="parquet", sink_path=lake, args=JOB, spark=False)

        async def keep_running(m: str) -> None:  # a member's job, again after each exit
            while not stop_jobs.is_set():
                job = jobs[m] = start(m)
                while job.running() and not stop_jobs.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop_jobs.wait(), 0.2)
                if not stop_jobs.is_set():
                    r = job.result()
                    assert r.returncode in (0, 2, -9), r.describe()  # 2: a server away
                    assert "Traceback" not in r.output, r.describe()
            await asyncio.to_thread(jobs[m].wait, 120)

        async def killer() -> None:  # outside SIGKILLs of the members' jobs
            while not stop_jobs.is_set():
                await asyncio.sleep(rng.uniform(1.5, 4.0))
                job = jobs.get(rng.choice(MEMBERS))
                if job is not None and job.running() and not stop_jobs.is_set():
                    job.kill()
                    self.log(f"SIGKILL job {job.pid}")

        try:
            await self._create(nc)
            runners = [asyncio.create_task(keep_running(m)) for m in MEMBERS]
            kills = asyncio.create_task(killer())
            cuts = [self.messages * i // (1 + self.disk + self.two_down) for i in range(1 + self.disk + self.two_down)]
            await self._publish(nc, 0, cuts[1] if len(cuts) > 1 else self.messages)
            watch = None
            if self.disk:
                replaced_at = await self._lose_a_disk(cluster, nc)
                watch = asyncio.create_task(self._watch_health(nc, replaced_at))
                if self.move:
                    await self._move_and_back(nc)
            if self.two_down:
                if self.disk:
                    await self._publish(nc, cuts[1], cuts[2])
                if watch is not None:
                    await watch
                replaced_at = await self._two_down(cluster, nc)
                watch = asyncio.create_task(self._watch_health(nc, replaced_at))
            await self._publish(nc, cuts[-1], self.messages)
            if watch is not None:
                await watch
            await self._await_landed(nc, replaced_at)
            stop_jobs.set()
            kills.cancel()
            await asyncio.gather(*runners)
            expected = await self._origin(nc)
            assert len(expected) == self.messages, (len(expected), self.messages)
            landed = parquet_landed(lake)
            self.lost = len(set(expected) - {(r.origin_stream, r.origin_seq) for r in landed})
            assert_exactly_once(landed, expected)
        finally:
            stop_jobs.set()
            for job in jobs.values():
                if job.running():
                    job.kill()
            await nc.close()

    async def _create(self, nc) -> None:
        api = JsApi(nc)
        for _ in range(60):  # a fresh cluster elects its meta leader first
            try:
                await api.add_stream({"name": STREAM, "subjects": ["orders.*"], "num_replicas": 3,
                                      "allow_direct": True, "duplicate_window": 120_000_000_000})
                break
            except Exception:  # noqa: BLE001 - not yet
                await asyncio.sleep(0.5)
        await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
            PARTITIONS, (PartitioningFilter("orders.*", (1,)),), members=MEMBERS), layout=self.layout)
        self.log(f"group created in the {self.layout} layout")

    async def _publish(self, nc, first: int, end: int) -> None:
        """Messages ``first`` to ``end - 1``, paced over their share of ``seconds``."""
        js = nc.jetstream()
        pace = self.seconds / self.messages
        start = time.monotonic()
        for i in range(first, end):
            while True:
                try:
                    await js.publish(f"orders.k{i % self.keys}", b'{"id":%d}' % i, timeout=2,
                                     headers={"Nats-Msg-Id": f"m{i}"})
                    break
                except Exception:  # noqa: BLE001 - a server away, a leader change: again, same id
                    await asyncio.sleep(0.2)
            delay = start + (i - first + 1) * pace - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _lose_a_disk(self, cluster, nc) -> float:
        """The lull (if asked), then the server holding the most partition streams (or the work
        queue's leader) SIGKILLed, its store deleted, a replacement started on an empty one."""
        api, wq = JsApi(nc), f"{STREAM}-{GROUP}"
        if self.lull:
            await self._await_mirrors_acknowledged(api, wq)
        streams = {}  # partition stream -> (its server, messages it holds)
        for p in range(PARTITIONS):
            try:
                info = await api.stream_info(ps.partition_stream(wq, p))
            except Exception:  # noqa: BLE001 - the work-queue layout has none
                continue
            streams[info["config"]["name"]] = ((info.get("cluster") or {}).get("leader"), info["state"]["messages"])
        if streams:
            leaders = [leader for leader, _ in streams.values()]
            name = max(set(leaders), key=leaders.count)
        else:
            name = ((await api.stream_info(wq)).get("cluster") or {}).get("leader")
        server = next(s for s in cluster.servers if s.name == name)
        on_it = {s: n for s, (leader, n) in streams.items() if leader == name}
        self.lost_server_streams = on_it
        server.kill()
        shutil.rmtree(server.store_dir / "js")
        self.log(f"SIGKILL {name}, store deleted (its partition streams held {on_it})")
        await asyncio.sleep(1.0)
        server.start()
        self.log(f"replacement {name} started on an empty store")
        return time.monotonic()

    async def _two_down(self, cluster, nc) -> float:
        """Two of the three servers SIGKILLed at once (stores kept), the stall seen, both back."""
        if self.lull:
            await self._await_mirrors_acknowledged(JsApi(nc), f"{STREAM}-{GROUP}")
        down = cluster.servers[1:]
        for server in down:
            server.kill()
        self.log(f"SIGKILL {', '.join(s.name for s in down)} (stores kept)")
        cg, deadline = ConsumerGroups(nc), time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline and seen is None:
            try:
                st = await cg.status(STREAM, GROUP)
                seen = f"status: problems {st.partition_problems}" if st.partition_problems else None
            except Exception as e:  # noqa: BLE001 - what a stalled cluster answers
                seen = f"status refused: {type(e).__name__}: {e}"
            await asyncio.sleep(0.5)
        assert seen is not None, "two servers down and the tools said nothing"
        self.log(seen[:200])
        for server in down:
            server.start()
        self.log("both started again")
        return time.monotonic()

    async def _await_mirrors_acknowledged(self, api: JsApi, wq: str, timeout: float = 20.0) -> None:
        """A lull: what the partition streams took is acknowledged to what they mirror."""
        deadline = time.monotonic() + timeout
        source = ps.partition_log(wq) if self.layout == ps.PARTITION_STREAMS else wq
        while time.monotonic() < deadline:
            infos = [await api.consumer_info(source, f"cg-partition-{p}") for p in range(PARTITIONS)]
            if all(i is None or (not i["num_ack_pending"] and not i["num_pending"]) for i in infos):
                break
            await asyncio.sleep(0.2)
        self.log("lull: the mirrors acknowledged what they moved")

    async def _move_and_back(self, nc) -> None:
        cg = ConsumerGroups(nc)
        other = ps.WORK_QUEUE if self.layout == ps.PARTITION_STREAMS else ps.PARTITION_STREAMS
        for to in (other, self.layout):
            for _ in range(120):
                try:
                    move = await cg.move_layout(STREAM, GROUP, to, wait=1)
                except Exception as e:  # noqa: BLE001 - a server still catching up: again
                    self.log(f"layout -> {to}: {type(e).__name__}: {e}")
                    await asyncio.sleep(1.0)
                    continue
                if move.done:
                    break
            else:
                raise AssertionError(f"the move to {to} did not finish")
            self.log(f"layout -> {to}")

    async def _watch_health(self, nc, since: float, timeout: float = 120.0) -> None:
        """From a disruption on (``since``), while publishing goes on: how long until ``cg
        status`` first names no partition problem (``healthy_after_s``)."""
        cg = ConsumerGroups(nc)
        self.healthy_after_s = None
        while time.monotonic() - since < timeout:
            with contextlib.suppress(Exception):  # a server catching up: not healthy yet
                if not (await cg.status(STREAM, GROUP)).partition_problems:
                    self.healthy_after_s = round(time.monotonic() - since, 1)
                    self.log("group healthy")
                    return
            await asyncio.sleep(0.5)

    async def _await_landed(self, nc, replaced_at: float, timeout: float = 180.0) -> None:
        """Until the group names no partition problem, has nothing left to land, and its
        source has reached the origin's end (after a server's loss a source's consumer is made
        again with a back-off of up to two minutes: a backlog of 0 said nothing then)."""
        cg, api = ConsumerGroups(nc), JsApi(nc)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                st = await cg.status(STREAM, GROUP)
                origin = (await api.stream_info(STREAM))["state"]["messages"]
                sourcing = layouts.named(st.layout).sourcing_stream(f"{STREAM}-{GROUP}")
                sourced = int(((await api.stream_info(sourcing)).get("sources") or [{}])[0].get("seq") or 0)
            except Exception as e:  # noqa: BLE001 - a server catching up
                last = f"{type(e).__name__}: {e}"
                await asyncio.sleep(0.5)
                continue
            last = f"backlog {st.backlog}, problems {st.partition_problems}, {sourcing} sourced through {sourced}"
            if not st.partition_problems and st.backlog == 0 and origin == self.messages and sourced >= origin:
                self.landed_after_s = round(time.monotonic() - replaced_at, 1)
                self.log("landed")
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"not landed in {timeout:.0f}s: {last}\n" + "\n".join(self.events))

    async def _origin(self, nc) -> dict[tuple[str, int], str]:
        """Every origin message: ``(stream, seq) -> key``."""
        api = JsApi(nc)
        last = int((await api.stream_info(STREAM))["state"]["last_seq"])
        out = {}
        for seq in range(1, last + 1):
            msg = await api.get_msg(STREAM, seq)
            if msg is not None:
                out[(STREAM, seq)] = msg["subject"].split(".", 1)[1]
        return out
