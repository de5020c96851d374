"""Sharing one member between our member job and orbit v0.2.1's own instances: its real ``cg``
CLI (``consume``: ack wait 2 s, ``max_ack_pending`` 1) and a consumer on its real library at
its defaults (``tests/support/orbit_library``), both built from orbit's source.

In every order the invariant is the same: every message is processed once, by orbit (its log
of double-acked messages) or by us (the lake), never by both, and what we land is in per-key
order. Where a consumer config lets orbit adopt ours, orbit must not replace it. Where it
cannot (orbit's CLI beside a job at the library's defaults: orbit deletes and re-creates the
consumer, which no config of ours can stop), our job must notice before its ack and roll the
batch back.

Our job runs as the plain Python driver (``spark=False``): the protocol is the same.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
)
from tests.support.orbit import OrbitCli, build_orbit_cg_source, build_orbit_library_program, stop
from tests.support.prebuild import built

pytestmark = [pytest.mark.integration]

KEYS = 30
MESSAGES = 300
#: what orbit's CLI gives the consumers it creates; our job creates the same with these options
ORBIT_CLI_OPTIONS = ("--ack-wait", "2", "--max-ack-pending", "1")


@pytest.fixture(scope="session")
def orbit_cli_binary():
    return built(build_orbit_cg_source)


@pytest.fixture(scope="session")
def orbit_library_binary():
    return built(build_orbit_library_program)


class Peer:
    """One running orbit instance of member m1 and what it reports it processed."""

    def __init__(self, kind: str, proc: subprocess.Popen, log: Path) -> None:
        self.kind, self.proc, self.log = kind, proc, log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def acked_origin_seqs(self) -> set[int]:
        return self.outcomes()[0]

    def outcomes(self) -> tuple[set[int], set[int]]:
        """(messages orbit processed and double-acked, messages it was processing when stopped:
        acked or not, unknown). The library program finishes the message in hand before it exits;
        orbit's CLI has no signal handling, so its last record may have no outcome."""
        text = self.text()
        if self.kind == "library":
            return {int(m.group(1)) for m in re.finditer(r"origin=\S+ (\d+) acked$", text, re.M)}, set()
        # the CLI prints the work-queue sequence, equal to the origin's here (one source, no gaps)
        acked, unsure = set(), set()
        records = re.split(r"(?=\[[^\]\s]+\] subject=)", text)
        for i, record in enumerate(records):
            m = re.search(r"\bseq=(\d+)", record)
            if not m:
                continue
            if re.search(r"\backed\s*$", record) and "could not" not in record:
                acked.add(int(m.group(1)))
            elif i == len(records) - 1 and "can not be acknowledged" not in record:
                unsure.add(int(m.group(1)))
        return acked, unsure

    def stop(self) -> None:
        stop(self.proc)


def _start_peer(kind: str, cli_binary, library_binary, url: str, tmp_path: Path, sleep: str = "2ms") -> Peer:
    log = tmp_path / f"orbit-{kind}-{time.monotonic_ns()}.log"
    if kind == "cli":
        cli = OrbitCli.for_server(cli_binary, url, tmp_path)
        return Peer(kind, cli.start("elastic", "--sleep", sleep, "consume", "ORDERS", "g", "m1", log=log), log)
    f = open(log, "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen([str(library_binary), url, "ORDERS", "g", "m1", sleep], stdout=f,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return Peer(kind, proc, log)


def _job(zip_path, tmp_path, url, *args, env=None):
    return start_member_job(zip_path, tmp_path / "jobs", nats_servers=url, stream="ORDERS", group="g", member="m1",
                            sink_path=tmp_path / "lake", spark=False, env=env,
                            args=["--idle-timeout", "2", "--standby-timeout", "10", *args])


async def _created(api: JsApi) -> str | None:
    info = await api.consumer_info("ORDERS-g", "m1")
    return info["created"] if info else None


async def _pinned(api: JsApi) -> str | None:
    info = await api.consumer_info("ORDERS-g", "m1")
    for g in (info or {}).get("priority_groups") or []:
        if g.get("pinned_client_id"):
            return g["pinned_client_id"]
    return None


async def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.1)


async def _resume_until_done(job, timeout: float):
    """The failpoint suspends the job at every batch's prepare: resume it until it ends."""
    deadline = time.monotonic() + timeout
    while job.running() and time.monotonic() < deadline:
        job.signal(signal.SIGCONT)
        await asyncio.sleep(0.2)
    return await asyncio.to_thread(job.wait, 5)


