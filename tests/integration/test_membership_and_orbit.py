"""Membership changes reach running member jobs, and orbit's own ``cg`` CLI (a real Go build
of Synadia orbit ``pcgroups``, see ``tests/support/orbit.py``) and ours work on the same groups.

Jobs run as the plain Python driver of the member job (``spark=False``): the protocol is the
same and a JVM per job would dominate these tests on a small machine.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_provider_cg.core.groups.admin import ConsumerGroups
from airflow_provider_cg.core.groups.codec import dump_config
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.jetstream.api import JsApi
from tests.support.member_job import (
    assert_exactly_once,
    parquet_landed,
    publish_orders,
    start_member_job,
)
from tests.support.orbit import OrbitCli, build_orbit_cg
from tests.support.prebuild import built

pytestmark = [pytest.mark.integration]

KEYS = 40


@pytest.fixture(scope="session")
def orbit_binary():
    return built(build_orbit_cg)


@pytest.fixture
def orbit(orbit_binary, nats_server, tmp_path) -> OrbitCli:
    return OrbitCli.for_server(orbit_binary, nats_server.url, tmp_path)


async def _publish_in_chunks(nc, stream, group, total, chunks, pause):
    expected = {}
    for _ in range(chunks):
        expected.update(await publish_orders(nc, stream, group, total // chunks, KEYS))
        await asyncio.sleep(pause)
    return expected


def _job(member_job_zip, tmp_path, nats_server, member, *args, stream="ORDERS", group="g"):
    return start_member_job(member_job_zip, tmp_path / member, nats_servers=nats_server.url, stream=stream,
                            group=group, member=member, sink_path=tmp_path / "lake", spark=False,
                            args=["--idle-timeout", "3", "--standby-timeout", "20", *args])


async def _kv_raw(nc, key="ORDERS.g", bucket="elastic-consumer-groups") -> bytes:
    return (await (await nc.jetstream().key_value(bucket)).get(key)).value


@pytest.mark.parametrize("changed_by", ["ours", "orbit"])
async def test_partition_moves_between_two_running_jobs(nc, nats_server, member_job_zip, tmp_path, changed_by,
                                                        request):
    """m1 alone holds 4 partitions and lands a stream being published; m2 is added (by our API
    or by orbit's CLI) while m1 runs: m1 finishes its batch in flight, hands its consumer over,
    goes on with partitions 0-1; m2's job takes 2-3. Nothing lost, nothing twice, per-key order."""
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
    if changed_by == "orbit":
        cli = request.getfixturevalue("orbit")
        cli.run("elastic", "create", "ORDERS", "g", "4", "orders.*", "1")
        cli.run("elastic", "add", "ORDERS", "g", "m1")
    else:
        await ConsumerGroups(nc).create("ORDERS", "g", ElasticGroupConfig(
            4, (PartitioningFilter("orders.*", (1,)),), members=("m1",)))
    expected = await publish_orders(nc, "ORDERS", "g", 30_000, KEYS)
    publisher = asyncio.create_task(_publish_in_chunks(nc, "ORDERS", "g", 6000, 12, 0.3))
    m1 = _job(member_job_zip, tmp_path, nats_server, "m1", "--batch-size", "100")
    try:
        assert await asyncio.to_thread(m1.wait_for_log, "cg pinned", 60), m1.wait(5).describe()
        if changed_by == "orbit":
            await asyncio.to_thread(cli.run, "elastic", "add", "ORDERS", "g", "m2")
        else:
            await ConsumerGroups(nc).add_members("ORDERS", "g", ["m2"])
        m2 = _job(member_job_zip, tmp_path, nats_server, "m2")
        expected.update(await publisher)
        r1 = await asyncio.to_thread(m1.wait, 120)
        r2 = await asyncio.to_thread(m2.wait, 120)
    finally:
        publisher.cancel()
        m1.kill()
        if "m2" in locals():
            m2.kill()
    assert r1.returncode == 0 and "Traceback" not in r1.output, r1.describe()
    assert r2.returncode == 0 and "Traceback" not in r2.output, r2.describe()
    assert "membership changed (partitions [0, 1, 2, 3] -> [0, 1])" in r1.output, r1.describe()
    assert r2.summary["rows_written"] > 0, r2.describe()
    assert set(r2.summary["partitions"]) <= {"2", "3"}, r2.summary
    # whatever arrived after the jobs went idle: a last run of each
    for member in ("m1", "m2"):
        last = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server, member, "--batch-size", "500").wait,
                                       120)
        assert last.returncode == 0, last.describe()
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    info = await JsApi(nc).stream_info("ORDERS-g")
    assert info["state"]["messages"] == 0
    consumers = {c["name"]: c["config"]["filter_subjects"] for c in await JsApi(nc).list_consumers("ORDERS-g")}
    for name, filters in consumers.items():  # re-created with the new filters (if not idled out)
        assert sorted(filters) == {"m1": ["0.>", "1.>"], "m2": ["2.>", "3.>"]}[name] if changed_by == "orbit" \
            else sorted(filters) == {"m1": ["0.orders.*", "1.orders.*"], "m2": ["2.orders.*", "3.orders.*"]}[name]


