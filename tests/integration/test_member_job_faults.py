"""Faults around the member job's two-phase batches: SIGKILL at each step of a batch (failpoints,
through a real ``spark-submit``), an unpin mid-run, a job suspended past ack wait while another
instance takes over, and a nats-server restart mid-batch (the same entry point as a plain Python
driver, ``--no-spark``: raw payloads and the same protocol, without a JVM per job). Afterwards
nothing is lost and nothing is duplicated in the sink, and the work-queue stream is empty."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

GROUP = "g1"


def start_driver_job(*args, **kwargs):
    """``start_member_job`` without Spark (``--no-spark``): faults here are the protocol's."""
    return start_member_job(*args, spark=False, **kwargs)


async def _wait(*jobs, timeout: float = 240.0):
    return await asyncio.to_thread(lambda: [job.wait(timeout) for job in jobs])


def _ok(result) -> dict:
    assert result.returncode == 0, result.describe()
    assert result.summary is not None, result.describe()
    return result.summary


async def _wait_for_progress(nc, job, stream: str, below: int, timeout: float = 90.0) -> int:
    """Wait until the job acked something (the WQ stream holds fewer than ``below``) while it
    still runs and messages are left; return the WQ count then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = await wq_messages(nc, stream, GROUP)
        if 0 < left < below:
            assert job.running(), job.result().describe()
            return left
        assert job.running(), "the job ended before the fault could be injected:\n" + job.result().describe()
        await asyncio.sleep(0.02)
    raise AssertionError("the job made no progress:\n" + job.result().describe())


async def test_sigkill_at_each_step_of_a_batch_then_rerun(nc, nats_server, member_job_zip, tmp_path):
    """(a) after prepare -> rolled back; (b) mid-ack and (c) after acks, before commit -> committed."""
    # batch 500: a consumer the job creates for an elastic member is orbit's (server default
    # max_ack_pending 1000) and a batch read through it is at most half of that
    n, batch = 3_000, 500
    cases = {"after_prepare": "A", "mid_ack": "B", "before_commit": "C"}
    expected = {}
    for point, stream in cases.items():
        await create_group(nc, stream, GROUP, partitions=2, members=("m1",), subjects_prefix=stream.lower())
        expected[point] = await publish_orders(nc, stream, GROUP, n, 30, subjects_prefix=stream.lower())
    args = ["--batch-size", str(batch), "--ack-wait", "3", "--standby-timeout", "20"]

    def job(point, failpoint):
        stream = cases[point]
        # mid_ack: through the consumer, whose acks go partition by partition (a member that
        # owns the whole work-queue stream acks a batch with one purge: no "mid" there; see
        # test_sigkill_between_two_partition_purges_then_rerun for the direct-read path)
        read = ["--read", "consumer"] if point == "mid_ack" else []
        return start_member_job(member_job_zip, tmp_path / point, nats_servers=nats_server.url, stream=stream,
                                group=GROUP, member="m1", sink_path=tmp_path / point / "lake", args=[*args, *read],
                                env={"CG_FAILPOINT": failpoint} if failpoint else None)

    crashed = await _wait(*(job(p, p) for p in cases))
    for point, r in zip(cases, crashed, strict=True):
        assert r.returncode != 0 and r.summary is None, r.describe()
        assert f"cg failpoint {point}" in r.output, r.describe()
        assert parquet_landed(tmp_path / point / "lake") == [], f"{point}: rows visible before commit"
    left = {p: await wq_messages(nc, cases[p], GROUP) for p in cases}
    assert left["after_prepare"] == n  # no ack sent
    assert n - batch < left["mid_ack"] < n  # the first of the batch's two partitions acked
    assert left["before_commit"] == n - batch  # the whole first batch acked

    reruns = await _wait(*(job(p, None) for p in cases))
    summaries = {p: _ok(r) for p, r in zip(cases, reruns, strict=True)}
    for point, s in summaries.items():
        assert s["result"] == "committed", (point, s)
        assert_exactly_once(parquet_landed(tmp_path / point / "lake"), expected[point])
        assert await wq_messages(nc, cases[point], GROUP) == 0, point
    a, b, c = summaries["after_prepare"], summaries["mid_ack"], summaries["before_commit"]
    assert (a["recovered_aborted"], a["recovered_committed"]) == (1, 0), a
    assert a["rows_written"] == n and a["duplicates_skipped"] == 0, a
    assert (b["recovered_aborted"], b["recovered_committed"]) == (0, 1), b
    # the recovered batch landed all its rows; its unacked part came back and was acked as
    # landed at once (no second write of it). What the rerun reads: every message after the
    # crashed batch, and of that batch at most what was left unacked (an ack the killed job had
    # sent but the server had not taken yet comes back too: two of them once, under load)
    assert b["rows_written"] == n and b["duplicates_skipped"] == 0, b
    assert n - batch <= b["messages_read"] <= left["mid_ack"], (b["messages_read"], left["mid_ack"])
    assert (c["recovered_aborted"], c["recovered_committed"]) == (0, 1), c
    assert c["rows_written"] == n and c["messages_read"] == n - batch and c["duplicates_skipped"] == 0, c


async def test_sigkill_between_two_partition_purges_then_rerun(nc, nats_server, member_job_zip, tmp_path):
    """m1 holds 2 of its group's 3 partitions: it reads them by filtered direct gets and acks a
    batch with one purge per partition. Killed after the first purge of its first batch (before
    commit), the rerun commits that batch in recovery and re-reads (as duplicates) only what the
    second purge would have removed; m2's partition is untouched."""
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, MemberMapping, PartitioningFilter
    from airflow_provider_cg.core.groups.partitioning import partition_of

    n, batch = 3_000, 1_000
    await nc.jetstream().add_stream(name="D", subjects=["d.*"])
    await ConsumerGroups(nc).create("D", GROUP, ElasticGroupConfig(
        3, (PartitioningFilter("d.*", (1,)),), member_mappings=(MemberMapping("m1", (0, 1)), MemberMapping("m2", (2,)))))
    expected = await publish_orders(nc, "D", GROUP, n, 30, subjects_prefix="d")
    mine = {k: key for k, key in expected.items() if partition_of(f"d.{key}", 3, (1,), "d.*") in (0, 1)}
    theirs = n - len(mine)
    assert 0 < theirs < n / 2 < len(mine)
    args = ["--batch-size", str(batch), "--ack-wait", "3", "--standby-timeout", "20"]
    lake = tmp_path / "lake"

    def job(failpoint=None):
        return start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="D", group=GROUP,
                                member="m1", sink_path=lake, args=args,
                                env={"CG_FAILPOINT": failpoint} if failpoint else None)

    (crashed,) = await _wait(job("mid_ack"))
    assert crashed.returncode != 0 and "cg failpoint mid_ack" in crashed.output, crashed.describe()
    assert parquet_landed(lake) == []
    left = await wq_messages(nc, "D", GROUP)
    purged = n - left
    assert 0 < purged < batch, left  # one partition's share of the batch
    (rerun,) = await _wait(job())
    s = _ok(rerun)
    assert (s["recovered_aborted"], s["recovered_committed"]) == (0, 1), s
    assert s["rows_written"] == len(mine) and s["messages_read"] == len(mine) - purged, s
    assert s["duplicates_skipped"] == batch - purged, s  # the unpurged part of the recovered batch
    assert_exactly_once(parquet_landed(lake), mine)
    assert await wq_messages(nc, "D", GROUP) == theirs


