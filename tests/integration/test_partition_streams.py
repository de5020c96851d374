"""The ``partition-streams`` layout (``core/groups/layouts/``) on a real nats-server: member jobs
land it exactly once and in per-key order, the partition log holds every message until it is
landed, status and lag count it, a partition stream that lost messages is named and rebuilt
from the log before anything newer of it lands, a group moves between layouts under running
jobs with nothing lost or landed twice, and what the layout does not do yet is refused with the
way there. (``test_lost_disk.py``: a server's disk lost for good on a cluster.)"""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.errors import ConfigError, ServerUnavailable
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.groups.lag import group_lag
from airflow_provider_cg.core.groups.layouts import partition_streams as grouplayout
from airflow_provider_cg.core.groups.reset import GroupReset
from airflow_provider_cg.core.groups.reset_plan import ResetTarget
from airflow_provider_cg.core.groups.resize import GroupResize
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.tools.cli import main as cg_main
from tests.support.member_job import (
    assert_exactly_once,
    parquet_landed,
    publish_orders,
    run_member_job,
    start_member_job,
)

STREAM, GROUP = "ORD", "g"
JOB = ["--batch-size", "700", "--ack-wait", "3", "--idle-timeout", "1", "--standby-timeout", "5"]


async def _group(nc, partitions: int, members, layout: str = grouplayout.PARTITION_STREAMS):
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    return await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
        partitions, (PartitioningFilter("orders.*", (1,)),), members=tuple(members)), layout=layout)


async def _partition_totals(nc, partitions: int) -> dict[int, int]:
    return await grouplayout.partition_streams_left(JsApi(nc), f"{STREAM}-{GROUP}", partitions)


def _drain(zip_path, workdir, nats_server, lake, members, rounds: int = 3) -> None:
    for _ in range(rounds):
        for m in members:
            r = run_member_job(zip_path, workdir, nats_servers=nats_server.url, stream=STREAM, group=GROUP, member=m,
                               sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
            assert r.returncode == 0, r.describe()


async def test_members_land_their_partition_streams_exactly_once(nc, nats_server, member_job_zip, tmp_path):
    await _group(nc, 6, ("m1", "m2", "m3"))
    api = JsApi(nc)
    wq = f"{STREAM}-{GROUP}"
    wq_cfg = (await api.stream_info(wq))["config"]
    assert layouts.of(wq_cfg).name == grouplayout.PARTITION_STREAMS
    expected = await publish_orders(nc, STREAM, GROUP, 6000, 300, wait_sourced=False)
    for _ in range(100):  # the mirrors move everything out of the work queue
        if sum((await _partition_totals(nc, 6)).values()) == 6000:
            break
        await asyncio.sleep(0.1)
    per_stream = await _partition_totals(nc, 6)
    assert sum(per_stream.values()) == 6000 and all(per_stream.values()), per_stream
    # every partition stream holds only its partition, with the work queue's sequences and the origin's header
    msg = await api.next_msg(grouplayout.partition_stream(wq, 4), 1, ">")
    assert msg["subject"].startswith("4.orders.")

    st = await ConsumerGroups(nc).status(STREAM, GROUP)
    assert st.layout == grouplayout.PARTITION_STREAMS and st.backlog == 6000
    lag = await group_lag(nc, STREAM, GROUP, status=st)
    assert all(m.oldest_pending_age_s is not None for m in lag.members)

    lake = tmp_path / "lake"
    jobs = [start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream=STREAM,
                             group=GROUP, member=m, sink="parquet", sink_path=lake, args=JOB, spark=False)
            for m in ("m1", "m2", "m3")]
    for j in jobs:
        r = j.wait(120)
        assert r.returncode == 0, r.describe()
        assert r.summary["read_path"] == "direct", r.summary
    _drain(member_job_zip, tmp_path / "jobs", nats_server, lake, ("m1", "m2", "m3"), rounds=1)
    assert_exactly_once(parquet_landed(lake), expected)
    assert sum((await _partition_totals(nc, 6)).values()) == 0
    assert (await ConsumerGroups(nc).status(STREAM, GROUP)).backlog == 0

    # the log sources the origin (the work queue holds only pin anchors) and kept every message until landed
    assert not (await api.stream_info(wq))["config"].get("sources")
    assert (await api.stream_info(grouplayout.partition_log(wq)))["state"]["messages"] == 0