async def _finish(nc, api, peer: Peer, zip_path, tmp_path, url, expected, job_args=()) -> None:
    """Let the peer drain what it holds, stop it, let one more job of ours land any rest, then
    check: each message processed once, by orbit or by us, and ours in per-key order."""
    async def drained() -> bool:
        return int((await api.stream_info("ORDERS-g"))["state"]["messages"]) == 0
    try:
        await _wait_until(drained, 60, f"the work queue is drained ({peer.text()[-1500:]})")
    finally:
        peer.stop()
    last = await asyncio.to_thread(_job(zip_path, tmp_path, url, *job_args).wait, 120)
    assert last.returncode == 0, last.describe()
    _check_once(peer, parquet_landed(tmp_path / "lake"), expected)


def _check_once(peer: Peer, landed, expected) -> None:
    """Each message processed once, by orbit or by us; ours in per-key order."""
    theirs, unsure = peer.outcomes()
    ours = {r.origin_seq for r in landed}
    assert not theirs & ours, f"processed by both orbit and us: {sorted(theirs & ours)[:10]}"
    everything = {seq for (_, seq) in expected}
    assert theirs | ours <= everything and everything - theirs - ours <= unsure, (
        f"lost: {sorted(everything - theirs - ours)[:10]}, orbit's message in hand when stopped: {unsure}")
    assert_exactly_once(landed, {k: v for k, v in expected.items() if k[1] in ours})


@pytest.mark.parametrize("peer_kind,job_args,adoptable", [
    ("cli", ORBIT_CLI_OPTIONS, True),      # our consumer equals orbit CLI's: it joins it
    ("library", (), True),                 # the job's defaults are the library's
    ("cli", (), False),                    # orbit's CLI replaces a consumer of the library's config
])
async def test_our_job_first_then_orbit(nc, nats_server, member_job_zip, tmp_path, orbit_cli_binary,
                                        orbit_library_binary, peer_kind, job_args, adoptable):
    """Our job holds m1 and has a batch prepared (suspended there) when orbit's instance starts.
    An adoptable consumer is kept (same ``created``); otherwise orbit replaces it and our job,
    resumed, finds the pin gone before its ack and rolls the batch back."""
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    expected = await publish_orders(nc, "ORDERS", "g", MESSAGES, KEYS)
    api = JsApi(nc)
    job = _job(member_job_zip, tmp_path, nats_server.url, "--batch-size", "200", *job_args,
               env={"CG_FAILPOINT": "stop:after_prepare"})
    peer = None
    try:
        assert await asyncio.to_thread(job.wait_for_log, "failpoint stop:after_prepare", 60), job.wait(5).describe()
        ours_created = await _created(api)
        assert ours_created is not None
        peer = _start_peer(peer_kind, orbit_cli_binary, orbit_library_binary, nats_server.url, tmp_path)
        if adoptable:
            await asyncio.sleep(1.0)  # orbit joins at once: a create-only request, then standby pulls
            assert peer.proc.poll() is None, peer.text()
            assert await _created(api) == ours_created, "orbit replaced a consumer it could have joined"
            ours = re.search(r"cg pinned member=m1 pin_id=(\S+)", job.output_so_far())
            if ours and await _pinned(api) == ours.group(1):  # our pin has not expired while suspended
                assert not peer.acked_origin_seqs(), "orbit processed messages while our job held the pin"
        else:
            async def replaced() -> bool:
                return await _created(api) not in (None, ours_created) and await _pinned(api) is not None
            await _wait_until(replaced, 30, f"orbit replaced the consumer ({peer.text()[-1500:]})")
            async def processing() -> bool:
                return bool(peer.acked_origin_seqs())
            await _wait_until(processing, 30, "orbit processes messages")
        r = await _resume_until_done(job, 60)
        assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
        if not adoptable:
            assert "pin moved to another instance before the ack; rolling back" in r.output, r.describe()
            assert r.summary["rows_written"] == 0, r.summary
        await _finish(nc, api, peer, member_job_zip, tmp_path, nats_server.url, expected, job_args)
    finally:
        job.kill()
        if peer is not None:
            peer.stop()