async def test_step_down_mid_run_then_second_run_finishes(nc, nats_server, member_job_zip, tmp_path):
    n = 20_000
    await create_group(nc, "O", GROUP, partitions=2, members=("m1",), subjects_prefix="o")
    expected = await publish_orders(nc, "O", GROUP, n, 100, subjects_prefix="o")
    lake = tmp_path / "lake"
    args = ["--batch-size", "200"]
    first = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                             member="m1", sink_path=lake, args=args)
    await _wait_for_progress(nc, first, "O", n - 500)
    await ConsumerGroups(nc).step_down("O", GROUP, "m1")
    (r1,) = await _wait(first)
    s1 = _ok(r1)
    assert s1["stop_reason"] == "pin lost", s1
    assert 0 < s1["messages_read"] < n and s1["batches"] >= 2, s1

    second = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                              member="m1", sink_path=lake, args=[*args, "--batch-size", "5000"])
    (r2,) = await _wait(second)
    s2 = _ok(r2)
    assert s2["result"] == "committed" and s2["pin_id"] != s1["pin_id"], s2
    assert_exactly_once(parquet_landed(lake), expected)
    assert s1["rows_written"] + s2["rows_written"] == n
    assert await wq_messages(nc, "O", GROUP) == 0


async def test_suspended_past_ack_wait_while_another_instance_takes_over(nc, nats_server, member_job_zip, tmp_path):
    n = 20_000
    await create_group(nc, "O", GROUP, partitions=2, members=("m1",), subjects_prefix="o")
    expected = await publish_orders(nc, "O", GROUP, n, 100, subjects_prefix="o")
    lake = tmp_path / "lake"
    args = ["--batch-size", "200", "--ack-wait", "3", "--standby-timeout", "60"]
    first = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                             member="m1", sink_path=lake, args=args)
    try:
        await _wait_for_progress(nc, first, "O", n - 500)
        first.suspend()
        left_at_stop = await wq_messages(nc, "O", GROUP)
        second = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                                  member="m1", sink_path=lake, args=[*args, "--batch-size", "5000"])
        (r2,) = await _wait(second)
        assert first.running(), "the suspended instance must still be there"
    finally:
        first.resume()
    (r1,) = await _wait(first)
    s1, s2 = _ok(r1), _ok(r2)
    assert s2["result"] == "committed" and s2["pin_id"] != s1["pin_id"], s2
    assert s2["messages_read"] >= left_at_stop - 1_000, (left_at_stop, s2)  # it took over the rest
    assert s1["stop_reason"] in ("pin lost", "taken over by another instance"), s1
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, "O", GROUP) == 0


