"""The member job into Delta and Iceberg tables through a real ``spark-submit``: two members
into one Delta table on local disk and on MinIO (Spark tasks writing a transformation's files
straight to the object store), an Iceberg table in a SQLite catalog; exactly once and in
per-key order, read back by delta-rs / pyiceberg; bad object-store input exits 1 naming the
setting, with no secret in the output and nothing written."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    delta_landed,
    iceberg_landed,
    publish_orders,
    run_member_job,
    start_member_job,
)
from tests.support.spark_reader import spark_read_delta

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.integration, pytest.mark.spark]

STREAM, GROUP = "ORDERS", "g1"


def _ok(result) -> dict:
    assert result.returncode == 0, result.describe()
    assert result.summary is not None and result.summary["result"] == "committed", result.describe()
    return result.summary


async def _two_members(zip_path, tmp_path, nats_server, env, sink_args, spark=True, batch_size=4000):
    jobs = [start_member_job(zip_path, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP, member=m,
                             sink=sink_args[0], sink_path=sink_args[1], env=env, spark=spark,
                             args=["--batch-size", str(batch_size), *sink_args[2:]]) for m in ("m1", "m2")]
    return [await asyncio.to_thread(j.wait, 300) for j in jobs]


async def test_two_members_land_into_one_delta_table_on_local_disk(nc, nats_server, member_job_zip, tmp_path):
    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1", "m2"))
    expected = await publish_orders(nc, STREAM, GROUP, 10_000, 300)
    table = str(tmp_path / "orders_delta")
    # raw rows: the jobs land them from the driver (the same protocol; Spark's tasks writing a
    # table's files are the next test's), and Spark reads the table
    # one batch per member: two versions for Spark to read back one by one (each costs it seconds)
    results = await _two_members(member_job_zip, tmp_path, nats_server, {},
                                 ("delta", table, "--partition-by", "partition"), spark=False, batch_size=6000)
    assert sum(_ok(r)["rows_written"] for r in results) == 10_000
    assert_exactly_once(delta_landed(table), expected)
    from deltalake import DeltaTable

    assert DeltaTable(table).metadata().partition_columns == ["partition"]
    # Spark's own Delta reader (delta-spark) agrees, partitioned: every row once, and each version adds
    # whole batches (no version shows part of one), versions counted as delta-rs counts them
    from tests.support.member_job import read_delta

    seen = spark_read_delta(table, tmp_path)
    assert seen["rows"] == seen["distinct"] == 10_000, seen
    assert {"origin_stream", "origin_seq", "key", "partition"} <= set(seen["columns"])
    rows_at = {version: read_delta(table, ["origin_seq"], version=version).num_rows for version in seen["per_version"]}
    assert seen["per_version"] == rows_at and seen["per_version"][max(rows_at)] == 10_000
    counts = [rows_at[v] for v in sorted(rows_at)]
    growing = sum(1 for a, b in zip([0, *counts], counts, strict=False) if b > a)
    assert growing == sum(r.summary["batches"] for r in results), (counts, [r.summary for r in results])


async def test_a_transformation_lands_into_delta_on_object_storage(nc, nats_server, member_job_zip, tmp_path,
                                                                   minio_server, s3_bucket):
    """Spark tasks write the transformed batch's files into the bucket; one Delta commit per
    batch publishes them; the credentials reach the job as environment only."""
    from airflow_provider_cg.core.landing.sinks.delta.writer import delta_storage_options
    from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

    await create_group(nc, STREAM, GROUP, partitions=4, members=("m1", "m2"))
    expected = await publish_orders(nc, STREAM, GROUP, 6_000, 100)
    table = f"s3://{s3_bucket}/orders"
    # the table is partitioned by a column the transformation derives: Spark's tasks split their files by it
    sql = "SELECT origin_stream, origin_seq, key, partition, payload_text, concat('lane', partition % 2) AS lane " \
          "FROM batch"
    results = await _two_members(member_job_zip, tmp_path, nats_server, minio_server.env(),
                                 ("delta", table, "--transform-sql", sql, "--partition-by", "lane"))
    for r in results:
        _ok(r)
        assert minio_server.password not in r.output and minio_server.password not in " ".join(r.cmd)
    opts = delta_storage_options(ObjectStoreSettings.from_env(minio_server.env()))
    assert_exactly_once(delta_landed(table, opts), expected)
    import pyarrow as pa
    from deltalake import DeltaTable

    from tests.support.member_job import read_delta

    dt = DeltaTable(table, storage_options=opts)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    assert dt.metadata().partition_columns == ["lane"] and set(actions["partition.lane"]) == {"lane0", "lane1"}
    # Spark's tasks write one file per partition per commit (the batch is repartitioned by lane)
    assert len(actions["path"]) <= 2 * sum(r.summary["batches"] for r in results), actions["path"]
    lane1 = read_delta(table, ["partition"], opts, partitions=[("lane", "=", "lane1")])
    assert set(lane1.column("partition").to_pylist()) == {1, 3}


async def test_one_member_lands_into_an_iceberg_table(nc, nats_server, member_job_zip, tmp_path):
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    expected = await publish_orders(nc, STREAM, GROUP, 8_000, 100)
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    result = await asyncio.to_thread(
        run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url, stream=STREAM, group=GROUP,
        member="m1", sink="iceberg", args=["--batch-size", "3000", "--iceberg-table", "lake.orders",
                                           "--iceberg-catalog-uri", catalog,
                                           "--iceberg-warehouse", str(tmp_path / "warehouse"),
                                           "--iceberg-catalog-name", "lakehouse",
                                           "--partition-by", "bucket(3, key), day(timestamp)"])
    assert _ok(result)["rows_written"] == 8_000
    assert_exactly_once(iceberg_landed(catalog, "lake.orders", catalog_name="lakehouse"), expected)
    from pyiceberg.catalog.sql import SqlCatalog

    tbl = SqlCatalog("lakehouse", uri=catalog).load_table("lake.orders")  # under the name other engines use
    assert [str(f.transform) for f in tbl.spec().fields] == ["bucket[3]", "day"]
    assert len({t.file.partition[0] for t in tbl.scan().plan_files()}) == 3


async def test_object_store_bad_input_exits_1_naming_the_setting(nc, nats_server, member_job_zip, tmp_path,
                                                                 minio_server, s3_bucket):
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    await publish_orders(nc, STREAM, GROUP, 10, 5)
    cases = [
        (minio_server.env(), "s3://no-such-bucket/t", "--sink-path: bucket 'no-such-bucket' does not exist"),
        (minio_server.env(AWS_SECRET_ACCESS_KEY="refused-secret-1"), f"s3://{s3_bucket}/t",
         "aws credentials: refused by the object store"),
    ]
    for env, path, message in cases:
        r = await asyncio.to_thread(run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url,
                                    stream=STREAM, group=GROUP, member="m1", sink="delta", sink_path=path, env=env,
                                    args=["--no-spark"])
        assert r.returncode == 1, r.describe()
        assert message in r.output, r.describe()
        assert "Traceback" not in r.output and env["AWS_SECRET_ACCESS_KEY"] not in r.output
    unreachable = minio_server.env(AWS_ENDPOINT_URL="http://127.0.0.1:9")
    r = await asyncio.to_thread(run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url,
                                stream=STREAM, group=GROUP, member="m1", sink="delta", sink_path=f"s3://{s3_bucket}/t",
                                env=unreachable, args=["--no-spark"])
    assert r.returncode == 2 and "object store http://127.0.0.1:9 unreachable" in r.output, r.describe()
    from tests.support.member_job import wq_messages

    assert await wq_messages(nc, STREAM, GROUP) == 10  # nothing acknowledged


async def test_a_member_lands_into_a_rest_catalog_table_with_its_token_in_the_environment(
        nc, nats_server, member_job_zip, tmp_path, rest_catalog):
    """A real Iceberg REST catalog (tests/support/iceberg_rest.py) that refuses requests without
    its bearer token: the job gets the token as environment only, lands exactly once into a
    partitioned table, and never prints the token; without it the job exits 1 naming the setting."""
    await create_group(nc, STREAM, GROUP, partitions=2, members=("m1",))
    expected = await publish_orders(nc, STREAM, GROUP, 3_000, 100)
    table = f"r{tmp_path.name[-6:].replace('-', '_')}.orders"
    args = ["--batch-size", "1000", "--iceberg-table", table, "--iceberg-catalog-uri", rest_catalog.url,
            "--iceberg-warehouse", str(tmp_path / "warehouse"), "--partition-by", "partition"]
    refused = await asyncio.to_thread(run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url,
                                      stream=STREAM, group=GROUP, member="m1", sink="iceberg", args=args, spark=False)
    assert refused.returncode == 1 and "--iceberg-catalog-uri: the REST catalog refused" in refused.output, \
        refused.describe()
    result = await asyncio.to_thread(run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url,
                                     stream=STREAM, group=GROUP, member="m1", sink="iceberg", args=args, spark=False,
                                     env=rest_catalog.env())
    assert _ok(result)["rows_written"] == 3_000
    assert rest_catalog.token not in result.output and rest_catalog.token not in " ".join(result.cmd)
    from pyiceberg.catalog.rest import RestCatalog

    tbl = RestCatalog("rest", uri=rest_catalog.url, token=rest_catalog.token).load_table(table)
    got = tbl.scan(selected_fields=("origin_stream", "origin_seq")).to_arrow()
    keys = list(zip(got.column("origin_stream").to_pylist(), got.column("origin_seq").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == len(expected) and set(keys) == set(expected)
    assert [str(f.transform) for f in tbl.spec().fields] == ["identity"]
