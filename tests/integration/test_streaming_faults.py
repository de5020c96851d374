"""A running ``cg_member`` query through faults from outside, under real ``spark-submit`` and a
real nats-server. Stopped (SIGSTOP) for less than the consumer's priority timeout and continued,
it goes on. The server SIGKILLed and started again at a random moment keeps no pin, so the query
stops naming its pin; started again from its checkpoint it goes on. Every order is once in the
table, in per-key order, and acknowledged."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.publish import publish_many
from tests.support.member_job import assert_exactly_once, delta_landed, read_delta
from tests.support.streaming import CUSTOMERS, STREAM, start_streaming_app, wq_left

pytestmark = [pytest.mark.integration, pytest.mark.spark]


async def _publish(nats_settings, first_id: int, n: int) -> dict[tuple[str, int], str]:
    nc = await nats_settings.connect()
    try:
        orders = [{"id": i, "customer": f"c{i % CUSTOMERS}", "amount": 1.0, "ts": time.time()}
                  for i in range(first_id, first_id + n)]
        res = await publish_many(nc, [(f"orders.k{o['id'] % CUSTOMERS}", json.dumps(o).encode()) for o in orders])
        assert res.published == n
        return {(STREAM, res.first_seq + k): f"k{o['id'] % CUSTOMERS}" for k, o in enumerate(orders)}
    finally:
        await nc.close()


async def test_a_query_through_a_stall_and_server_restarts_lands_every_order_once(
        nats_server, nats_settings, member_job_zip, tmp_path):
    rnd = random.Random()
    nc = await nats_settings.connect()
    await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
    await ConsumerGroups(nc).create(STREAM, "raw", ElasticGroupConfig(
        3, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    await nc.close()
    raw = str(tmp_path / "raw")
    args = ["--stream", STREAM, "--raw", f"raw:m1:{raw}", "--checkpoints", str(tmp_path / "ck"), "--trigger", "1",
            "--option", "maxMessagesPerTrigger=300", "--option", "pinTimeout=60"]

    def rows() -> int:
        log = tmp_path / "raw" / "_delta_log"
        return len(read_delta(raw, ["origin_seq"])) if log.exists() and any(log.glob("*.json")) else 0

    async def until_landing(app) -> None:
        before, deadline = rows(), time.monotonic() + 180
        while rows() == before:
            assert app.running() and time.monotonic() < deadline, app.result().describe()
            await asyncio.sleep(0.3)

    expected = await _publish(nats_settings, 0, 1500)
    app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=args)
    try:
        await until_landing(app)
        app.signal(signal.SIGSTOP)  # a stall shorter than the consumer's priority timeout (5 s)
        await asyncio.sleep(2.0)
        app.signal(signal.SIGCONT)
        expected |= await _publish(nats_settings, 1500, 500)
        await until_landing(app)  # it goes on
        # the server SIGKILLed and started again at a random moment of the query's batches
        await asyncio.sleep(rnd.uniform(0.0, 2.0))
        nats_server.kill()
        await asyncio.sleep(rnd.uniform(0.5, 3.0))
        nats_server.start()
        expected |= await _publish(nats_settings, 2000, 1000)
        # the server kept no pin: the query stops naming it (whatever it had not committed is read
        # again), and is started again from its checkpoint, as Airflow retries a task
        r = await asyncio.to_thread(app.wait, 180)
        assert r.returncode != 0 and "pin moved to another instance or the server let it go" in r.output, r.describe()
        app = start_streaming_app(member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, args=args)
        deadline = time.monotonic() + 240
        while rows() < len(expected):  # the restarted query lands the rest as it runs
            assert app.running() and time.monotonic() < deadline, (rows(), len(expected), app.result().describe())
            await asyncio.sleep(0.5)
    finally:
        app.kill()
    assert_exactly_once(delta_landed(raw), expected)
    nc = await nats_settings.connect()
    try:
        assert await wq_left(nc, "raw") <= 300  # all but the last batch acknowledged
    finally:
        await nc.close()