async def test_nats_server_restart_mid_batch(nc, nats_server, member_job_zip, tmp_path):
    n = 20_000
    await create_group(nc, "O", GROUP, partitions=2, members=("m1",), subjects_prefix="o")
    expected = await publish_orders(nc, "O", GROUP, n, 100, subjects_prefix="o")
    lake = tmp_path / "lake"
    args = ["--batch-size", "200", "--ack-wait", "10", "--standby-timeout", "30"]
    job = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                           member="m1", sink_path=lake, args=args)
    await _wait_for_progress(nc, job, "O", n - 500)
    await asyncio.to_thread(nats_server.restart)
    (r1,) = await _wait(job)
    results = [r1]
    if r1.returncode != 0 or await wq_messages(nc, "O", GROUP) > 0:
        rerun = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                                 member="m1", sink_path=lake, args=args)
        results += await _wait(rerun)
        _ok(results[-1])
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, "O", GROUP) == 0
    print("restart: first run", r1.returncode, r1.summary, "reruns:", len(results) - 1)


@pytest.mark.parametrize("point", ["after_prepare", "mid_prepare"])
async def test_suspended_in_prepare_its_write_is_rolled_back_by_the_new_instance(
        nc, nats_server, member_job_zip, tmp_path, point):
    """The stalled instance (stopped after or in the middle of its prepare) resumes to find its
    write rolled back: it sends no ack and stops cleanly instead of crashing; the new pin
    holder landed everything once."""
    n = 5_000
    await create_group(nc, "O", GROUP, partitions=2, members=("m1",), subjects_prefix="o")
    expected = await publish_orders(nc, "O", GROUP, n, 100, subjects_prefix="o")
    lake = tmp_path / "lake"
    args = ["--batch-size", "1000", "--ack-wait", "3", "--standby-timeout", "60"]
    first = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                             member="m1", sink_path=lake, args=args, env={"CG_FAILPOINT": f"stop:{point}"})
    try:
        assert await asyncio.to_thread(first.wait_for_log, f"cg failpoint stop:{point}: suspending"), \
            first.result().describe()
        assert first.running()
        second = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream="O", group=GROUP,
                                  member="m1", sink_path=lake, args=args)
        (r2,) = await _wait(second)
        assert first.running()
    finally:
        first.resume()
    (r1,) = await _wait(first)
    s1, s2 = _ok(r1), _ok(r2)
    # a half-prepared write is not reported as recovered: it is dropped as never prepared
    protocol_lines = "\n".join(line for r in (r1, r2) for line in r.stderr.splitlines()
                               if "cg recovery" in line or "cg batch" in line or "cg failpoint" in line)
    assert (s2["recovered_aborted"], s2["recovered_committed"]) == (int(point == "after_prepare"), 0), \
        f"{s2}\n{protocol_lines}"
    assert s2["rows_written"] == n and s2["result"] == "committed", s2
    assert s1["rows_written"] == 0 and s1["stop_reason"] in ("taken over by another instance", "pin lost"), s1
    lost = "was rolled back by another instance" if point == "after_prepare" else "was removed by another instance"
    assert lost in r1.output, r1.describe()
    assert_exactly_once(parquet_landed(lake), expected)
    assert await wq_messages(nc, "O", GROUP) == 0