@pytest.mark.parametrize("peer_kind,job_args", [("cli", ()), ("library", ())])
async def test_orbit_first_then_our_job(nc, nats_server, member_job_zip, tmp_path, orbit_cli_binary,
                                        orbit_library_binary, peer_kind, job_args):
    """orbit's instance creates and holds m1's consumer; our job uses it as it is (whatever its
    ack wait and limits), waits as a standby without replacing it, and once orbit stops lands
    the rest."""
    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    api = JsApi(nc)
    expected = await publish_orders(nc, "ORDERS", "g", MESSAGES, KEYS)
    # orbit takes 50 ms a message: 15 s for the backlog, more than the standby run below takes
    # on a loaded machine (at 20 ms one CI run saw orbit drain it all before it was stopped)
    peer = _start_peer(peer_kind, orbit_cli_binary, orbit_library_binary, nats_server.url, tmp_path, "50ms")
    try:
        await _wait_until(lambda: _pinned(api), 30, f"orbit's instance is pinned ({peer.text()[-1500:]})")
    except BaseException:
        peer.stop()
        raise
    created = await _created(api)
    try:
        standby = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server.url, "--standby-timeout", "3",
                                               *job_args).wait, 60)
        # Our job waits as a standby. Only when orbit's instance lets its pin lapse (no pull
        # within the consumer's priority timeout: on a loaded machine, a batch of orbit's at
        # 50 ms a message can outlast it) does the server hand the pin over, and our job lands
        # what orbit had not; either way orbit's consumer stays as it is.
        assert standby.returncode == 0 and standby.summary["result"] in ("not-pinned", "committed"), \
            standby.describe()
        took_over = standby.summary["result"] == "committed"
        assert await _created(api) == created, "our job replaced orbit's consumer"
        assert peer.proc.poll() is None, peer.text()[-1500:]

        async def processed_some() -> bool:
            return bool(peer.acked_origin_seqs())
        await _wait_until(processed_some, 30, f"orbit processed part of the backlog ({peer.text()[-1500:]})")
    finally:
        peer.stop()
    left = int((await api.stream_info("ORDERS-g"))["state"]["messages"])
    assert left > 0 or took_over, f"orbit processed the whole backlog before it was stopped: nothing left ({left})"
    ours = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server.url, *job_args).wait, 120)
    assert ours.returncode == 0 and ours.summary["result"] in (("committed", "empty") if took_over and not left
                                                               else ("committed",)), ours.describe()
    assert int((await api.stream_info("ORDERS-g"))["state"]["messages"]) == 0
    landed = parquet_landed(tmp_path / "lake")
    assert peer.acked_origin_seqs() and landed, (len(peer.acked_origin_seqs()), len(landed))
    _check_once(peer, landed, expected)


async def test_orbit_reads_and_consumes_a_group_after_our_reset(nc, nats_server, tmp_path, orbit_cli_binary,
                                                                orbit_library_binary):
    """After ``cg reset`` moved an elastic group back (its work queue re-sourced), orbit's CLI
    still describes the group and orbit's library consumes exactly the replayed window."""
    from airflow_provider_cg.core.tools.cli import main as our_cg

    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    expected = await publish_orders(nc, "ORDERS", "g", 200, KEYS)
    api = JsApi(nc)

    async def drained() -> bool:
        return int((await api.stream_info("ORDERS-g"))["state"]["messages"]) == 0

    first = _start_peer("library", orbit_cli_binary, orbit_library_binary, nats_server.url, tmp_path, "0s")
    try:
        await _wait_until(drained, 60, "orbit drained the group")
    finally:
        first.stop()
    assert first.acked_origin_seqs() == {seq for (_, seq) in expected}
    # a stopped instance's pin lingers up to its priority timeout: --force clears it
    code = await asyncio.to_thread(our_cg, ["reset", "ORDERS", "g", "--to-seq", "101", "--execute", "--force",
                                            "--server", nats_server.url])
    assert code == 0
    info = OrbitCli.for_server(orbit_cli_binary, nats_server.url, tmp_path).run("elastic", "info", "ORDERS", "g")
    assert "m1" in info.stdout, info.stdout
    second = _start_peer("library", orbit_cli_binary, orbit_library_binary, nats_server.url, tmp_path, "0s")
    try:
        await _wait_until(drained, 60, "orbit drained the replay")
    finally:
        second.stop()
    assert second.acked_origin_seqs() == set(range(101, 201))


