"""A re-created origin stream (same name, sequences from 1 again) against a real nats-server,
into every sink: the job refuses it (nothing acked, nothing written) until ``stream_life``
names it; then its messages land beside the first life's under ``<stream>#2`` and dedupe among
themselves; a backfill and ``cg lag --sink`` see the same; a server restart keeps the life."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from airflow_provider_cg.core.groups.names import work_queue_stream
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.publish import publish_many
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.run.backfill import run_backfill
from airflow_provider_cg.core.landing.run.member import run_member_batch
from airflow_provider_cg.core.landing.stream_life import (
    FIELD,
    Life,
    StreamLifeChanged,
    origin_created,
)

pytestmark = pytest.mark.integration

CFG = ElasticGroupConfig(2, (PartitioningFilter("foo.*", (1,)),), members=("m1",))


async def new_life(nc, n: int, first: int = 0, kind: str = "elastic") -> str:
    """The origin O (re-)created with a group on it and ``n`` messages; its creation time. A
    static group's origin puts the partition first (``<p>.foo.<key>``)."""
    api = JsApi(nc)
    groups = ConsumerGroups(nc)
    for old in await groups.list("O"):
        await groups.delete("O", "g", old[0], force=True)
    await api.delete_stream("O")
    if kind == "elastic":
        await api.add_stream({"name": "O", "subjects": ["foo.*"], "storage": "file", "allow_direct": True})
        await groups.create("O", "g", CFG)
    else:
        await api.add_stream({"name": "O", "subjects": ["foo.*"], "storage": "file", "allow_direct": True,
                              "subject_transform": {"src": "foo.*", "dest": "{{partition(2,1)}}.foo.{{wildcard(1)}}"}})
        await groups.create("O", "g", StaticGroupConfig(2, ("foo.*",), members=("m1",)))
    await publish_many(nc, [(f"foo.k{i % 5}", f"{first + i}".encode()) for i in range(n)])
    if kind == "elastic":
        await sourced(nc, n)
    return await origin_created(api, "O")


async def sourced(nc, n: int) -> None:
    """Wait until the group's work queue holds ``n`` messages."""
    api = JsApi(nc)
    if ("elastic", "O", "g") not in await ConsumerGroups(nc).list("O"):
        return
    for _ in range(100):
        if (await api.stream_info(work_queue_stream("O", "g")))["state"]["messages"] >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the work queue did not source {n} messages")


async def land(nc, sink, **options) -> dict:
    opts = BatchOptions(stream="O", group="g", member="m1", batch_size=7, standby_timeout=5, idle_timeout=0.5,
                        **options)
    s = await run_member_batch(nc, sink, opts)
    return {"rows": s.rows_written, "dups": s.duplicates_skipped, "key": s.origin_key}


def open_sink(kind: str, tmp_path, pg):
    if kind == "parquet":
        from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

        return ParquetLakeSink(tmp_path / "lake", fsync=False)
    if kind == "delta":
        from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

        return DeltaLakeSink(str(tmp_path / "delta"))
    if kind == "iceberg":
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        return IcebergSink(f"sqlite:///{tmp_path}/catalog.db", "lake.orders", warehouse=str(tmp_path / "wh"))
    from airflow_provider_cg.core.landing.sinks import PostgresSink

    return PostgresSink(pg.conn_params())


def landed_keys(kind: str, tmp_path, pg) -> list[tuple[str, int]]:
    """(origin_stream, origin_seq) of every row, read as a user would."""
    from tests.support import member_job as mj

    if kind == "parquet":
        rows = mj.parquet_landed(tmp_path / "lake")
    elif kind == "delta":
        rows = mj.delta_landed(str(tmp_path / "delta"))
    elif kind == "iceberg":
        rows = mj.iceberg_landed(f"sqlite:///{tmp_path}/catalog.db", "lake.orders")
    else:
        rows = mj.postgres_landed(pg.conn_params())
    return sorted((r.origin_stream, r.origin_seq) for r in rows)


