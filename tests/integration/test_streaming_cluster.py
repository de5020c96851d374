"""The ``cg_member`` source on a Spark standalone cluster (a master and a worker from PySpark's
own distribution, client deploy mode): the source's tasks (direct-get reads and pin checks) run
in the worker's executors, which get the NATS settings with the registered source, not from
their environment. Two queries of one application, one per group: the rows through
``DeltaBatches`` and through ``SinkBatches`` into the provider's Parquet table, available-now;
every order once in each table, in per-key order, and both groups' backlogs acknowledged."""

from __future__ import annotations

import asyncio
import sys

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from tests.support.member_job import assert_exactly_once, delta_landed, parquet_landed
from tests.support.streaming import CUSTOMERS, STREAM, Publisher, start_streaming_app, wq_left

pytestmark = [pytest.mark.integration, pytest.mark.spark]


async def test_queries_on_a_standalone_cluster_land_every_order_once(nats_server, nats_settings, member_job_zip,
                                                                     tmp_path, monkeypatch):
    from tests.support.spark_standalone import StandaloneCluster

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    nc = await nats_settings.connect()
    try:
        await nc.jetstream().add_stream(name=STREAM, subjects=["orders.*"])
        flt = (PartitioningFilter("orders.*", (1,)),)
        await ConsumerGroups(nc).create(STREAM, "raw", ElasticGroupConfig(3, flt, members=("m1",)))
        await ConsumerGroups(nc).create(STREAM, "lake", ElasticGroupConfig(3, flt, members=("m1",)))
        pub = Publisher(nats_server.url, 3_000, 100_000.0)
        await asyncio.to_thread(pub.run)
        assert pub.error is None and len(pub.orders) == 3_000
        raw, lake = str(tmp_path / "raw"), tmp_path / "lake"
        cluster = StandaloneCluster(tmp_path / "spark").start()
        try:
            r = await asyncio.to_thread(start_streaming_app(
                member_job_zip, tmp_path / "logs", nats_servers=nats_server.url, master=cluster.master,
                args=["--stream", STREAM, "--raw", f"raw:m1:{raw}", "--sink-batches", f"lake:m1:{lake}",
                      "--checkpoints", str(tmp_path / "ck"), "--trigger", "now",
                      "--option", "maxMessagesPerTrigger=1000"]).wait, 300)
            assert r.returncode == 0 and "CG_STREAM_DONE" in r.stdout, r.describe()
            executors = list((tmp_path / "spark" / "work").glob("app-*/*/stderr"))
            assert executors, "no executor ran on the standalone worker"
        finally:
            cluster.stop()
        expected = {(STREAM, q): f"k{o['id'] % CUSTOMERS}" for q, o in pub.orders.items()}
        assert_exactly_once(delta_landed(raw), expected)
        assert_exactly_once(parquet_landed(lake), expected)
        # the last batch of an available-now query is acknowledged as it ends
        assert await wq_left(nc, "raw") == 0 and await wq_left(nc, "lake") == 0
    finally:
        await nc.close()