async def test_a_static_member_passes_between_our_direct_reads_and_orbit(nc, nats_server, member_job_zip, tmp_path,
                                                                        orbit_cli_binary):
    """A static member read by direct gets keeps its durable where orbit expects it: orbit's CLI
    joins the durable our job created (its config, ``--ack-wait 2 --max-ack-pending 1``) and
    consumes exactly what our job did not land; then our job takes over again from where
    orbit stopped. Every message processed once, by orbit or by us; ours in per-key order."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import StaticGroupConfig
    from airflow_provider_cg.core.jetstream.publish import publish_many

    api = JsApi(nc)
    await api.add_stream({"name": "S", "subjects": ["sord.*"], "allow_direct": True, "subject_transform": {
        "src": "sord.*", "dest": "{{Partition(2,1)}}.sord.{{Wildcard(1)}}"}})
    await ConsumerGroups(nc).create("S", "g", StaticGroupConfig(2, ("sord.*",), members=("m1",)))
    res = await publish_many(nc, ((f"sord.k{i % KEYS}", b"{}") for i in range(MESSAGES)))
    expected = {("S", res.first_seq + i): f"sord.k{i % KEYS}" for i in range(MESSAGES)}

    def job(*args: str):
        return start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream="S",
                                group="g", member="m1", sink_path=tmp_path / "lake", spark=False,
                                args=["--idle-timeout", "2", "--standby-timeout", "10", *ORBIT_CLI_OPTIONS, *args])

    async def pending() -> int:
        info = await api.consumer_info("S", "g-m1")
        return int(info["num_pending"]) + int(info["num_ack_pending"])

    first = await asyncio.to_thread(job("--batch-size", "50", "--max-messages", "100").wait, 60)
    assert first.returncode == 0 and first.summary["read_path"] == "direct", first.describe()
    assert first.summary["messages_read"] == 100 and await pending() == MESSAGES - 100
    log = tmp_path / "orbit-static.log"
    peer = Peer("cli", OrbitCli.for_server(orbit_cli_binary, nats_server.url, tmp_path).start(
        "static", "--sleep", "20ms", "consume", "S", "g", "m1", log=log), log)
    try:
        async def orbit_took_some() -> bool:
            return len(peer.acked_origin_seqs()) >= 50
        await _wait_until(orbit_took_some, 30, f"orbit's CLI consumes the member ({peer.text()[-1500:]})")
    finally:
        peer.stop()
    assert "error" not in peer.text().lower(), peer.text()[-1500:]
    # orbit's stopped instance may hold its last message unacked: the job settles it through the
    # consumer this time, then lands the rest
    rest = await asyncio.to_thread(job().wait, 120)
    assert rest.returncode == 0 and "Traceback" not in rest.output, rest.describe()
    print("after orbit, our job read", rest.summary["messages_read"], "by", rest.summary["read_path"])
    assert await pending() == 0
    landed = parquet_landed(tmp_path / "lake")
    theirs = peer.acked_origin_seqs()
    assert theirs and min(theirs) == 101, sorted(theirs)[:5]  # orbit started where our job's durable stood
    _check_once(peer, landed, expected)


async def test_orbit_manages_a_partition_streams_group_but_cannot_consume_it(nc, nats_server, member_job_zip, tmp_path,
                                                                            orbit_cli_binary, orbit_library_binary):
    """In the partition-streams layout orbit's CLI still reads and changes the membership (the
    KV entry is orbit's JSON; the layout is on the work-queue stream, which orbit's writes leave
    alone), but an orbit instance finds nothing to consume: the work queue holds no partition's
    message (the partition log sources the origin). orbit v0.2.1 replaces the member's pin
    consumer with its own (other filters) and our jobs replace it back, each losing the pin
    then; nothing is processed by orbit, lost, or landed twice."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups

    await create_group(nc, "ORDERS", "g", partitions=2, members=("m1",))
    cg = ConsumerGroups(nc)
    assert (await cg.move_layout("ORDERS", "g", "partition-streams")).done
    expected = await publish_orders(nc, "ORDERS", "g", MESSAGES, KEYS, wait_sourced=False)
    orbit = OrbitCli.for_server(orbit_cli_binary, nats_server.url, tmp_path)
    orbit.run("elastic", "add", "ORDERS", "g", "m2")
    assert "m2" in orbit.run("elastic", "info", "ORDERS", "g").stdout
    assert (await cg.status("ORDERS", "g")).layout == "partition-streams"
    peer = _start_peer("library", orbit_cli_binary, orbit_library_binary, nats_server.url, tmp_path, "0s")
    api = JsApi(nc)

    def job(m: str):
        return start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream="ORDERS",
                                group="g", member=m, sink_path=tmp_path / "lake", spark=False,
                                args=["--idle-timeout", "1", "--standby-timeout", "10", "--batch-size", "40"])
    try:
        from airflow_provider_cg.core.groups.layouts.partition_streams import work_queue_left

        await asyncio.sleep(2)
        assert not any((await work_queue_left(api, "ORDERS-g", range(2))).values())  # nothing there for orbit
        for _ in range(2):  # beside the orbit instance
            for r in await asyncio.gather(*(asyncio.to_thread(job(m).wait, 120) for m in ("m1", "m2"))):
                assert r.returncode in (0, 2), r.describe()
    finally:
        peer.stop()
    assert not peer.acked_origin_seqs(), peer.text()[-2000:]
    for m in ("m1", "m2"):  # what is left, without it
        r = await asyncio.to_thread(job(m).wait, 120)
        assert r.returncode == 0, r.describe()
    assert (await cg.status("ORDERS", "g")).backlog == 0
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
