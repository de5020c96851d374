"""A group's source after its origin's server was lost, on three real nats-servers: the origin on
one server, the group's work queue on another. While the origin's server is down, nats-server
backs off re-creating the source's consumer (up to two minutes), and its own ``lag`` reads 0;
``cg status`` counts the true lag from the origin and names the stalled source, and a member job
(the holder of partition 0) starts it again, so every message lands within seconds of the
cluster being healthy, exactly once and in per-key order (``core/groups/sourcing.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.landing.contract import BatchOptions
from airflow_provider_cg.core.landing.run.member import run_member_batch
from airflow_provider_cg.core.tools.server import EmbeddedNatsCluster
from tests.support.member_job import assert_exactly_once, parquet_landed, publish_orders

pytestmark = pytest.mark.integration

STREAM, GROUP = "O", "g"
DOWN_S = 30.0  # long enough for the source to be silent past its health check, and to back off


async def _until(check, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(step)


@pytest.mark.parametrize("layout", ["work-queue", "partition-streams"])
async def test_a_stalled_source_is_named_and_started_again(tmp_path, layout):
    cluster = EmbeddedNatsCluster(3, tmp_path / "cluster", tagged=True).start()
    try:
        nc = await NatsConnectionSettings(servers=cluster.urls).connect()
        api, groups = JsApi(nc), ConsumerGroups(nc)

        async def placed() -> bool:
            try:
                await api.add_stream({"name": STREAM, "subjects": ["orders.*"], "storage": "file",
                                      "placement": {"tags": ["cg-n0"]}})
                return True
            except Exception:  # noqa: BLE001 - the cluster's meta leader still being elected
                return False

        assert await _until(placed, 30)
        await groups.create(STREAM, GROUP, ElasticGroupConfig(2, (PartitioningFilter("orders.*", (1,)),),
                                                             members=("m1",)), layout=layout)
        # the stream that sources the origin (the work queue, or the partition log) on another server
        sourcing = f"{STREAM}-{GROUP}" if layout == "work-queue" else f"{STREAM}-{GROUP}-log"
        config = (await api.stream_info(sourcing))["config"]
        await api.request(f"STREAM.UPDATE.{sourcing}", {**config, "placement": {"tags": ["cg-n1"]}})

        async def moved() -> bool:
            info = (await api.stream_info(sourcing))["cluster"]
            return info.get("leader") == "cg-n1" and not info.get("replicas")

        assert await _until(moved, 60)
        expected = await publish_orders(nc, STREAM, GROUP, 500, 20)

        cluster.servers[0].kill()  # the origin's server
        await asyncio.sleep(DOWN_S)
        cluster.servers[0].start()
        healthy_at = time.monotonic()

        async def published() -> dict | None:
            try:
                return await publish_orders(nc, STREAM, GROUP, 500, 20, wait_sourced=False)
            except Exception:  # noqa: BLE001 - the origin's leader coming back
                return None

        more = await _until(published, 30, 0.5)
        assert more, "the origin took no message after its server came back"
        expected |= more
        status = await groups.status(STREAM, GROUP)
        sources = (await api.stream_info(sourcing))["sources"]
        # what the server says is not what the origin holds: the tools count from the origin
        assert status.source_lag == 500 and status.source_stalled, (status.source_lag, status.source_stalled, sources)
        assert "has not taken" in status.source_stalled
        from airflow_provider_cg.core.groups.lag import group_lag
        from airflow_provider_cg.metrics import lag_metrics
        from airflow_provider_cg.triggers.overflow import measure

        figures = measure(status, None)
        assert figures["source_lag"] == 500 and figures["source_stalled"]
        metrics, _ = lag_metrics("c", [(await group_lag(nc, STREAM, GROUP, status=status)).to_dict()], observe=False)
        assert {m.name: m.value for m in metrics if m.name.startswith("cg_group_source")} == {
            "cg_group_source_lag_messages": 500.0, "cg_group_source_stalled": 1.0}

        sink_dir = tmp_path / "lake"
        from airflow_provider_cg.core.landing.sinks import ParquetLakeSink

        sink = ParquetLakeSink(sink_dir, fsync=False)
        follower = asyncio.create_task(run_member_batch(nc, sink, BatchOptions(
            stream=STREAM, group=GROUP, member="m1", batch_size=200, standby_timeout=10, idle_timeout=0.5,
            follow=45.0, commit_interval=0.5)))
        try:
            async def all_landed() -> bool:
                return follower.done() or len(parquet_landed(sink_dir)) == len(expected)

            if not (await _until(all_landed, 30, 0.5) and not follower.done()):
                raise AssertionError(f"not landed within 30 s: {await _where_they_are(api, sourcing)}")
            landed_after = time.monotonic() - healthy_at
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            sink.close()
        assert_exactly_once(parquet_landed(sink_dir), expected)
        assert (await groups.status(STREAM, GROUP)).source_lag == 0
        print(f"everything landed {landed_after:.1f} s after the origin's server was back")
        await nc.close()
    finally:
        cluster.cleanup()


async def _where_they_are(api: JsApi, sourcing: str) -> dict:
    """What each stream on the way holds, and its source's or mirror's state (for a failure)."""
    names = [STREAM, sourcing] + [f"{STREAM}-{GROUP}-p{p}" for p in range(2)] + [f"{STREAM}-{GROUP}"]
    seen = {}
    for name in names:
        try:
            info = await api.stream_info(name)
        except Exception as e:  # noqa: BLE001 - a diagnostic
            seen[name] = repr(e)
            continue
        if info is None:
            continue
        seen[name] = {"state": {k: info["state"].get(k) for k in ("messages", "first_seq", "last_seq")},
                      "leader": (info.get("cluster") or {}).get("leader"),
                      "sources": info.get("sources"), "mirror": info.get("mirror")}
    return seen