async def test_a_partition_stream_that_lost_messages_is_named_and_rebuilt_from_the_log(nc, nats_server, member_job_zip,
                                                                                      tmp_path):
    """A partition stream made again empty under its mirror (what a server that lost its store
    does: the stream comes back from its assignment, and the mirror goes on after what it had
    delivered) is behind its log: cg status, cg lag and the sensor's figures name it, and the
    member's job rebuilds it from the log before it lands anything newer of the partition:
    every message once, in per-key order."""
    from airflow_provider_cg.triggers.overflow import measure

    await _group(nc, 3, ("m1",))
    api, wq = JsApi(nc), f"{STREAM}-{GROUP}"
    expected = await publish_orders(nc, STREAM, GROUP, 1500, 60)
    for _ in range(100):
        if sum((await _partition_totals(nc, 3)).values()) == 1500:
            break
        await asyncio.sleep(0.1)
    lost = grouplayout.partition_stream(wq, 1)
    held = (await api.stream_info(lost))["state"]["messages"]
    await _lose_partition_stream(api, wq, 1)
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 60)
    for _ in range(100):  # the new messages reach the new stream (the keys are published evenly); the old ones do not
        if (await api.stream_info(lost))["state"]["messages"] == held // 5:
            break
        await asyncio.sleep(0.1)
    assert (await api.stream_info(lost))["state"]["messages"] == held // 5
    st = await ConsumerGroups(nc).status(STREAM, GROUP)
    assert set(st.partition_problems) == {1} and "lost messages" in st.partition_problems[1], st.partition_problems
    assert st.backlog == 1800  # the log's count: what the stream lost is still to land
    assert "1" in (await group_lag(nc, STREAM, GROUP, status=st)).partition_problems
    assert "1" in measure(st)["partition_problems"]
    out = await asyncio.to_thread(cg_main_output, ["status", STREAM, GROUP, "--server", nats_server.url])
    assert f"NOT CURRENT:  partition 1's stream {lost}: lost messages" in out, out

    lake = tmp_path / "lake"
    r = run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                       member="m1", sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
    assert r.returncode == 0 and r.summary["rebuilt_partitions"] == [1], r.describe()
    assert "rebuilding it from the log" in r.output
    # again, and this time the operator rebuilds it at once: cg layout, run again in the layout
    expected |= await publish_orders(nc, STREAM, GROUP, 600, 60)
    await _lose_partition_stream(api, wq, 2)
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 60)
    assert "lost messages" in (await ConsumerGroups(nc).status(STREAM, GROUP)).partition_problems.get(2, "")
    out = await asyncio.to_thread(cg_main_output, ["layout", STREAM, GROUP, "partition-streams", "--server",
                                                   nats_server.url])
    assert "is in the partition-streams layout" in out, out
    assert not (await ConsumerGroups(nc).status(STREAM, GROUP)).partition_problems
    _drain(member_job_zip, tmp_path / "jobs", nats_server, lake, ("m1",), rounds=1)
    assert_exactly_once(parquet_landed(lake), expected)
    st = await ConsumerGroups(nc).status(STREAM, GROUP)
    assert st.backlog == 0 and not st.partition_problems, st.partition_problems


async def _lose_partition_stream(api, wq: str, p: int) -> None:
    """Partition ``p``'s stream made again empty under its mirror once the mirror acknowledged
    what it moved, as a server that lost its store makes it."""
    for _ in range(100):
        mirror = await api.consumer_info(grouplayout.partition_log(wq), f"cg-partition-{p}")
        if not mirror["num_ack_pending"] and not mirror["num_pending"]:
            break
        await asyncio.sleep(0.1)
    await api.delete_stream(grouplayout.partition_stream(wq, p))
    await api.add_stream(grouplayout.partition_stream_config((await api.stream_info(wq))["config"], p))


def cg_main_output(argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cg_main(argv)
    return buf.getvalue()


async def test_moves_between_layouts_under_running_jobs(nc, nats_server, member_job_zip, tmp_path):
    """work-queue -> partition-streams -> work-queue while jobs run and messages arrive: every
    message lands once, in per-key order."""
    await _group(nc, 4, ("m1", "m2"), layout=grouplayout.WORK_QUEUE)
    cg = ConsumerGroups(nc)
    lake = tmp_path / "lake"
    expected = await publish_orders(nc, STREAM, GROUP, 2500, 200)
    args = [*JOB, "--max-seconds", "20", "--batch-size", "300"]

    def start(m):
        return start_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream=STREAM,
                                group=GROUP, member=m, sink="parquet", sink_path=lake, args=args, spark=False)

    jobs = [start(m) for m in ("m1", "m2")]
    await asyncio.sleep(1.0)
    move = await cg.move_layout(STREAM, GROUP, grouplayout.PARTITION_STREAMS, wait=30)
    assert move.done and move.layout == grouplayout.PARTITION_STREAMS
    expected.update(await publish_orders(nc, STREAM, GROUP, 2000, 200, wait_sourced=False))
    jobs += [start(m) for m in ("m1", "m2")]
    await asyncio.sleep(1.0)
    move = await cg.move_layout(STREAM, GROUP, grouplayout.WORK_QUEUE, wait=0)  # draining: jobs land the rest
    expected.update(await publish_orders(nc, STREAM, GROUP, 1500, 200, wait_sourced=False))
    jobs += [start(m) for m in ("m1", "m2")]
    for _ in range(60):
        move = await cg.move_layout(STREAM, GROUP, grouplayout.WORK_QUEUE, wait=1)
        if move.done:
            break
        if not any(j.running() for j in jobs[-2:]):
            jobs += [start(m) for m in ("m1", "m2")]
    assert move.done, move
    for j in jobs:
        r = j.wait(120)
        assert r.returncode == 0, r.describe()
    assert (await cg.status(STREAM, GROUP)).layout == grouplayout.WORK_QUEUE
    assert await grouplayout.partition_streams_of(JsApi(nc), f"{STREAM}-{GROUP}") == []
    _drain(member_job_zip, tmp_path / "jobs", nats_server, lake, ("m1", "m2"), rounds=2)
    assert_exactly_once(parquet_landed(lake), expected)