@pytest.mark.parametrize("kind", ["parquet", "delta", "iceberg", "postgres"])
async def test_a_re_created_origin_is_refused_then_landed_as_its_own_life(nc, tmp_path, kind, request):
    pg = request.getfixturevalue("postgres_db") if kind == "postgres" else None
    sink = open_sink(kind, tmp_path, pg)
    first = await new_life(nc, 20)
    assert await land(nc, sink) == {"rows": 20, "dups": 0, "key": "O"}

    second = await new_life(nc, 12, first=100)
    assert second != first
    before = landed_keys(kind, tmp_path, pg)
    with pytest.raises(StreamLifeChanged) as refused:
        await land(nc, sink)
    assert refused.value.field == FIELD
    text = str(refused.value)
    assert first in text and second in text and f"--stream-life new:{second}" in text
    # nothing acknowledged, nothing written
    assert (await JsApi(nc).stream_info(work_queue_stream("O", "g")))["state"]["messages"] == 12
    assert landed_keys(kind, tmp_path, pg) == before
    with pytest.raises(Exception, match="names a stream created at"):
        await land(nc, sink, stream_life=f"new:{first}")

    assert await land(nc, sink, stream_life=f"new:{second}") == {"rows": 12, "dups": 0, "key": "O#2"}
    want = [("O", s) for s in range(1, 21)] + [("O#2", s) for s in range(1, 13)]
    assert landed_keys(kind, tmp_path, pg) == sorted(want)

    # The life is known now: later runs need no option; a backfill of the new life dedupes in it.
    await publish_many(nc, [(f"foo.k{i % 5}", b"late") for i in range(3)])
    await sourced(nc, 3)
    assert await land(nc, sink) == {"rows": 3, "dups": 0, "key": "O#2"}
    import datetime as dt

    s = await run_backfill(nc, sink, "O", "g", dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
                           dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert (s.rows_written, s.duplicates_skipped, s.origin_key) == (0, 15, "O#2")
    assert landed_keys(kind, tmp_path, pg) == sorted(want + [("O#2", s) for s in range(13, 16)])
    last = sink.last_commits("O", "g")
    assert set(last["m1"].origin) == {"O#2"}
    sink.close()


async def test_the_life_survives_a_server_restart_and_continue_is_checked(nc, nats_server, nats_settings, tmp_path):
    """The creation time is kept across a restart (no refusal). ``continue:`` takes a new
    creation time as the latest life only once the table's marks are checked on it: a stream
    whose messages are others (published again, with times of their own) is an origin that went
    back, refused until ``went-back:`` names where; they then land under a key of their own."""
    from airflow_provider_cg.core.landing.protocol.origin_guard import OriginWentBack
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    sink = ParquetLakeSink(tmp_path / "lake", fsync=False)
    first = await new_life(nc, 10)
    assert (await land(nc, sink))["rows"] == 10
    await nc.close()
    nats_server.restart()
    nc = await nats_settings.connect()
    try:
        assert await origin_created(JsApi(nc), "O") == first
        await publish_many(nc, [("foo.k1", b"after restart")])
        await sourced(nc, 1)
        assert await land(nc, sink) == {"rows": 1, "dups": 0, "key": "O"}
        # ten messages in a stream created anew: said to be the same, but they are not
        second = await new_life(nc, 10)
        with pytest.raises(OriginWentBack) as refused:
            await land(nc, sink, stream_life=f"continue:{second}")
        assert refused.value.went.to_seq == 0 and refused.value.went.lost == 11
        assert "--stream-life went-back:0" in str(refused.value)
        assert (await JsApi(nc).stream_info(work_queue_stream("O", "g")))["state"]["messages"] == 10
        assert await land(nc, sink, stream_life="went-back:0") == {"rows": 10, "dups": 0, "key": "O#2"}
        assert await land(nc, sink) == {"rows": 0, "dups": 0, "key": "O#2"}
    finally:
        await nc.close()
    await asyncio.sleep(0)


async def test_the_job_refuses_a_new_life_with_one_line_and_exit_1(nc, nats_settings, tmp_path, monkeypatch, capsys):
    from airflow_provider_cg.core.landing import contract
    from tests.integration.test_backfill import _job

    for k, v in nats_settings.to_env().items():
        monkeypatch.setenv(k, v)
    job = _job()
    argv = ["--stream", "O", "--group", "g", "--member", "m1", "--sink-path", str(tmp_path / "lake"), "--no-spark",
            "--standby-timeout", "5", "--idle-timeout", "0.5"]
    await new_life(nc, 5)
    assert await asyncio.to_thread(job.main, argv) == contract.EXIT_OK
    second = await new_life(nc, 5)
    capsys.readouterr()
    assert await asyncio.to_thread(job.main, argv) == contract.EXIT_INVALID
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("cg_member_job: error: --stream-life: origin stream 'O' was created at")
    assert f"--stream-life new:{second}" in err[0]
    assert (await JsApi(nc).stream_info(work_queue_stream("O", "g")))["state"]["messages"] == 5
    assert await asyncio.to_thread(job.main, [*argv, "--stream-life", "later"]) == contract.EXIT_INVALID
    assert "--stream-life: must be new:<created>, continue:<created> or went-back:<sequence>" in capsys.readouterr().err
    assert await asyncio.to_thread(job.main, [*argv, "--stream-life", f"new:{second}"]) == contract.EXIT_OK
    import json

    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1].removeprefix(contract.SUMMARY_PREFIX))
    assert (summary["origin_key"], summary["rows_written"]) == ("O#2", 5)