class _StandbyBehindAHolder:
    """A group whose member m1 is pinned by another instance (kept pinned), and our job for m1
    started against it, waiting as a standby."""

    async def start(self, nc, nats_server, member_job_zip, tmp_path, stream: str):
        from airflow_provider_cg.core.jetstream.client import PriorityClient

        await create_group(nc, stream, GROUP, partitions=2, members=("m1", "m2"), subjects_prefix=stream.lower())
        await publish_orders(nc, stream, GROUP, 200, 10, subjects_prefix=stream.lower())
        self.groups = ConsumerGroups(nc)
        self.stream, self.consumer = await self.groups.ensure_member_consumer(stream, GROUP, "m1", ack_wait=30,
                                                                              max_ack_pending=1000)
        self.holder = PriorityClient(nc, self.stream, self.consumer)
        assert await self.holder.pull(1, expires=2) and self.holder.is_pinned
        self.keep = asyncio.create_task(_keep_pinned(self.holder))
        self.job = start_driver_job(member_job_zip, tmp_path, nats_servers=nats_server.url, stream=stream,
                                    group=GROUP, member="m1", sink_path=tmp_path / "lake",
                                    args=["--standby-timeout", "60"])
        assert await asyncio.to_thread(self.job.wait_for_log, "for the pin", 120), self.job.result().describe()
        return self

    async def stop_holder(self) -> None:
        self.keep.cancel()
        await self.holder.close()


async def test_standby_whose_consumer_is_deleted_ends_revoked(nc, nats_server, member_job_zip, tmp_path):
    """Another instance holds m1's pin; our job waits as a standby; m1 is dropped from the
    group (the pinned instance's consumer is left to that instance), then its consumer is
    deleted: the job ends with result "revoked", exit 0, no traceback, nothing landed."""
    w = await _StandbyBehindAHolder().start(nc, nats_server, member_job_zip, tmp_path, "R")
    try:
        assert await asyncio.to_thread(w.job.wait_for_log, "cg pinned", 2) is False  # a standby
        assert w.job.running(), w.job.result().describe()
        await w.groups.drop_members("R", GROUP, ["m1"])
        assert await JsApi(nc).consumer_info(w.stream, w.consumer) is not None  # its pinned instance's to hand over
        (r,) = await _wait(w.job)
    finally:
        await w.stop_holder()
    s = _ok(r)
    assert s["result"] == "revoked" and "membership changed" in s["stop_reason"], s
    assert "Traceback" not in r.output, r.describe()
    assert parquet_landed(tmp_path / "lake") == []


