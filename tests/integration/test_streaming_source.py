"""The ``cg_member`` Structured Streaming source (``core/streaming/``) under real ``spark-submit``
of a user's application (``tests/apps/streaming_app.py``) over a real nats-server: a query whose
pin is taken stops and writes nothing after; orbit's ``cg`` consumes another member of the same
group beside a query; a static member read by available-now runs, its durable moved. The
restarts from a checkpoint and the writers sharing a table are ``test_streaming_writers.py``'s."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.member_job import assert_exactly_once, delta_landed, read_delta
from tests.support.streaming import (
    CUSTOMERS,
    STREAM,
    Publisher,
    start_streaming_app,
    wq_left,
)

pytestmark = [pytest.mark.integration]


async def test_a_query_whose_pin_is_taken_stops_and_writes_nothing_after(nc, nats_server, member_job_zip, tmp_path):
    """A member's pin is moved to another instance while its query runs: the query stops with
    an error naming the pin, its table gets no version after the move, and nothing it had not
    committed is acknowledged: the new holder lands it (here the member job, into its own
    table), so every message is in one of the two tables."""
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, "g", ElasticGroupConfig(2, (PartitioningFilter("orders.*", (1,)),),
                                                                    members=("m1",)))
    raw = str(tmp_path / "raw")
    pub = Publisher(nats_server.url, 6_000, 400.0)
    pub.start()
    app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=[
        "--stream", STREAM, "--raw", f"g:m1:{raw}", "--checkpoints", str(tmp_path / "ck"), "--trigger", "1",
        "--option", "maxMessagesPerTrigger=500"])
    deadline = time.monotonic() + 120
    log = tmp_path / "raw" / "_delta_log"
    while not (log.exists() and any(log.glob("*.json"))) or len(read_delta(raw, ["origin_seq"])) < 1000:
        assert app.running() and time.monotonic() < deadline, app.result().describe()
        await asyncio.sleep(0.5)
    from tests.support.member_job import start_member_job

    standby = start_member_job(member_job_zip, tmp_path / "job", nats_servers=nats_server.url, stream=STREAM,
                               group="g", member="m1", sink="parquet", sink_path=tmp_path / "lake", spark=False,
                               args=["--standby-timeout", "60", "--idle-timeout", "3", "--batch-size", "500"])
    await asyncio.sleep(2.0)  # the standby pulls
    api = JsApi(nc)
    info = await api.consumer_info(f"{STREAM}-g", "m1")
    moved_at = time.time()
    await api.unpin(f"{STREAM}-g", "m1", (info["config"].get("priority_groups") or ["PCG"])[0])
    r = await asyncio.to_thread(app.wait, 120)
    assert r.returncode != 0 and "pin moved to another instance" in r.output, r.describe()
    await asyncio.to_thread(pub.join, 120)
    j = await asyncio.to_thread(standby.wait, 180)
    assert j.returncode == 0, j.describe()
    # the query's table: no version committed after the move (Delta's commit timestamps)
    from deltalake import DeltaTable

    history = DeltaTable(raw).history()
    late = [h for h in history if h.get("timestamp", 0) / 1000 > moved_at + 0.5
            and int((h.get("operationMetrics") or {}).get("numOutputRows") or 0) > 0]
    assert not late, f"the query wrote rows after its pin moved: {late}"
    from tests.support.member_job import parquet_landed

    in_query = {r.origin_seq for r in delta_landed(raw)}
    in_job = {r.origin_seq for r in parquet_landed(tmp_path / "lake")}
    assert set(pub.orders) <= in_query | in_job, "a message landed nowhere"
    assert len(in_query & in_job) <= 500, "more than the batch in flight at the move landed twice"
    assert await wq_left(nc, "g") == 0


async def test_a_query_beside_orbit_consuming_another_member_of_the_group(nc, nats_server, member_job_zip, tmp_path):
    """An elastic group of two members: orbit's real ``cg`` consumes m2 while an
    available-now query reads m1. Each message is processed once, by orbit or by the query;
    the query's are exactly m1's partitions', in per-key order, and acknowledged."""
    from tests.integration.test_orbit_sharing import Peer
    from tests.support.orbit import OrbitCli, build_orbit_cg_source
    from tests.support.prebuild import built

    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    info = await ConsumerGroups(nc).create(STREAM, "g", ElasticGroupConfig(
        4, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2")))
    from airflow_provider_cg.core.groups import partitioning

    m1_partitions = set(partitioning.member_partitions(info.config, "m1"))
    pub = Publisher(nats_server.url, 3_000, 3_000.0)
    await asyncio.to_thread(pub.run)
    assert pub.error is None
    log = tmp_path / "orbit.log"
    cli = OrbitCli.for_server(built(build_orbit_cg_source), nats_server.url, tmp_path)
    peer = Peer("cli", cli.start("elastic", "--sleep", "1ms", "consume", STREAM, "g", "m2", log=log), log)
    try:
        raw = str(tmp_path / "raw")
        r = await asyncio.to_thread(start_streaming_app(
            member_job_zip, tmp_path / "logs", nats_servers=nats_server.url,
            args=["--stream", STREAM, "--raw", f"g:m1:{raw}", "--checkpoints", str(tmp_path / "ck"),
                  "--trigger", "now", "--option", "maxMessagesPerTrigger=800"]).wait, 240)
        assert r.returncode == 0, r.describe()

        async def drained() -> bool:
            return await wq_left(nc, "g") <= 1  # (the query's last batch: acked by its next run)
        deadline = time.monotonic() + 90
        while not await drained():
            assert time.monotonic() < deadline, f"not drained: {peer.text()[-1500:]}"
            await asyncio.sleep(0.2)
    finally:
        peer.stop()
    landed = delta_landed(raw)
    ours = {x.origin_seq for x in landed}
    theirs, unsure = peer.outcomes()
    assert ours and theirs, (len(ours), len(theirs))
    assert not ours & theirs, f"processed by both: {sorted(ours & theirs)[:5]}"
    assert set(pub.orders) - ours - theirs <= unsure
    assert {x.partition for x in landed} <= m1_partitions
    assert_exactly_once(landed, {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items() if q in ours})


async def test_a_static_member_read_by_available_now_queries_moves_its_durable(nc, nats_server, member_job_zip,
                                                                             tmp_path):
    """A static group (origin partitioned by the server's subject transform): two available-now
    runs of a query over m1, orders published before each, land exactly m1's orders once and in
    per-key order; m1's durable stands after them, as orbit's tools read it."""
    from airflow_provider_cg.core.groups import partitioning
    from airflow_provider_cg.core.groups.config import StaticGroupConfig

    api = JsApi(nc)
    await api.add_stream({"name": STREAM, "subjects": ["orders.*"], "storage": "file", "allow_direct": True,
                          "subject_transform": {"src": "orders.*", "dest": "{{partition(2,1)}}.orders.{{wildcard(1)}}"}})
    info = await ConsumerGroups(nc).create(STREAM, "s", StaticGroupConfig(2, ("orders.*",), members=("m1", "m2")))
    mine = set(partitioning.member_partitions(info.config, "m1"))
    raw = str(tmp_path / "raw")
    args = ["--stream", STREAM, "--raw", f"s:m1:{raw}", "--checkpoints", str(tmp_path / "ck"), "--trigger", "now",
            "--option", "maxMessagesPerTrigger=500"]
    orders: dict[int, dict] = {}
    for n in (2_000, 1_000):
        pub = Publisher(nats_server.url, n, 5_000.0)
        await asyncio.to_thread(pub.run)
        assert pub.error is None
        orders.update(pub.orders)
        r = await asyncio.to_thread(start_streaming_app(member_job_zip, tmp_path / "logs",
                                                        nats_servers=nats_server.url, args=args).wait, 240)
        assert r.returncode == 0, r.describe()
    landed = delta_landed(raw)
    assert landed and {x.partition for x in landed} <= mine
    stored = {}  # the origin's subjects (after the transform): which orders are m1's
    for q in orders:
        msg = await api.request(f"STREAM.MSG.GET.{STREAM}", {"seq": q})
        stored[q] = msg["message"]["subject"]
    # a static group's key is the subject after the partition token (the member job's too)
    expected = {(STREAM, q): stored[q].split(".", 1)[1] for q in orders if int(stored[q].split(".", 1)[0]) in mine}
    assert_exactly_once(landed, expected)
    durable = await api.consumer_info(STREAM, "s-m1")
    assert int(durable["ack_floor"]["stream_seq"]) >= max(x.origin_seq for x in landed), durable
