"""The ``cg_member`` source from a Spark Connect client: the source registered in a remote
session (its class and the NATS settings travel to the server pickled by value), two
available-now queries on a real Spark Connect server, one into Spark's Parquet file sink, one
through ``SinkBatches`` (its ``foreachBatch`` runs in the server's Python) into the provider's
Parquet table. Every order once in each, in per-key order; both backlogs acknowledged."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from tests.support.member_job import (
    Landed,
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


async def test_queries_from_a_spark_connect_client_land_every_order_once(nats_server, nats_settings, member_job_zip,
                                                                         tmp_path):
    from pyspark.sql import SparkSession

    from airflow_provider_cg.core.streaming import SinkBatches, register
    from tests.support.spark_connect import SparkConnectServer

    nc = await nats_settings.connect()
    try:
        await create_group(nc, "ORD", "files", partitions=3, members=("m1",))
        await ConsumerGroups(nc).create("ORD", "lake", ElasticGroupConfig(
            3, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
        expected = await publish_orders(nc, "ORD", "files", 1500, 7)
        server = await asyncio.to_thread(SparkConnectServer(tmp_path / "connect", member_job_zip).start)
        try:
            def run() -> tuple[list, object, object]:
                spark = SparkSession.builder.remote(server.remote).getOrCreate()
                try:
                    register(spark, nats_settings)

                    def member(group: str):
                        return spark.readStream.format("cg_member").option("stream", "ORD").option("group", group) \
                            .option("member", "m1").option("maxMessagesPerTrigger", "400").load()

                    files = member("files").select("origin_stream", "origin_seq", "partition", "key") \
                        .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck-files")) \
                        .trigger(availableNow=True).start(str(tmp_path / "files"))
                    lake = member("lake").writeStream.foreachBatch(SinkBatches(
                        stream="ORD", group="lake", member="m1", settings=nats_settings, sink="parquet",
                        sink_path=str(tmp_path / "lake"))) \
                        .option("checkpointLocation", str(tmp_path / "ck-lake")).trigger(availableNow=True).start()
                    for q in (files, lake):
                        q.awaitTermination(240)
                    rows = spark.read.parquet(str(tmp_path / "files")).orderBy("origin_seq").collect()
                    return rows, files.exception(), lake.exception()
                finally:
                    spark.stop()

            rows, files_error, lake_error = await asyncio.to_thread(run)
        finally:
            await asyncio.to_thread(server.stop)
        assert files_error is None and lake_error is None, (files_error, lake_error)
        assert_exactly_once([Landed(r.origin_stream, r.origin_seq, r.key, r.partition) for r in rows], expected)
        assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
        assert await wq_messages(nc, "ORD", "files") == 0 and await wq_messages(nc, "ORD", "lake") == 0
    finally:
        await nc.close()