async def test_what_the_layout_refuses_says_how(nc, nats_server, tmp_path, capsys):
    def cg(*argv: str) -> int:  # the CLI runs its own event loop
        return asyncio.to_thread(cg_main, [*argv, "--server", nats_server.url])

    await _group(nc, 3, ("m1",))
    with pytest.raises(ConfigError, match="cg layout ORD g work-queue"):
        await GroupResize(nc).plan(STREAM, GROUP, 4)
    with pytest.raises(ConfigError, match="cg layout ORD g work-queue"):
        await GroupReset(nc).plan(STREAM, GROUP, ResetTarget.parse(to_latest=True))
    with pytest.raises(ConfigError, match="partition mirrors"):
        await ConsumerGroups(nc).add_members(STREAM, GROUP, ["cg-partition-1"])
    # creating it again in the other layout names the move
    rc = await cg("create", "elastic", STREAM, GROUP, "--max-members", "3", "--filter", "orders.*", "--wildcards", "1",
                  "--members", "m1")
    assert rc == 1 and "cg layout ORD g work-queue" in capsys.readouterr().err
    rc = await cg("layout", STREAM, GROUP, "sideways")
    assert rc == 1 and "LAYOUT: invalid choice" in capsys.readouterr().err
    # the CLI moves it and status says where it is
    assert await cg("layout", STREAM, GROUP, "work-queue") == 0
    assert await cg("status", STREAM, GROUP) == 0
    assert "layout work-queue" in capsys.readouterr().out
    # deleting a group removes its partition streams too
    assert await cg("layout", STREAM, GROUP, "partition-streams") == 0
    assert len(await grouplayout.partition_streams_of(JsApi(nc), f"{STREAM}-{GROUP}")) == 3
    assert await cg("rm", STREAM, GROUP) == 0
    assert await grouplayout.partition_streams_of(JsApi(nc), f"{STREAM}-{GROUP}") == []