async def test_orbit_created_group_read_consumed_and_managed_by_ours(nc, nats_server, orbit, member_job_zip,
                                                                    tmp_path):
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
    orbit.run("elastic", "create", "ORDERS", "g", "4", "orders.*", "1", "--max-buffered-msgs", "100000")
    orbit.run("elastic", "add", "ORDERS", "g", "m1", "m2")
    raw = await _kv_raw(nc)
    cg = ConsumerGroups(nc)
    info = await cg.get("ORDERS", "g")
    # orbit v0.1's shape: one filter with its wildcards, read as such (not as whole-subject hashing)
    assert info.config.partitioning_filters == (PartitioningFilter("orders.*", (1,)),)
    assert info.config.max_buffered_msgs == 100000 and sorted(info.config.members) == ["m1", "m2"]
    assert dump_config(info.config) == raw  # written back byte for byte
    expected = await publish_orders(nc, "ORDERS", "g", 3000, KEYS)
    for member in ("m1", "m2"):
        r = await asyncio.to_thread(_job(member_job_zip, tmp_path, nats_server, member).wait, 120)
        assert r.returncode == 0 and r.summary["result"] == "committed", r.describe()
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    # our membership changes keep orbit's shape; orbit's CLI reads them
    await cg.add_members("ORDERS", "g", ["m3"])
    after = await _kv_raw(nc)
    assert json.loads(after) == {**json.loads(raw), "members": [*json.loads(raw)["members"], "m3"]}
    assert b'"filter":"orders.*","partitioning_wildcards":[1]' in after
    out = orbit.run("elastic", "info", "ORDERS", "g").stdout
    assert "m3" in out and "filter=orders.*" in out, out
    await cg.set_mappings("ORDERS", "g", {"m1": [0, 1], "m2": [2, 3]})
    out = orbit.run("elastic", "info", "ORDERS", "g").stdout
    assert "m1" in out and "[0 1]" in out, out
    orbit.run("elastic", "delete-mapping", "ORDERS", "g")
    assert (await cg.get("ORDERS", "g")).config.member_mappings == ()


async def test_groups_created_by_ours_listed_described_and_changed_by_orbit(nc, nats_server, orbit, tmp_path):
    await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
    from airflow_provider_cg.core.tools.cli import main as our_cg

    env_args = ["--server", nats_server.url]
    assert await asyncio.to_thread(our_cg, ["create", "elastic", "ORDERS", "g", "--max-members", "4",
                                            "--filter", "orders.*", "--wildcards", "1", "--members", "a,b",
                                            "--orbit-format", "v0.1", *env_args]) == 0
    assert await asyncio.to_thread(our_cg, ["create", "elastic", "ORDERS", "current", "--max-members",
                                            "2", "--filter", "orders.*", "--wildcards", "1", "--members", "a",
                                            *env_args]) == 0
    assert "[g current]" in orbit.run("elastic", "ls", "ORDERS").stdout.replace("[current g]", "[g current]")
    out = orbit.run("elastic", "info", "ORDERS", "g").stdout
    assert "filter=orders.*" in out and "[a b]" in out, out
    orbit.run("elastic", "add", "ORDERS", "g", "c")
    orbit.run("elastic", "drop", "ORDERS", "g", "a")
    cfg = (await ConsumerGroups(nc).get("ORDERS", "g")).config
    assert sorted(cfg.members) == ["b", "c"] and cfg.partitioning_filters == (PartitioningFilter("orders.*", (1,)),)
    # orbit v0.1 cannot read the current (v0.2) shape: it says so and changes nothing
    r = orbit.run("elastic", "info", "ORDERS", "current", check=False)
    assert r.returncode != 0
    assert (await ConsumerGroups(nc).get("ORDERS", "current")).config.members == ("a",)
