"""The ``cg_member`` source's exactly-once under real ``spark-submit`` and a real nats-server:
a query SIGKILLed and restarted from its checkpoint under a publisher (rows once, in per-key
order; windowed aggregates equal the origin's), a query landing through ``SinkBatches`` into the
table the member job lands into, and a query whose group grows under it."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from airflow_provider_cg.core.groups import layouts as grouplayout
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from tests.support.member_job import assert_exactly_once, delta_landed, read_delta
from tests.support.streaming import (
    CUSTOMERS,
    STREAM,
    Publisher,
    publish_flush,
    start_streaming_app,
    windows_from,
    windows_landed,
    wq_left,
)

pytestmark = [pytest.mark.integration]


async def test_a_query_killed_and_restarted_from_its_checkpoint_lands_every_message_once(
        nc, nats_server, member_job_zip, tmp_path):
    """Two queries in one application, over two groups of one origin stream (one in each
    layout): the rows as read, and orders per 10 s window and customer with a watermark. The
    application is SIGKILLed three times at random moments while orders are published, and
    restarted from its checkpoints; a last available-now run lands the rest. Every message is
    once in the rows' table, in per-key order; every window holds exactly the origin's orders;
    both groups' backlogs are acknowledged to the end."""
    rnd = random.Random()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    cg = ConsumerGroups(nc)
    flt = (PartitioningFilter("orders.*", (1,)),)
    await cg.create(STREAM, "raw", ElasticGroupConfig(4, flt, members=("m1",)))
    await cg.create(STREAM, "win", ElasticGroupConfig(3, flt, members=("m1",)), layout=grouplayout.PARTITION_STREAMS)
    raw, win = str(tmp_path / "raw"), str(tmp_path / "win")
    args = ["--stream", STREAM, "--raw", f"raw:m1:{raw}", "--windows", f"win:m1:{win}",
            "--checkpoints", str(tmp_path / "ck"), "--trigger", "1", "--option", "maxMessagesPerTrigger=700",
            "--option", "pinTimeout=60"]
    pub = Publisher(nats_server.url, 9_000, 300.0)
    pub.start()
    def rows() -> int:
        log = tmp_path / "raw" / "_delta_log"
        return len(read_delta(raw, ["origin_seq"])) if log.exists() and any(log.glob("*.json")) else 0

    kills = []
    for _ in range(3):
        app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=args)
        before, deadline = rows(), time.monotonic() + 180
        while rows() == before:  # this run lands, then is killed at a random moment of its batches
            assert app.running() and time.monotonic() < deadline, app.result().describe()
            await asyncio.sleep(0.3)
        await asyncio.sleep(rnd.uniform(0.0, 4.0))
        assert app.running(), app.result().describe()
        app.kill()
        kills.append(rows())
    await asyncio.to_thread(pub.join, 120)
    assert pub.error is None and len(pub.orders) == 9_000
    flush_seq = await publish_flush(nc)
    final = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url,
                                args=[a if a != "1" else "now" for a in args])
    r = await asyncio.to_thread(final.wait, 300)
    assert r.returncode == 0 and "CG_STREAM_DONE" in r.stdout, r.describe()

    expected = {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items()}
    expected[(STREAM, flush_seq)] = "k0"
    landed = delta_landed(raw)
    assert_exactly_once(landed, expected)
    assert windows_landed(win) == windows_from(pub.orders)
    # what Spark committed is acknowledged: nothing is left for the groups (the final run's
    # last batch is acknowledged as its query stops or when the next run starts)
    assert await wq_left(nc, "raw") <= 1 and await wq_left(nc, "win") <= 1


