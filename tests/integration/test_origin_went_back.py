"""An origin that goes back in time (``core/landing/protocol/origin_guard.py``) on a real
nats-server: its store comes back older under a running group, in both layouts, into Delta and
the Parquet lake. The members refuse with the sequence it went back to and how many landed
messages it lost, acknowledging and writing nothing; ``cg status`` names it; once
``went-back:<R>`` is given every message published before and after is in the table exactly
once, in per-key order, the new ones under a life key of their own."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.protocol.origin_guard import OriginWentBack
from airflow_provider_cg.core.landing.run.member import run_member_batch
from tests.support.member_job import assert_exactly_once, delta_landed, parquet_landed, publish_orders
from tests.support.store_copy import StoreCopy

pytestmark = pytest.mark.integration

STREAM, GROUP, MEMBERS = "O", "g", ("m1", "m2")


PG: dict = {}  # the test's PostgreSQL connection parameters, when it lands there


def _sink(kind: str, tmp_path):
    if kind == "parquet":
        from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

        return ParquetLakeSink(tmp_path / "lake", fsync=False)
    if kind == "iceberg":
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        return IcebergSink(f"sqlite:///{tmp_path}/catalog.db", "lake.orders", warehouse=str(tmp_path / "wh"))
    if kind == "postgres":
        from airflow_provider_cg.core.landing.sinks import PostgresSink

        return PostgresSink(PG)
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

    return DeltaLakeSink(str(tmp_path / "delta"))


def _landed(kind: str, tmp_path):
    from tests.support.member_job import iceberg_landed, postgres_landed

    if kind == "parquet":
        return parquet_landed(tmp_path / "lake")
    if kind == "iceberg":
        return iceberg_landed(f"sqlite:///{tmp_path}/catalog.db", "lake.orders")
    if kind == "postgres":
        return postgres_landed(PG)
    return delta_landed(str(tmp_path / "delta"))


async def _land(nc, kind: str, tmp_path, members=MEMBERS, **options) -> list:
    """The members' runs side by side (each its own writer of the table); their summaries, or
    the exception a run raised."""
    async def one(member: str):
        sink = _sink(kind, tmp_path)
        try:
            return await run_member_batch(nc, sink, BatchOptions(
                stream=STREAM, group=GROUP, member=member, batch_size=300, standby_timeout=5, idle_timeout=0.5,
                **options))
        finally:
            sink.close()

    return list(await asyncio.gather(*(one(m) for m in members), return_exceptions=True))


async def _backlog(nc) -> int:
    return (await ConsumerGroups(nc).status(STREAM, GROUP)).backlog


@pytest.mark.parametrize("layout,kind", [("work-queue", "delta"), ("partition-streams", "parquet"),
                                         ("work-queue", "iceberg"), ("partition-streams", "postgres")])
async def test_a_store_that_comes_back_older_under_a_running_group(nats_server, nats_settings, tmp_path, layout,
                                                                   kind, request, monkeypatch):
    if kind == "postgres":
        monkeypatch.setattr(f"{__name__}.PG", request.getfixturevalue("postgres_db").conn_params())
    nc = await nats_settings.connect()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
        4, (PartitioningFilter("orders.*", (1,)),), members=MEMBERS), layout=layout)
    expected = await publish_orders(nc, STREAM, GROUP, 2000, 40)
    # only m1 lands before the copy: m2's messages are still waiting in the copy
    assert all(not isinstance(r, Exception) for r in await _land(nc, kind, tmp_path, members=("m1",)))
    await nc.close()
    older = StoreCopy(nats_server, tmp_path / "older").take()

    nc = await nats_settings.connect()
    expected |= await publish_orders(nc, STREAM, GROUP, 1000, 40)  # 2001-3000: landed, then lost
    results = await _land(nc, kind, tmp_path)
    assert all(not isinstance(r, Exception) for r in results), results
    assert sorted((r.origin_stream, r.origin_seq) for r in _landed(kind, tmp_path)) == sorted(expected)
    await nc.close()

    older.put_back()  # the server comes back on its older store
    nc = await nats_settings.connect()
    try:
        api = JsApi(nc)
        assert int((await api.stream_info(STREAM))["state"]["last_seq"]) == 2000
        new = await publish_orders(nc, STREAM, GROUP, 1000, 40,
                                   payload=lambda i: b'{"after":%d}' % i)  # others, at 2001-3000 again
        assert sorted(new) == sorted(k for k in expected if k[1] > 2000)
        before = _landed(kind, tmp_path)
        backlog = await _backlog(nc)
        assert backlog >= 1000

        refused = await _land(nc, kind, tmp_path)
        for r in refused:
            assert isinstance(r, OriginWentBack), r
            assert (r.went.to_seq, r.went.lost, r.went.mark.seq) == (2000, 1000, 3000)
            assert r.field == "stream_life" and "--stream-life went-back:2000" in str(r)
        # a backfill over everything refuses the same way
        import datetime as dt

        from airflow_provider_cg.core.landing.run.backfill import run_backfill

        window = (dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
        sink = _sink(kind, tmp_path)
        try:
            with pytest.raises(OriginWentBack, match="went back to sequence 2000"):
                await run_backfill(nc, sink, STREAM, GROUP, *window)
        finally:
            sink.close()
        # nothing acknowledged, nothing written; the tools say what happened
        assert await _backlog(nc) == backlog
        assert _landed(kind, tmp_path) == before
        st = await ConsumerGroups(nc).status(STREAM, GROUP)
        went = st.problems["origin_went_back"]
        assert (went["went_back_to"], went["lost_messages"], went["way_forward"]) == (
            2000, 1000, "--stream-life went-back:2000")
        from tests.support.badinput import acg

        out = await acg("status", STREAM, GROUP, "--server", nats_server.url)
        assert "ORIGIN WENT BACK: O went back to sequence 2000" in out.out, out.out
        assert "1,000 landed messages no longer in the stream" in out.out
        # the sensors' events and the metrics carry it too
        from airflow_provider_cg.core.groups.lag import group_lag
        from airflow_provider_cg.metrics import lag_metrics
        from airflow_provider_cg.triggers.overflow import read_figures

        _, figures = await read_figures(nc, STREAM, GROUP, None, None)
        assert figures["problems"]["origin_went_back"]["went_back_to"] == 2000
        metrics, _ = lag_metrics("nats_default", [(await group_lag(nc, STREAM, GROUP)).to_dict()], observe=False)
        assert [m.value for m in metrics if m.name == "cg_group_origin_went_back"] == [1.0]

        # the way forward: m1 records the life after 2000; m2 needs no option then
        results = await _land(nc, kind, tmp_path, members=("m1",), stream_life="went-back:2000")
        results += await _land(nc, kind, tmp_path, members=("m2",))
        assert all(not isinstance(r, Exception) for r in results), results
        assert {r.origin_key for r in results} == {"O#2"}
        assert await _backlog(nc) == 0
        assert_exactly_once(_landed(kind, tmp_path), expected | {("O#2", s): k for (_, s), k in new.items()})
        assert "origin_went_back" not in (await ConsumerGroups(nc).status(STREAM, GROUP)).problems
        sink = _sink(kind, tmp_path)  # a backfill of everything now: each message under its own key, held
        try:
            s = await run_backfill(nc, sink, STREAM, GROUP, *window)
        finally:
            sink.close()
        assert (s.rows_written, s.duplicates_skipped) == (0, 3000)
        # and later messages keep landing under the new life, with no option
        more = await publish_orders(nc, STREAM, GROUP, 200, 40)
        assert all(not isinstance(r, Exception) for r in await _land(nc, kind, tmp_path))
        assert_exactly_once(_landed(kind, tmp_path), expected | {("O#2", s): k for (_, s), k in (new | more).items()})
    finally:
        await nc.close()


async def test_the_job_refuses_with_one_line_and_exit_1_and_nothing_written(nats_server, nats_settings, tmp_path,
                                                                            member_job_zip):
    """The member job (``--no-spark``) as an operator runs it: exit 1, one line naming the
    sequence and the option, no traceback, nothing written; with the option it lands."""
    from airflow_provider_cg.core.landing import contract
    from tests.support.member_job import run_member_job

    nc = await nats_settings.connect()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
        2, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    expected = await publish_orders(nc, STREAM, GROUP, 500, 10)
    await nc.close()
    older = StoreCopy(nats_server, tmp_path / "older").take()
    nc = await nats_settings.connect()
    expected |= await publish_orders(nc, STREAM, GROUP, 300, 10)
    await nc.close()
    lake = tmp_path / "lake"
    args = ["--idle-timeout", "0.5", "--standby-timeout", "5", "--summary-file", str(tmp_path / "summary.json")]

    def job(*extra: str):
        return run_member_job(member_job_zip, tmp_path / "jobs", nats_servers=nats_server.url, stream=STREAM,
                              group=GROUP, member="m1", sink="parquet", sink_path=lake, args=[*args, *extra],
                              spark=False, timeout=120)

    assert job().returncode == contract.EXIT_OK
    older.put_back()
    nc = await nats_settings.connect()
    try:
        new = await publish_orders(nc, STREAM, GROUP, 100, 10, payload=lambda i: b"new %d" % i)
        before = parquet_landed(lake)
        r = job()
        assert r.returncode == contract.EXIT_INVALID, r.describe()
        err = [line for line in r.output.splitlines() if "error:" in line]
        assert len(err) == 1 and "Traceback" not in r.output, r.describe()
        assert "origin stream 'O' went back to sequence 500" in err[0] and "300 landed messages (501-800)" in err[0]
        assert "--stream-life went-back:500" in err[0]
        failed = json.loads((tmp_path / "summary.json").read_text())  # what the operator reads: no retry
        assert (failed["result"], failed["exit_code"]) == ("failed", contract.EXIT_INVALID)
        assert "went-back:500" in failed["error"]
        # the 500 the copy still held in the work queue, and the 100 new ones: none acknowledged
        assert parquet_landed(lake) == before and await _backlog(nc) == 600
        assert job("--stream-life", "went-back:500").returncode == contract.EXIT_OK
        assert_exactly_once(parquet_landed(lake), expected | {("O#2", s): k for (_, s), k in new.items()})
    finally:
        await nc.close()


async def test_a_restored_snapshot_older_than_the_table(nats_server, nats_settings, tmp_path):
    """The origin deleted and restored from a stream snapshot taken at 2,000 after 3,000 were
    landed (``nats stream restore`` gives it a creation time of its own): the job refuses the
    unknown life; ``continue:`` is checked against the table's marks and refused too, naming the
    sequence, and the ``cg reset`` that moves the group back (its work queue sourced up to 3,000
    from the older life and would skip the new ones); after the reset, ``went-back:2000`` lands
    every new message once, beside the old ones."""
    from airflow_provider_cg.core.landing.stream_life import StreamLifeChanged
    from tests.support.badinput import acg
    from tests.support.snapshots import restore, snapshot

    nc = await nats_settings.connect()
    try:
        await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
        await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
            4, (PartitioningFilter("orders.*", (1,)),), members=MEMBERS))
        expected = await publish_orders(nc, STREAM, GROUP, 2000, 40)
        backup = await snapshot(nc, STREAM)
        expected |= await publish_orders(nc, STREAM, GROUP, 1000, 40)
        assert all(not isinstance(r, Exception) for r in await _land(nc, "parquet", tmp_path))
        api = JsApi(nc)
        await api.delete_stream(STREAM)
        restored = await restore(nc, backup)
        assert int(restored["state"]["last_seq"]) == 2000
        new = await publish_orders(nc, STREAM, GROUP, 1000, 40, payload=lambda i: b"new %d" % i,
                                   wait_sourced=False)
        created = restored["created"]
        before = parquet_landed(tmp_path / "lake")

        refused = await _land(nc, "parquet", tmp_path, members=("m1",))
        assert isinstance(refused[0], StreamLifeChanged), refused
        refused = await _land(nc, "parquet", tmp_path, members=("m1",), stream_life=f"continue:{created}")
        went = refused[0]
        assert isinstance(went, OriginWentBack), refused
        assert (went.went.to_seq, went.went.lost) == (2000, 1000)
        assert went.went.move_back == f"cg reset {STREAM} {GROUP} --to-seq 2001 --execute", went.went
        assert f"first {went.went.move_back}" in str(went)
        assert parquet_landed(tmp_path / "lake") == before
        # the way forward, as the refusal says it
        reset = await acg("reset", STREAM, GROUP, "--to-seq", "2001", "--execute", "--server", nats_server.url)
        assert reset.rc == 0, reset.err + reset.out
        results = await _land(nc, "parquet", tmp_path, stream_life="went-back:2000")
        assert all(not isinstance(r, Exception) for r in results), results
        assert_exactly_once(parquet_landed(tmp_path / "lake"),
                            expected | {("O#2", s): k for (_, s), k in new.items()})
    finally:
        await nc.close()


async def _rolled_back(nats_server, nats_settings, tmp_path, land, publish) -> tuple[dict, dict]:
    """Land, take a copy, land more, put the copy back and publish others at the same
    sequences: ``(everything landed before, the new messages)``."""
    nc = await nats_settings.connect()
    expected = await publish(nc, 400, lambda i: b'{"id":%d}' % i)
    await land(nc)
    await nc.close()
    older = StoreCopy(nats_server, tmp_path / "older").take()
    nc = await nats_settings.connect()
    expected |= await publish(nc, 300, lambda i: b'{"id":%d}' % (1000 + i))
    await land(nc)
    await nc.close()
    older.put_back()
    nc = await nats_settings.connect()
    new = await publish(nc, 200, lambda i: b'{"new":%d}' % i)
    await nc.close()
    return expected, new


async def test_a_static_group_whose_origin_went_back(nats_server, nats_settings, tmp_path):
    """A static member reads its origin directly (its marks are the rows' own stored times): the
    same refusal, then the new messages land under their own key."""
    from airflow_provider_cg.core.groups.config import StaticGroupConfig
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    lake = tmp_path / "lake"
    nc = await nats_settings.connect()
    await JsApi(nc).add_stream({"name": STREAM, "subjects": ["orders.*"], "storage": "file", "allow_direct": True,
                                "subject_transform": {"src": "orders.*",
                                                      "dest": "{{partition(2,1)}}.orders.{{wildcard(1)}}"}})
    await ConsumerGroups(nc).create(STREAM, GROUP, StaticGroupConfig(2, ("orders.*",), members=("m1",)))
    await nc.close()

    async def land(nc, **options):
        sink = ParquetLakeSink(lake, fsync=False)
        try:
            return await run_member_batch(nc, sink, BatchOptions(
                stream=STREAM, group=GROUP, member="m1", batch_size=150, standby_timeout=5, idle_timeout=0.5,
                **options))
        finally:
            sink.close()

    async def publish(nc, n, payload):  # a static group's key is the subject its filter matched
        sent = await publish_orders(nc, STREAM, GROUP, n, 10, payload=payload, wait_sourced=False)
        return {k: f"orders.{key}" for k, key in sent.items()}

    expected, new = await _rolled_back(nats_server, nats_settings, tmp_path, land, publish)
    nc = await nats_settings.connect()
    try:
        before = parquet_landed(lake)
        with pytest.raises(OriginWentBack) as refused:
            await land(nc)
        assert (refused.value.went.to_seq, refused.value.went.lost) == (400, 300)
        assert parquet_landed(lake) == before
        assert (await land(nc, stream_life="went-back:400")).origin_key == "O#2"
        assert_exactly_once(parquet_landed(lake), expected | {("O#2", s): k for (_, s), k in new.items()})
    finally:
        await nc.close()


@pytest.mark.spark
async def test_the_executor_read_path_whose_origin_went_back(nats_server, nats_settings, tmp_path, spark_session):
    """Spark's tasks read the batches (``--read executors``, a SQL transformation): the driver
    reads each batch's mark from the origin, the same refusal, then the new messages land under
    their own key (the tasks key the rows by sequence, the driver the inputs)."""
    from airflow_provider_cg.core.landing.pipeline.decode import SparkDecoder
    from airflow_provider_cg.core.landing.pipeline.processing import SparkPipeline
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    lake = tmp_path / "lake"
    nc = await nats_settings.connect()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, GROUP, ElasticGroupConfig(
        2, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    await nc.close()
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"),
                             sql="SELECT origin_stream, origin_seq, key, partition FROM batch")
    pipeline.read_in_tasks(nats_settings)

    async def land(nc, **options):
        sink = ParquetLakeSink(lake, fsync=False)
        try:
            s = await run_member_batch(nc, sink, BatchOptions(
                stream=STREAM, group=GROUP, member="m1", batch_size=150, standby_timeout=5, idle_timeout=0.5,
                read="executors", **options), pipeline)
            assert s.read_path == "executors"
            return s
        finally:
            sink.close()

    async def publish(nc, n, payload):
        return await publish_orders(nc, STREAM, GROUP, n, 10, payload=payload)

    expected, new = await _rolled_back(nats_server, nats_settings, tmp_path, land, publish)
    nc = await nats_settings.connect()
    try:
        before = parquet_landed(lake)
        with pytest.raises(OriginWentBack) as refused:
            await land(nc)
        assert (refused.value.went.to_seq, refused.value.went.lost) == (400, 300)
        assert parquet_landed(lake) == before
        assert (await land(nc, stream_life="went-back:400")).origin_key == "O#2"
        assert_exactly_once(parquet_landed(lake), expected | {("O#2", s): k for (_, s), k in new.items()})
    finally:
        await nc.close()
