"""The ``cg_member`` Structured Streaming source (``core/streaming/``) under real
``spark-submit`` of a user's application (``tests/apps/streaming_app.py``, Spark's own Delta
sink) over a real nats-server: SIGKILLed and restarted from its checkpoint under a publisher,
every message lands once and in per-key order, and windowed aggregates (state restored from
the checkpoint) equal those computed from the origin; a query whose pin is taken stops and
writes nothing after; orbit's ``cg`` consumes another member of the same group beside it."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import defaultdict

import pytest

from airflow_provider_cg.core.groups import layouts as grouplayout
from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.jetstream.publish import publish_many
from tests.support.member_job import assert_exactly_once, delta_landed, read_delta
from tests.support.streaming import start_streaming_app

pytestmark = [pytest.mark.integration]

STREAM = "ORD"
CUSTOMERS = 7


class Publisher(threading.Thread):
    """Orders published at about ``rate`` a second on its own connection, each with its
    event time (``ts``, the publish time) and the origin sequence it got."""

    def __init__(self, url: str, n: int, rate: float, subject_prefix: str = "orders") -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.rate, self.prefix = url, n, rate, subject_prefix
        self.orders: dict[int, dict] = {}  # origin seq -> order
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._go())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    async def _go(self) -> None:
        nc = await NatsConnectionSettings(servers=[self.url]).connect()
        try:
            api = JsApi(nc)
            step = 50
            for i0 in range(0, self.n, step):
                first = int((await api.stream_info(STREAM))["state"]["last_seq"]) + 1
                now = time.time()
                batch = [{"id": i, "customer": f"c{i % CUSTOMERS}", "amount": float(i % 13), "ts": now}
                         for i in range(i0, min(self.n, i0 + step))]
                res = await publish_many(nc, ((f"{self.prefix}.k{o['id'] % CUSTOMERS}", json.dumps(o).encode())
                                              for o in batch))
                assert res.published == len(batch) and res.first_seq == first
                for k, o in enumerate(batch):
                    self.orders[first + k] = o
                await asyncio.sleep(step / self.rate)
        finally:
            await nc.close()


async def _flush(nc) -> int:
    """An order far in event time: the watermark passes every window before it."""
    res = await publish_many(nc, [("orders.k0", json.dumps({"id": -1, "customer": "flush", "amount": 0.0,
                                                             "ts": time.time() + 3600}).encode())])
    return res.first_seq


def _windows_from(orders: dict[int, dict]) -> dict[tuple[int, str], tuple[int, float, list[int]]]:
    out: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0.0, []])
    for o in orders.values():
        w = out[(int(o["ts"] // 10 * 10), o["customer"])]
        w[0] += 1
        w[1] += o["amount"]
        w[2].append(o["id"])
    return {k: (n, a, sorted(ids)) for k, (n, a, ids) in out.items()}


def _windows_landed(path: str) -> dict[tuple[int, str], tuple[int, float, list[int]]]:
    rows = read_delta(path).to_pylist()
    keys = [(int(r["window_start"].timestamp()), r["customer"]) for r in rows]
    assert len(keys) == len(set(keys)), "a window was appended twice"
    return {k: (r["orders"], r["amount"], sorted(r["ids"])) for k, r in zip(keys, rows, strict=True)}


async def _wq_left(nc, group: str) -> int:
    return int((await JsApi(nc).stream_info(f"{STREAM}-{group}"))["state"]["messages"])


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
    flush_seq = await _flush(nc)
    final = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url,
                                args=[a if a != "1" else "now" for a in args])
    r = await asyncio.to_thread(final.wait, 300)
    assert r.returncode == 0 and "CG_STREAM_DONE" in r.stdout, r.describe()

    expected = {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items()}
    expected[(STREAM, flush_seq)] = "k0"
    landed = delta_landed(raw)
    assert_exactly_once(landed, expected)
    assert _windows_landed(win) == _windows_from(pub.orders)
    # what Spark committed is acknowledged: nothing is left for the groups (the final run's
    # last batch is acknowledged as its query stops or when the next run starts)
    assert await _wq_left(nc, "raw") <= 1 and await _wq_left(nc, "win") <= 1


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
    while not (tmp_path / "raw" / "_delta_log").exists() or len(read_delta(raw, ["origin_seq"])) < 1000:
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
    late = [h for h in history if h.get("timestamp", 0) / 1000 > moved_at + 0.5 and h.get("operation") != "CREATE TABLE"]
    assert not late, f"the query wrote after its pin moved: {late}"
    from tests.support.member_job import parquet_landed

    in_query = {r.origin_seq for r in delta_landed(raw)}
    in_job = {r.origin_seq for r in parquet_landed(tmp_path / "lake")}
    assert set(pub.orders) <= in_query | in_job, "a message landed nowhere"
    assert len(in_query & in_job) <= 500, "more than the batch in flight at the move landed twice"
    assert await _wq_left(nc, "g") == 0


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
            return await _wq_left(nc, "g") <= 1  # (the query's last batch: acked by its next run)
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
    expected = {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in orders.items()
                if int(stored[q].split(".", 1)[0]) in mine}
    assert_exactly_once(landed, expected)
    durable = await api.consumer_info(STREAM, "s-m1")
    assert int(durable["ack_floor"]["stream_seq"]) >= max(x.origin_seq for x in landed), durable