async def test_a_partition_stream_that_cannot_serve_is_shown_and_its_member_ends_with_exit_2(nats_cluster,
                                                                                             member_job_zip,
                                                                                             tmp_path):
    """An R3 cluster, the group moved to partition streams after its work queue moved on (the
    partition streams R1: nats-server 2.15.1 loses replicated filtered mirrors), the server
    holding one partition stream stopped: cg status, cg lag, the sensor's figures and the page
    name that stream as not current instead of showing an empty backlog, and the member's job
    ends with exit 2 naming it; with the server back, the job lands everything once."""
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from airflow_provider_cg.triggers.overflow import measure
    from airflow_provider_cg.ui.app import render
    from tests.support.member_job import create_group, wq_messages

    nc = await NatsConnectionSettings(servers=nats_cluster.urls).connect()
    urls = ",".join(nats_cluster.urls)
    lake = tmp_path / "lake"
    try:
        for _ in range(60):  # a fresh cluster elects its meta leader first
            try:
                await create_group(nc, STREAM, GROUP, partitions=3, members=("m1",), replicas=3)
                break
            except Exception:  # noqa: BLE001 - not yet
                await asyncio.sleep(0.5)
        expected = await publish_orders(nc, STREAM, GROUP, 900, 90)
        r = run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=urls, stream=STREAM, group=GROUP,
                           member="m1", sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
        assert r.returncode == 0 and await wq_messages(nc, STREAM, GROUP) == 0, r.describe()
        cg = ConsumerGroups(nc)
        with pytest.raises(ConfigError, match="partition_replicas: must be 1 on nats-server 2.15.1"):
            await cg.move_layout(STREAM, GROUP, grouplayout.PARTITION_STREAMS, partition_replicas=3)
        await cg.move_layout(STREAM, GROUP, grouplayout.PARTITION_STREAMS)  # on a work queue past sequence 1
        expected |= await publish_orders(nc, STREAM, GROUP, 900, 90, wait_sourced=False)
        api, wq = JsApi(nc), f"{STREAM}-{GROUP}"
        for _ in range(100):
            if sum((await _partition_totals(nc, 3)).values()) == 900:
                break
            await asyncio.sleep(0.1)
        infos = [await api.stream_info(grouplayout.partition_stream(wq, p)) for p in range(3)]
        assert [i["config"]["num_replicas"] for i in infos] == [1, 1, 1]
        host = next(s for s in nats_cluster.servers if s.name == infos[1]["cluster"]["leader"])
        on_host = {p for p, i in enumerate(infos) if i["cluster"]["leader"] == host.name}  # R1: one server each
        host.stop()
        try:
            for _ in range(40):  # the client reconnects to another server (it may have been on that one)
                try:
                    status = await cg.status(STREAM, GROUP)
                    break
                except ServerUnavailable:
                    await asyncio.sleep(0.5)
            assert set(status.partition_problems) == on_host, status  # those streams, and only those
            lag = await group_lag(nc, STREAM, GROUP, status=status)
            assert "1" in lag.partition_problems
            assert "1" in measure(status)["partition_problems"]  # the sensor's and trigger's figures
            page = render(["nats"], "nats", [lag.to_dict()], None)
            assert "partition 1: its stream is not current" in page
            out = await asyncio.to_thread(
                __import__("subprocess").run, [__import__("sys").executable, "-m", "airflow_provider_cg.core.tools.cli",
                                               "status", STREAM, GROUP, "--server", urls],
                capture_output=True, text=True, timeout=60)
            assert f"NOT CURRENT:  partition 1's stream {wq}-p1" in out.stdout, out.stdout + out.stderr
            r = run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=urls, stream=STREAM, group=GROUP,
                               member="m1", sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
            assert r.returncode == 2, r.describe()
            first = min(on_host)
            assert f"partition {first}'s stream {wq}-p{first} is not current" in r.output, r.describe()
            assert "Traceback" not in r.output
        finally:
            host.start()
        for _ in range(3):
            r = run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=urls, stream=STREAM, group=GROUP,
                               member="m1", sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
            assert r.returncode == 0, r.describe()
            if not sum((await _partition_totals(nc, 3)).values()):
                break
        assert_exactly_once(parquet_landed(lake), expected)
    finally:
        await nc.close()


async def test_a_group_an_earlier_version_moved_to_partition_streams_moves_back(nc, nats_server, member_job_zip,
                                                                               tmp_path):
    """Made as the previous version made it (partition streams mirroring the work queue through
    consumers on it, no partition log): this version's jobs land what its streams hold, and
    cg layout work-queue drains it back; every message once, in per-key order."""
    await _group(nc, 3, ("m1",), layout=grouplayout.WORK_QUEUE)
    api, wq = JsApi(nc), f"{STREAM}-{GROUP}"
    await grouplayout.PARTITION_STREAMS_LAYOUT.record(api, wq)  # the earlier version's shape, by hand
    wq_cfg = (await api.stream_info(wq))["config"]
    for p in range(3):
        await api.create_consumer(wq, grouplayout.mirror_consumer_config(p, wq))
        cfg = grouplayout.partition_stream_config(wq_cfg, p)
        await api.add_stream({**cfg, "mirror": {**cfg["mirror"], "name": wq}})
    expected = await publish_orders(nc, STREAM, GROUP, 900, 30)
    for _ in range(100):
        if sum((await _partition_totals(nc, 3)).values()) == 900:
            break
        await asyncio.sleep(0.1)
    st = await ConsumerGroups(nc).status(STREAM, GROUP)
    assert st.backlog == 900 and not st.partition_problems, (st.backlog, st.partition_problems)
    lake = tmp_path / "lake"
    r = run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream=STREAM, group=GROUP,
                       member="m1", sink="parquet", sink_path=lake, args=JOB, spark=False, timeout=120)
    assert r.returncode == 0 and r.summary["messages_read"] == 900, r.describe()
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 30, wait_sourced=False)
    move = await ConsumerGroups(nc).move_layout(STREAM, GROUP, grouplayout.WORK_QUEUE, wait=5)
    if not move.done:  # what the streams took of the new messages: landed by a job, then the move goes on
        _drain(member_job_zip, tmp_path / "jobs", nats_server, lake, ("m1",), rounds=1)
        move = await ConsumerGroups(nc).move_layout(STREAM, GROUP, grouplayout.WORK_QUEUE, wait=30)
    assert move.done, move
    assert await grouplayout.partition_streams_of(api, wq) == []
    _drain(member_job_zip, tmp_path / "jobs", nats_server, lake, ("m1",), rounds=2)
    assert_exactly_once(parquet_landed(lake), expected)
