"""``cg resize`` against a real nats-server while member jobs land: a publisher keeps
publishing, a runner keeps starting one job per member and, from a printed seed, SIGKILLs or
SIGSTOPs some of them at random moments (a SIGSTOPped job is resumed after its pin expired),
and the resize stops sourcing, waits for the members to drain the old partitions, switches the
partition count and resumes. Afterwards: 0 lost, 0 duplicated, per-key order in the lake.

Jobs run as the plain Python driver (``spark=False``): the protocol is the same.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.badinput import acg
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
)

pytestmark = [pytest.mark.integration]

KEYS = 60


async def _cg(url: str, *args: str) -> tuple[int, str, str]:
    a = await acg(*args, "--server", url)
    return a.rc, a.out, a.err


class Runner:
    """Keeps one job per member running until stopped; injects faults from ``rng``."""

    def __init__(self, zip_path, tmp_path, url, members, rng: random.Random, faults: bool) -> None:
        self.zip_path, self.tmp_path, self.url = zip_path, tmp_path, url
        self.members, self.rng, self.faults = list(members), rng, faults
        self.jobs: dict[str, object] = {}
        self.results: list = []
        self.killed = self.stopped = self.followers = 0
        self.suspended: list[tuple[object, float]] = []

    def _start(self, member: str):
        return start_member_job(self.zip_path, self.tmp_path / "jobs", nats_servers=self.url, stream="ORDERS",
                                group="g", member=member, sink_path=self.tmp_path / "lake", spark=False,
                                args=["--idle-timeout", "1", "--standby-timeout", "4", "--batch-size",
                                      str(self.rng.choice([50, 200, 1000])), *self._follow()])

    def _follow(self) -> list[str]:
        """Half of the jobs are followers (``--follow``): the resize revokes their partitions at
        a batch boundary while they keep their pins."""
        if not self.followers or self.rng.random() < 0.5:  # the first job follows
            self.followers += 1
            return ["--follow", f"{self.rng.uniform(1, 2.5):.1f}", "--commit-interval", "0.3"]
        return []

    async def run(self, until: asyncio.Event) -> None:
        forced = ["kill", "stop"] if self.faults else []  # at least one of each, early in the run
        started = time.monotonic()
        while not until.is_set():
            for m in self.members:
                job = self.jobs.get(m)
                if job is None or not job.running():
                    if job is not None:
                        self.results.append(job.wait(5))
                    self.jobs[m] = self._start(m)
            now = time.monotonic()
            for job, since in list(self.suspended):
                if now - since > 6:  # past the pin's priority timeout (5 s)
                    job.signal(signal.SIGCONT)
                    self.suspended.remove((job, since))
            due = forced and now - started > 1.0 + 1.5 * (2 - len(forced))
            if due or (self.faults and self.rng.random() < 0.15):
                victim = self.jobs[self.rng.choice(self.members)]
                if victim.running() and all(victim is not j for j, _ in self.suspended):
                    kind = forced.pop(0) if due else ("kill" if self.rng.random() < 0.6 else "stop")
                    if kind == "kill":
                        victim.kill()
                        self.killed += 1
                    else:
                        victim.signal(signal.SIGSTOP)
                        self.suspended.append((victim, time.monotonic()))
                        self.stopped += 1
            await asyncio.sleep(0.25)
        for job, _ in self.suspended:
            job.signal(signal.SIGCONT)
        for job in self.jobs.values():
            r = await asyncio.to_thread(job.wait, 120)
            self.results.append(r)

    def check(self) -> None:
        for r in self.results:
            if r.returncode in (0, -9):
                assert "Traceback" not in r.output, r.describe()
                continue
            # exit 2 is allowed (a job stopped under it may find its consumer re-created)
            assert r.returncode == 2 and "Traceback" not in r.output, r.describe()


async def test_resize_while_jobs_land(nc, nats_server, member_job_zip, tmp_path, request, faults=True):
    seed = request.config.getoption("--chaos-seed", None) or random.randrange(1 << 30)
    print(f"resize test seed {seed}")
    rng = random.Random(seed)
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=4, members=("m1", "m2", "m3"))
    expected = await publish_orders(nc, "ORDERS", "g", 3000, KEYS)

    # the plan changes nothing
    code, out, err = await _cg(url, "resize", "ORDERS", "g", "--max-members", "6", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["new_partitions"] == {"m1": [0, 1], "m2": [2, 3], "m3": [4, 5]} and plan["state"] == "planned"
    assert (await ConsumerGroups(nc).get("ORDERS", "g")).config.max_members == 4

    done = asyncio.Event()
    runner = Runner(member_job_zip, tmp_path, url, ("m1", "m2", "m3"), rng, faults)

    async def publish_more() -> dict:
        got = {}
        for _ in range(10):
            got.update(await publish_orders(nc, "ORDERS", "g", 300, KEYS, wait_sourced=False))
            await asyncio.sleep(0.3)
        return got

    publisher = asyncio.create_task(publish_more())
    # the resize starts with the whole backlog in the old partitions; the jobs start after it
    resize = asyncio.create_task(_cg(url, "resize", "ORDERS", "g", "--max-members", "6", "--execute",
                                     "--drain-timeout", "120", "--json"))
    await asyncio.sleep(rng.uniform(0.2, 1.0))
    running = asyncio.create_task(runner.run(done))
    try:
        code, out, err = await resize
        assert code == 0, err
        result = json.loads(out)
        assert result["state"] == "done" and result["cut"] >= 3000 and result["max_members"] == 4
        expected.update(await publisher)
        # let the members land what was sourced after the switch
        api = JsApi(nc)
        deadline = time.monotonic() + 120
        while True:
            si = await api.stream_info("ORDERS-g")
            if int(si["state"]["messages"]) == 0 and int(si["sources"][0].get("seq", 0)) >= max(
                    s for _, s in expected):
                break
            assert time.monotonic() < deadline, si["state"]
            await asyncio.sleep(0.5)
    finally:
        publisher.cancel()
        done.set()
        await running
    runner.check()
    cfg = (await ConsumerGroups(nc).get("ORDERS", "g")).config
    assert cfg.max_members == 6
    transforms = (await JsApi(nc).stream_info("ORDERS-g"))["config"]["sources"][0]["subject_transforms"]
    assert transforms[0]["dest"].startswith("{{Partition(6,1)}}")
    landed = parquet_landed(tmp_path / "lake")
    assert_exactly_once(landed, expected, resized_after=result["cut"])
    assert {r.partition for r in landed if r.origin_seq > result["cut"]} <= set(range(6))
    assert any(r.partition >= 4 for r in landed if r.origin_seq > result["cut"])
    assert runner.followers, "no follower among the jobs"
    print(f"resize test seed {seed}: {len(runner.results)} jobs ({runner.followers} followers), "
          f"{runner.killed} SIGKILLed, {runner.stopped} SIGSTOPped")


async def test_resize_bad_input_and_static_groups(nc, nats_server):
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=4, members=("m1",))
    for args, field in ((("--max-members", "0"), "max_members"), (("--max-members", "4"), "max_members"),
                        (("--max-members", "x"), "max-members"), (("--max-members", "2", "--mappings", "[1]"),
                                                                  "member_mappings[0]")):
        code, out, err = await _cg(url, "resize", "ORDERS", "g", *args, "--execute")
        assert code == 1 and err.startswith(f"cg: error: {field}: ") and err.count("\n") == 1, (args, err)
    si = await JsApi(nc).stream_info("ORDERS-g")
    assert si["config"]["sources"] and (await ConsumerGroups(nc).get("ORDERS", "g")).config.max_members == 4


async def test_a_write_left_acking_before_a_resize_lands_before_newer_messages_of_its_keys(
        nc, nats_server, member_job_zip, tmp_path):
    """m1 is SIGKILLed between its acks and its commit (its batch stays prepared, acking), the
    group is resized, and only m2 runs: keys of m1's batch are m2's now, and m2's first pin
    holder commits m1's write (fenced under the old partition count) before it lands the newer
    messages of those keys."""
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1", "m2"))
    expected = await publish_orders(nc, "ORDERS", "g", 400, KEYS)

    def job(member, env=None):
        return start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=url, stream="ORDERS", group="g",
                                member=member, sink_path=tmp_path / "lake", spark=False, env=env,
                                args=["--idle-timeout", "1", "--standby-timeout", "4"])

    r1 = await asyncio.to_thread(job("m1", {"CG_FAILPOINT": "before_commit"}).wait, 60)
    assert r1.returncode == -9, r1.describe()
    r2 = await asyncio.to_thread(job("m2").wait, 60)
    assert r2.returncode == 0 and r2.summary["rows_written"] > 0, r2.describe()
    assert int((await JsApi(nc).stream_info("ORDERS-g"))["state"]["messages"]) == 0  # m1's batch was acked
    code, out, err = await _cg(url, "resize", "ORDERS", "g", "--max-members", "5", "--execute", "--json")
    assert code == 0, err
    cut = json.loads(out)["cut"]
    newer = await publish_orders(nc, "ORDERS", "g", 400, KEYS)
    r2 = await asyncio.to_thread(job("m2").wait, 60)
    assert r2.returncode == 0 and r2.summary["recovered_committed"] == 1, r2.describe()
    r1 = await asyncio.to_thread(job("m1").wait, 60)
    assert r1.returncode == 0, r1.describe()
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**expected, **newer}, resized_after=cut)


async def test_a_resize_that_did_not_drain_is_finished_by_running_it_again(nc, nats_server, member_job_zip, tmp_path):
    url = nats_server.url
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1", "m2"))
    expected = await publish_orders(nc, "ORDERS", "g", 300, KEYS)
    code, out, err = await _cg(url, "resize", "ORDERS", "g", "--max-members", "3", "--execute", "--drain-timeout", "1")
    assert code == 2 and err.startswith("cg: error: resize: the work queue still holds 300 message(s)"), err
    assert "run the same resize again" in err and err.count("\n") == 1
    code, out, err = await _cg(url, "status", "ORDERS", "g")
    assert code == 0 and "STOPPED after origin sequence 300 by a resize to 3 partitions" in out, out
    # what DAG 1 does on every run: create the group with its config (still the old one) succeeds
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
    info = await ConsumerGroups(nc).create("ORDERS", "g", ElasticGroupConfig(
        2, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2")))
    assert not info.created
    # messages published meanwhile wait in the origin
    later = await publish_orders(nc, "ORDERS", "g", 50, KEYS, wait_sourced=False)
    for m in ("m1", "m2"):  # the members drain the old partitions
        r = await asyncio.to_thread(start_member_job(
            member_job_zip, tmp_path / "jobs", nats_servers=url, stream="ORDERS", group="g", member=m,
            sink_path=tmp_path / "lake", spark=False, args=["--idle-timeout", "1"]).wait, 60)
        assert r.returncode == 0, r.describe()
    code, out, err = await _cg(url, "resize", "ORDERS", "g", "--max-members", "3", "--execute", "--json")
    assert code == 0 and json.loads(out)["state"] == "done", err
    code, out, err = await _cg(url, "resize", "ORDERS", "g", "--max-members", "3")
    assert code == 1 and "has 3 partitions already" in err
    for m in ("m1", "m2"):
        r = await asyncio.to_thread(start_member_job(
            member_job_zip, tmp_path / "jobs", nats_servers=url, stream="ORDERS", group="g", member=m,
            sink_path=tmp_path / "lake", spark=False, args=["--idle-timeout", "1"]).wait, 60)
        assert r.returncode == 0, r.describe()
    assert_exactly_once(parquet_landed(tmp_path / "lake"), {**expected, **later}, resized_after=300)
