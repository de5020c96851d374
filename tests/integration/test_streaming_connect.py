"""The ``cg_member`` source from a Spark Connect client (``tests/apps/connect_client.py``, a
process of its own): the source registered in a remote session (its class and the NATS settings
travel to the server pickled by value), two available-now queries on a real Spark Connect
server, one into Spark's Parquet file sink, one through ``SinkBatches`` (its ``foreachBatch``
runs in the server's Python) into the provider's Parquet table. Every order once in each, in
per-key order; both backlogs acknowledged."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from tests.support.member_job import (
    Landed,
    assert_exactly_once,
    create_group,
    job_env,
    parquet_landed,
    publish_orders,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "apps" / "connect_client.py"


async def test_queries_from_a_spark_connect_client_land_every_order_once(nats_server, nats_settings, member_job_zip,
                                                                         tmp_path):
    from tests.support.spark_connect import SparkConnectServer

    nc = await nats_settings.connect()
    try:
        await create_group(nc, "ORD", "files", partitions=3, members=("m1",))
        await ConsumerGroups(nc).create("ORD", "lake", ElasticGroupConfig(
            3, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
        expected = await publish_orders(nc, "ORD", "files", 1500, 7)
        server = await asyncio.to_thread(SparkConnectServer(tmp_path / "connect", member_job_zip).start)
        try:
            out = tmp_path / "rows.json"
            r = await asyncio.to_thread(subprocess.run, [
                sys.executable, str(CLIENT), "--remote", server.remote, "--servers", nats_server.url,
                "--stream", "ORD", "--files", str(tmp_path / "files"), "--lake", str(tmp_path / "lake"),
                "--checkpoints", str(tmp_path / "ck"), "--out", str(out)],
                env=job_env(None), cwd=ROOT, capture_output=True, text=True,
                timeout=300)
        finally:
            await asyncio.to_thread(server.stop)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert_exactly_once([Landed(*row) for row in json.loads(await asyncio.to_thread(out.read_text))], expected)
        assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
        assert await wq_messages(nc, "ORD", "files") == 0 and await wq_messages(nc, "ORD", "lake") == 0
    finally:
        await nc.close()
