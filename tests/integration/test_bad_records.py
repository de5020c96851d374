"""A record without its merge key never merges: its message is taken out of the batch (to the
dead-letter stream with the reason) or, with ``bad_records=fail``, the run ends naming the
column before anything is prepared. Every sink that merges (Delta, Iceberg, PostgreSQL), read
back with its own reader, on the driver's path and Spark's (the user's transformation in a real
local SparkSession); the member job end to end, with executor reads, is at the bottom.

Before this rule a keyless record landed as a NULL-key row (Delta: one more per run, as NULL
never matches in MERGE) or silently replaced another keyless record (Iceberg)."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest

from airflow_provider_cg.core.landing.pipeline.bad_records import BadRecords
from airflow_provider_cg.core.landing.pipeline.decode import SparkDecoder
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, SparkPipeline
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.lake.lake_sink import STAGING_DIR
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from airflow_provider_cg.core.landing.transform import TransformError
from tests.support.sink_rows import refs_for, rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA = "id BIGINT, op STRING, version BIGINT, name STRING"
SQL = ("SELECT origin_stream, origin_seq, value.id AS id, value.op AS op, value.version AS version, "
       "value.name AS name FROM batch")


def _changes(seqs, keyless=()) -> pa.Table:
    """Rows whose payloads are JSON changes of ids 0-9 (every 7th a delete); ``keyless`` lack ``id``."""
    def payload(s):
        change = {"id": int(s) % 10, "op": "d" if s % 7 == 0 else "u", "version": int(s), "name": f"n{s}"}
        if s in keyless:
            del change["id"]
        return json.dumps(change).encode()

    return rows(seqs, extra=lambda q: {"payload": pa.array([payload(int(s)) for s in q], pa.binary())})


def _options(kind: str, tmp_path, request) -> SinkOptions:
    common = {"merge_keys": "id", "delete_when": "op = 'd'"}
    if kind == "delta":
        return SinkOptions(sink="delta", sink_path=str(tmp_path / "t"), **common)
    if kind == "iceberg":
        return SinkOptions(sink="iceberg", iceberg_table="lake.t", iceberg_catalog_uri=f"sqlite:///{tmp_path}/c.db",
                           iceberg_warehouse=str(tmp_path / "wh"), **common)
    pg = request.getfixturevalue("postgres_db")
    request.getfixturevalue("monkeypatch").setenv("CG_PG_DSN", pg.dsn)
    return SinkOptions(sink="postgres", pg_table="current", **common)


def _table(kind: str, options: SinkOptions, request) -> list[tuple]:
    """(id, version) rows as the format's own reader sees them."""
    if kind == "delta":
        from tests.support.member_job import read_delta

        t = read_delta(options.sink_path, ["id", "version"])
    elif kind == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        t = SqlCatalog("default", uri=options.iceberg_catalog_uri).load_table("lake.t").scan(
            selected_fields=("id", "version")).to_arrow()
    else:
        import psycopg2

        with psycopg2.connect(request.getfixturevalue("postgres_db").dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT id, version FROM current")
            got = cur.fetchall()
        conn.close()
        return sorted(got, key=lambda r: (r[0] is None, r))
    return sorted(zip(t.column("id").to_pylist(), t.column("version").to_pylist(), strict=True),
                  key=lambda r: (r[0] is None, r))


def _land(sink, processed, seqs, batch: BatchId):
    prepared = sink.prepare(batch, processed.rows, message_refs=refs_for(seqs), input_keys=processed.input_keys)
    return sink.commit(sink.mark_acking(prepared))


def _last_state(seqs, keyless) -> list[tuple]:
    state: dict[int, int] = {}
    for s in seqs:
        if s in keyless:
            continue
        if s % 7 == 0:
            state.pop(s % 10, None)
        else:
            state[s % 10] = s
    return sorted(state.items())


@pytest.mark.parametrize("kind", ["delta", "iceberg", "postgres"])
def test_a_record_without_its_key_is_dead_lettered_and_the_rest_merges(kind, spark_session, tmp_path, request):
    options = _options(kind, tmp_path, request)
    sink = open_sink(options, transformed=True)
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "json", SCHEMA), sql=SQL)
    first, second = list(range(1, 42)), list(range(42, 61))
    landed, keyless = [], set()
    for n, (seqs, missing) in enumerate(((first, {41}), (second, {45, 58})), start=1):
        table = _changes(seqs, keyless=missing)
        batch = BatchId("ORDERS", "g", "m1", n)
        processed = pipeline.process(sink, table, batch)
        refused = {table.column("origin_seq")[i].as_py(): why for i, why in processed.bad.items()}
        assert set(refused) == missing, refused  # the poison path: the member dead-letters them
        assert all("column 'id'" in why and "merge key" in why for why in refused.values()), refused
        assert set(processed.input_keys["ORDERS"]) == set(seqs) - missing  # recorded: only what landed
        _land(sink, processed, seqs, batch)
        landed += seqs
        keyless |= missing
        got = _table(kind, options, request)
        assert all(i is not None for i, _ in got), got  # never a row of no key
        assert got == _last_state(landed, keyless), (n, got)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_bad_records_fail_ends_the_batch_before_anything_is_prepared(kind, spark_session, tmp_path, request):
    options = _options(kind, tmp_path, request)
    sink = open_sink(options, transformed=True)
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "json", SCHEMA), sql=SQL,
                             bad_records="fail")
    with pytest.raises(BadRecords) as e:
        pipeline.process(sink, _changes(range(1, 30), keyless={12, 20}), BatchId("ORDERS", "g", "m1", 1))
    assert e.value.field == "column 'id'" and "2 message(s) (ORDERS #12, ORDERS #20)" in str(e.value), str(e.value)
    assert "nothing was acknowledged" in str(e.value)
    assert not list(sink.store.list(STAGING_DIR))  # nothing prepared, nothing left staged
    assert sink.recover("ORDERS", "g", "m1") == []