async def test_a_query_through_the_two_phase_writer_shares_its_table_with_the_member_job(
        nc, nats_server, member_job_zip, tmp_path):
    """A query lands its member into the provider's Parquet table through ``SinkBatches``
    (foreachBatch) while orders are published; it is SIGKILLed mid-batch, the member job takes
    the member over and lands into the same table (finishing what the query left prepared),
    then the query is restarted from its checkpoint twice (killed once more, then
    available-now). Every order is in the table once, in per-key order, whichever writer
    landed it."""
    from tests.support.member_job import parquet_landed, start_member_job

    rnd = random.Random()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, "g", ElasticGroupConfig(3, (PartitioningFilter("orders.*", (1,)),),
                                                                    members=("m1",)))
    lake = tmp_path / "lake"
    args = ["--stream", STREAM, "--sink-batches", f"g:m1:{lake}", "--checkpoints", str(tmp_path / "ck"),
            "--trigger", "1", "--option", "maxMessagesPerTrigger=400", "--option", "pinTimeout=60"]
    pub = Publisher(nats_server.url, 6_000, 300.0)
    pub.start()

    def rows() -> int:
        return len(parquet_landed(lake)) if lake.exists() else 0

    async def run_until_landing_then_kill() -> None:
        app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=args)
        before, deadline = rows(), time.monotonic() + 180
        while rows() == before:
            assert app.running() and time.monotonic() < deadline, app.result().describe()
            await asyncio.sleep(0.3)
        await asyncio.sleep(rnd.uniform(0.0, 3.0))
        app.kill()

    await run_until_landing_then_kill()
    job = await asyncio.to_thread(start_member_job(
        member_job_zip, tmp_path / "job", nats_servers=nats_server.url, stream=STREAM, group="g", member="m1",
        sink="parquet", sink_path=lake, spark=False,
        args=["--standby-timeout", "60", "--idle-timeout", "2", "--batch-size", "300"]).wait, 180)
    assert job.returncode == 0 and job.summary["messages_read"] > 0, job.describe()
    await run_until_landing_then_kill()
    await asyncio.to_thread(pub.join, 120)
    assert pub.error is None
    final = await asyncio.to_thread(start_streaming_app(
        member_job_zip, tmp_path / "logs", nats_servers=nats_server.url,
        args=[a if a != "1" else "now" for a in args]).wait, 240)
    assert final.returncode == 0, final.describe()
    assert_exactly_once(parquet_landed(lake), {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items()})


async def test_a_query_takes_its_new_partitions_when_the_group_grows_and_loses_nothing(
        nc, nats_server, member_job_zip, tmp_path):
    """A query reads m1 (every partition) through ``SinkBatches`` while orders are published;
    m2 joins the group mid-query and the member job lands m2's partitions into the same table.
    The query acknowledges only what is still m1's, hands its consumer over and goes on with its
    new partitions (or, when m2's writer fenced a batch of its in flight, stops and is run again
    from its checkpoint). Every order is in the table once, in per-key order."""
    from airflow_provider_cg.core.groups import partitioning
    from tests.support.member_job import parquet_landed, start_member_job

    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    cg = ConsumerGroups(nc)
    await cg.create(STREAM, "g", ElasticGroupConfig(4, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    lake = tmp_path / "lake"
    args = ["--stream", STREAM, "--sink-batches", f"g:m1:{lake}", "--checkpoints", str(tmp_path / "ck"),
            "--trigger", "1", "--option", "maxMessagesPerTrigger=300", "--option", "pinTimeout=60"]
    pub = Publisher(nats_server.url, 6_000, 250.0)
    pub.start()
    app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=args)
    deadline = time.monotonic() + 180
    while not lake.exists() or len(parquet_landed(lake)) < 600:
        assert app.running() and time.monotonic() < deadline, app.result().describe()
        await asyncio.sleep(0.3)
    info = await cg.add_members(STREAM, "g", ["m2"])
    m2 = set(partitioning.member_partitions(info.config, "m2"))
    assert m2 and m2 != {0, 1, 2, 3}

    def job():
        return start_member_job(member_job_zip, tmp_path / "job", nats_servers=nats_server.url, stream=STREAM,
                                group="g", member="m2", sink="parquet", sink_path=lake, spark=False,
                                args=["--standby-timeout", "20", "--idle-timeout", "2", "--batch-size", "300"])

    while pub.is_alive():  # m2's runs, one after another, while orders come
        r = await asyncio.to_thread(job().wait, 120)
        assert r.returncode == 0, r.describe()
    stopped_by_fence = not app.running()
    if app.running():
        await asyncio.sleep(3.0)  # what it has in hand lands
        app.kill()
    assert pub.error is None
    final = await asyncio.to_thread(start_streaming_app(
        member_job_zip, tmp_path / "logs", nats_servers=nats_server.url,
        args=[a if a != "1" else "now" for a in args]).wait, 240)
    assert final.returncode == 0, final.describe()
    r = await asyncio.to_thread(job().wait, 120)
    assert r.returncode == 0, r.describe()
    landed = parquet_landed(lake)
    assert_exactly_once(landed, {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items()})
    by_m2 = [x for x in landed if x.partition in m2]
    assert by_m2, "m2's partitions landed nothing"
    if stopped_by_fence:
        assert "took over its partitions" in app.result().output, app.result().describe()