async def test_a_job_whose_consumer_is_deleted_while_it_waits_joins_again(nc, nats_server, member_job_zip, tmp_path):
    """Still a member, its consumer deleted before it landed anything (an inactivity
    threshold that ran out while it started, or an instance of another tool replacing it): the
    job joins again (re-creates the consumer), takes the pin and lands everything; not revoked."""
    w = await _StandbyBehindAHolder().start(nc, nats_server, member_job_zip, tmp_path, "J")
    try:
        await w.stop_holder()
        await JsApi(nc).delete_consumer(w.stream, w.consumer)
        (r,) = await _wait(w.job)
    finally:
        await w.stop_holder()
    s = _ok(r)
    assert s["result"] == "committed", s
    assert "joining again" in r.output and "Traceback" not in r.output, r.describe()
    m1_messages = sum(1 for row in parquet_landed(tmp_path / "lake") if row.partition == 0)
    assert m1_messages == s["messages_read"] > 0


async def _keep_pinned(client) -> None:
    while True:
        await asyncio.sleep(1)
        await client.keep_pin()


async def test_sigkill_at_each_step_of_a_static_batch_read_by_direct_gets(nc, nats_server, member_job_zip, tmp_path):
    """A static member read by direct gets, its batch acknowledged by moving its durable:
    killed after prepare (nothing moved: rolled back), right after the move (mid_ack) and
    before commit (moved: committed by the next run's recovery). The rerun lands the rest from
    the durable's position; every message once, in order, the durable ending with nothing
    pending. The plain Python driver: the protocol is the same under Spark."""
    from airflow_provider_cg.core.groups.config import StaticGroupConfig
    from airflow_provider_cg.core.jetstream.publish import publish_many

    n, batch = 2_000, 500
    api = JsApi(nc)
    cases = {"after_prepare": "SA", "mid_ack": "SB", "before_commit": "SC"}
    expected = {}
    for point, stream in cases.items():
        prefix = stream.lower()
        await api.add_stream({"name": stream, "subjects": [f"{prefix}.*"], "allow_direct": True, "subject_transform": {
            "src": f"{prefix}.*", "dest": f"{{{{Partition(2,1)}}}}.{prefix}.{{{{Wildcard(1)}}}}"}})
        await ConsumerGroups(nc).create(stream, GROUP, StaticGroupConfig(2, (f"{prefix}.*",), members=("m1",)))
        res = await publish_many(nc, ((f"{prefix}.k{i % 30}", b"{}") for i in range(n)))
        expected[point] = {(stream, res.first_seq + i): f"{prefix}.k{i % 30}" for i in range(n)}

    def job(point, failpoint):
        return start_member_job(member_job_zip, tmp_path / point, nats_servers=nats_server.url, stream=cases[point],
                                group=GROUP, member="m1", sink_path=tmp_path / point / "lake", spark=False,
                                args=["--batch-size", str(batch), "--ack-wait", "3", "--standby-timeout", "20"],
                                env={"CG_FAILPOINT": failpoint} if failpoint else None)

    async def pending(point) -> int:
        info = await api.consumer_info(cases[point], f"{GROUP}-m1")
        return int(info["num_pending"]) + int(info["num_ack_pending"])

    crashed = await _wait(*(job(p, p) for p in cases))
    for point, r in zip(cases, crashed, strict=True):
        assert r.returncode != 0 and f"cg failpoint {point}" in r.output, r.describe()
        assert parquet_landed(tmp_path / point / "lake") == [], f"{point}: rows visible before commit"
    assert await pending("after_prepare") == n  # the durable was not moved
    assert await pending("mid_ack") == await pending("before_commit") == n - batch  # moved past the batch

    reruns = await _wait(*(job(p, None) for p in cases))
    summaries = {p: _ok(r) for p, r in zip(cases, reruns, strict=True)}
    for point, s in summaries.items():
        assert s["result"] == "committed" and s["read_path"] == "direct", (point, s)
        assert_exactly_once(parquet_landed(tmp_path / point / "lake"), expected[point])
        assert await pending(point) == 0, point
    a = summaries["after_prepare"]
    assert (a["recovered_aborted"], a["recovered_committed"], a["messages_read"]) == (1, 0, n), a
    for point in ("mid_ack", "before_commit"):
        s = summaries[point]
        assert (s["recovered_aborted"], s["recovered_committed"]) == (0, 1), s
        assert s["rows_written"] == n and s["messages_read"] == n - batch and s["duplicates_skipped"] == 0, s
