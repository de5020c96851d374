"""A ``cg_member`` query landing through ``SinkBatches`` checks the origin as the member job does
(``core/landing/protocol/origin_guard.py``), under real ``spark-submit`` and a real nats-server.

The member job lands 800 orders into a Parquet lake; the server then comes back on a copy of its
store taken at 500 and takes 300 other orders at 501-800. A query from a new checkpoint into
that lake fails its first batch naming the sequence the origin went back to (nothing written,
nothing acknowledged); run with ``stream_life="went-back:500"`` it lands the 300 new orders
beside the lost ones, under the stream's second life key: every order of both lives once, in
per-key order."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.run.member import run_member_batch
from airflow_provider_cg.core.landing.stream_life import life_key
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    wq_messages,
)
from tests.support.store_copy import StoreCopy
from tests.support.streaming import STREAM, start_streaming_app

pytestmark = [pytest.mark.integration, pytest.mark.spark]


async def _member_job(nc, lake) -> None:
    from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

    sink = ParquetLakeSink(lake, fsync=False)
    try:
        s = await run_member_batch(nc, sink, BatchOptions(stream=STREAM, group="g", member="m1", batch_size=200,
                                                          standby_timeout=5, idle_timeout=0.5))
        assert s.messages_read > 0
    finally:
        sink.close()


async def test_sink_batches_refuses_an_origin_that_went_back_then_lands_its_new_life(
        nats_server, nats_settings, member_job_zip, tmp_path):
    lake = tmp_path / "lake"
    nc = await nats_settings.connect()
    await create_group(nc, STREAM, "g", partitions=3, members=("m1",))
    expected = await publish_orders(nc, STREAM, "g", 500, 7)
    await _member_job(nc, lake)
    await nc.close()
    older = StoreCopy(nats_server, tmp_path / "older").take()

    nc = await nats_settings.connect()
    expected |= await publish_orders(nc, STREAM, "g", 300, 7)  # 501-800: landed, then lost
    await _member_job(nc, lake)
    assert_exactly_once(parquet_landed(lake), expected)
    await nc.close()

    older.put_back()
    nc = await nats_settings.connect()
    try:
        new = await publish_orders(nc, STREAM, "g", 300, 7, payload=lambda i: b'{"after":%d}' % i)
        assert sorted(seq for _, seq in new) == list(range(501, 801))
        before = parquet_landed(lake)

        def query(checkpoints: str, *more: str):
            return start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=[
                "--stream", STREAM, "--sink-batches", f"g:m1:{lake}", "--checkpoints", str(tmp_path / checkpoints),
                "--trigger", "now", *more])

        refused = await asyncio.to_thread(query("ck1").wait, 240)
        assert refused.returncode != 0, refused.describe()
        assert "origin stream 'ORD' went back to sequence 500" in refused.output, refused.describe()
        assert "--stream-life went-back:500" in refused.output
        assert parquet_landed(lake) == before  # nothing written
        assert await wq_messages(nc, STREAM, "g") == 300  # nothing acknowledged

        landed = await asyncio.to_thread(query("ck2", "--stream-life", "went-back:500").wait, 240)
        assert landed.returncode == 0, landed.describe()
        second = life_key(STREAM, 2)
        assert_exactly_once(parquet_landed(lake), {**expected, **{(second, seq): key for (_, seq), key in new.items()}})
        assert await wq_messages(nc, STREAM, "g") == 0
    finally:
        await nc.close()