async def test_a_static_groups_re_created_origin(nc, tmp_path):
    """A static member reads its origin directly: the same refusal, then the new life."""
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    sink = ParquetLakeSink(tmp_path / "lake", fsync=False)
    await new_life(nc, 9, kind="static")
    assert await land(nc, sink) == {"rows": 9, "dups": 0, "key": "O"}
    second = await new_life(nc, 4, kind="static")
    with pytest.raises(StreamLifeChanged):
        await land(nc, sink)
    assert await land(nc, sink, stream_life=f"new:{second}") == {"rows": 4, "dups": 0, "key": "O#2"}
    assert sorted(landed_keys("parquet", tmp_path, None)) == sorted(
        [("O", s) for s in range(1, 10)] + [("O#2", s) for s in range(1, 5)])


async def test_cg_lag_shows_the_origins_life_and_records_a_new_one(nc, nats_server, tmp_path):
    """``cg lag --sink``: the origin's creation time and the key it lands as; after the stream
    is created again, that it is another life; ``--stream-life new:<created>`` records it, and
    the jobs land it with no option of their own."""
    import json

    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
    from tests.support.badinput import acg

    lake = tmp_path / "lake"
    first = await new_life(nc, 6)
    assert (await land(nc, ParquetLakeSink(lake, fsync=False)))["rows"] == 6
    base = ("lag", "O", "g", "--server", nats_server.url, "--sink", "parquet", "--sink-path", str(lake))
    a = await acg(*base, "--json")
    assert a.rc == 0, a.err
    assert json.loads(a.out)["origin_life"] == {"created": first, "key": "O", "known": True, "went_back": None,
                                                "lives": [{"created": first, "key": "O", "from_seq": 1}]}
    second = await new_life(nc, 4)
    a = await acg(*base)
    assert a.rc == 0 and "ANOTHER LIFE" in a.out and f"--stream-life new:{second}" in a.out, a.out
    bad = await acg(*base, "--stream-life", "new:yesterday")
    assert bad.rc == 1 and bad.err.startswith("cg: error: stream_life: names a stream created at"), bad.err
    assert ParquetLakeSink(lake).stream_lives("O") == [Life(first, "O")]  # nothing recorded
    a = await acg(*base, "--stream-life", f"new:{second}")
    assert a.rc == 0 and f"created {second}, lands as O#2" in a.out, a.out
    assert await land(nc, ParquetLakeSink(lake, fsync=False)) == {"rows": 4, "dups": 0, "key": "O#2"}