def test_a_transformation_that_loses_the_origin_of_a_keyless_row_is_refused(spark_session, tmp_path, request):
    """A row without its key must name its message to be dead-lettered: a transformation that
    rewrites ``origin_seq`` fails the run (exit 1) instead of landing or dropping anything."""
    options = _options("delta", tmp_path, request)
    sink = open_sink(options, transformed=True)
    sql = SQL.replace("origin_seq,", "origin_seq + 1000 AS origin_seq,")
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "json", SCHEMA), sql=sql)
    with pytest.raises(TransformError, match="names no message of the batch"):
        pipeline.process(sink, _changes(range(1, 10), keyless={3}), BatchId("ORDERS", "g", "m1", 1))


def test_rows_landed_as_read_without_their_key_are_refused_too(tmp_path):
    """The driver's path (no Spark): merging by a row column that is null on some rows."""
    sink = open_sink(SinkOptions(sink="delta", sink_path=str(tmp_path / "t"), merge_keys="key"))
    table = rows(range(1, 11))
    table = table.set_column(table.schema.get_field_index("key"), "key",
                             pa.array([None if s in (3, 7) else f"k{s}" for s in range(1, 11)]))
    processed = ArrowPipeline().process(sink, table, BatchId("ORDERS", "g", "m1", 1))
    assert sorted(processed.bad) == [2, 6] and processed.rows.num_rows == 8
    assert processed.rows.column("key").null_count == 0
    with pytest.raises(BadRecords, match="column 'key'"):
        ArrowPipeline(bad_records="fail").process(sink, table, BatchId("ORDERS", "g", "m1", 2))


# --- the member job end to end ---------------------------------------------------------------


async def test_the_member_job_with_bad_records_fail_stops_before_anything_is_acknowledged(nc, nats_server,
                                                                                          member_job_zip, tmp_path):
    """spark-submit, the issue's run: 40 changes and one without ``id``, ``--bad-records fail``:
    exit 1 naming the column and the message, one line, nothing acknowledged or written. (The
    default, dead-lettering through executor reads, is in test_routing.py's member job.)"""
    from tests.support.member_job import create_group, run_member_job, wq_messages

    await create_group(nc, "CDC", "g", partitions=1, members=("m1",))
    js = nc.jetstream()
    for s in range(1, 42):
        change = {"id": s % 10, "op": "d" if s % 7 == 0 else "u", "version": s, "name": f"n{s}"}
        if s == 41:
            del change["id"]
        await js.publish(f"orders.k{s % 10}", json.dumps(change).encode())
    for _ in range(200):  # until the work queue has sourced them
        if await wq_messages(nc, "CDC", "g") >= 41:
            break
        await asyncio.sleep(0.1)
    table = tmp_path / "current"
    r = await asyncio.to_thread(
        run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url, stream="CDC", group="g", member="m1",
        sink="delta", sink_path=table, args=["--payload-format", "json", "--json-schema", SCHEMA, "--transform-sql",
                                             SQL, "--merge-keys", "id", "--delete-when", "op = 'd'",
                                             "--bad-records", "fail"])
    assert r.returncode == 1, r.describe()
    assert "column 'id': a merge key, is null or missing in 1 message(s) (CDC #41)" in r.output, r.describe()
    assert "Traceback" not in r.output
    assert await wq_messages(nc, "CDC", "g") == 41  # nothing acknowledged
    assert not (table / "_delta_log").exists()  # nothing published
