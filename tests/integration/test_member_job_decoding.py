"""Payload decoding in Spark tasks, through real spark-submit: Avro with a schema (Spark's Avro
package from Maven Central), text; payloads Spark cannot decode go to the dead-letter stream
while the rest lands exactly once, in per-key order, through a crash and a rerun."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.landing.pipeline.decode import SPARK_AVRO_PACKAGE, SparkDecoder
from tests.support.member_job import (
    assert_exactly_once,
    create_group,
    parquet_landed,
    publish_orders,
    start_member_job,
    wq_messages,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TRANSFORMS = Path(__file__).resolve().parents[1] / "support" / "transforms.py"
AVRO_SCHEMA = {"type": "record", "name": "Order", "fields": [
    {"name": "order_id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"}, {"name": "status", "type": "string"},
    {"name": "items", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None}]}
N, POISON = 900, {17: b"\xff" * 12, 400: b"\x02"}  # a long that never ends; a record cut short


def _avro(i: int) -> bytes:
    import fastavro

    if i in POISON:
        return POISON[i]
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO_SCHEMA), {
        "order_id": i, "customer": f"c{i % 20}", "amount": float(i % 97), "status": "cancelled" if i % 10 == 3 else "paid",
        "items": [f"sku{i % 7}"] * (i % 3), "note": None if i % 2 else "gift"})
    return buf.getvalue()


def _dead_lettered(msgs: list[dict]) -> dict[int, tuple[bytes, str]]:
    out = {}
    for m in msgs:
        headers = base64.b64decode(m["hdrs"]).decode()
        seq = int(next(h for h in headers.splitlines() if h.startswith("Cg-Origin-Seq:")).split(":", 1)[1])
        error = next(h for h in headers.splitlines() if h.startswith("Cg-Error:")).split(":", 1)[1].strip()
        out[seq] = (base64.b64decode(m["data"]), error)
    return out


async def _dlq(nc, stream: str) -> list[dict]:
    api = JsApi(nc)
    info = await api.stream_info(f"{stream}-g-dlq")
    first, n = int(info["state"]["first_seq"]), int(info["state"]["messages"])
    return [await api.get_msg(f"{stream}-g-dlq", first + i) for i in range(n)]


@pytest.mark.parametrize("read", ["auto", "consumer"])
async def test_avro_decoded_by_spark_lands_once_in_order_through_a_crash(nc, nats_server, member_job_zip, tmp_path,
                                                                         read):
    stream = f"AV{read[0].upper()}"
    await create_group(nc, stream, "g", partitions=3, members=("m1",), subjects_prefix=stream.lower())
    published = await publish_orders(nc, stream, "g", N, 20, subjects_prefix=stream.lower(), payload=_avro)
    first = min(seq for _, seq in published)
    expected = {k: v for k, v in published.items()
                if (k[1] - first) not in POISON and (k[1] - first) % 10 != 3}  # paid, decodable

    def job(name, failpoint=None):
        return start_member_job(
            member_job_zip, tmp_path / name, nats_servers=nats_server.url, stream=stream, group="g", member="m1",
            sink_path=tmp_path / "lake", py_files=[TRANSFORMS], spark_options=["--packages", SPARK_AVRO_PACKAGE],
            args=["--payload-format", "avro", "--avro-schema", json.dumps(AVRO_SCHEMA), "--transform",
                  "transforms:paid_rows", "--batch-size", "250", "--read", read, "--max-deliver", "2"],
            env={"CG_FAILPOINT": failpoint} if failpoint else None)

    crashed = await asyncio.to_thread(job("crash", "mid_ack").wait, 300)
    assert crashed.returncode != 0 and "cg failpoint mid_ack" in crashed.output, crashed.describe()
    rerun = await asyncio.to_thread(job("rerun").wait, 300)
    assert rerun.returncode == 0 and "Traceback" not in rerun.output, rerun.describe()
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    assert await wq_messages(nc, stream, "g") == 0
    dead = _dead_lettered(await _dlq(nc, stream))
    assert {seq - first: data for seq, (data, _) in dead.items()} == POISON
    assert {err for _, err in dead.values()} == {"payload: not Avro of the schema"}


async def test_avro_without_spark_avro_package_is_a_clear_error(nc, nats_server, member_job_zip, tmp_path):
    await create_group(nc, "AVX", "g", partitions=1, members=("m1",), subjects_prefix="avx")
    await publish_orders(nc, "AVX", "g", 5, 1, subjects_prefix="avx", payload=_avro)
    r = await asyncio.to_thread(start_member_job(
        member_job_zip, tmp_path, nats_servers=nats_server.url, stream="AVX", group="g", member="m1",
        sink_path=tmp_path / "lake",
        args=["--payload-format", "avro", "--avro-schema", json.dumps(AVRO_SCHEMA)]).wait, 240)
    assert r.returncode == 1 and "Traceback" not in r.output, r.describe()
    assert "payload-format: avro needs Spark's Avro package" in r.output
    assert not (tmp_path / "lake").exists()  # nothing written
    assert await wq_messages(nc, "AVX", "g") == 5


async def test_text_decoded_by_spark_with_sql_dead_letters_invalid_utf8(nc, nats_server, member_job_zip, tmp_path):
    """Text through a SQL statement; invalid UTF-8 is retried through the consumer, then
    dead-lettered; the rest lands once, in per-key order."""
    await create_group(nc, "TX", "g", partitions=2, members=("m1",), subjects_prefix="tx")
    bad_at = 123
    published = await publish_orders(nc, "TX", "g", 600, 9, subjects_prefix="tx",
                                      payload=lambda i: b"caf\xe9 \xff" if i == bad_at else f"order {i}".encode())
    first = min(seq for _, seq in published)
    expected = {k: v for k, v in published.items() if k[1] - first != bad_at}
    r = await asyncio.to_thread(start_member_job(
        member_job_zip, tmp_path, nats_servers=nats_server.url, stream="TX", group="g", member="m1",
        sink_path=tmp_path / "lake",
        args=["--payload-format", "text", "--read", "consumer", "--max-deliver", "2", "--batch-size", "200",
              "--transform-sql", "SELECT origin_stream, origin_seq, key, partition, upper(payload_text) AS text "
                                 "FROM batch"]).wait, 300)
    assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
    assert r.summary["dead_lettered"] == 1 and r.summary["poison_deliveries"] == 2, r.summary
    assert_exactly_once(parquet_landed(tmp_path / "lake"), expected)
    dead = _dead_lettered(await _dlq(nc, "TX"))
    assert dead == {first + bad_at: (b"caf\xe9 \xff", "payload: not valid UTF-8")}
    assert await wq_messages(nc, "TX", "g") == 0


async def test_schemas_spark_refuses_are_clear_errors_before_anything_is_read(nc, nats_server, member_job_zip,
                                                                              tmp_path):
    """A DDL schema Spark cannot parse and an Avro schema Spark's Avro package refuses end the
    job with exit 1 naming the option, before the lake is made or a message is taken."""
    await create_group(nc, "BS", "g", partitions=1, members=("m1",), subjects_prefix="bs")
    await publish_orders(nc, "BS", "g", 3, 1, subjects_prefix="bs")
    bad_avro = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "no_such_type"}]}
    for args, options, field in [
        (["--payload-format", "json", "--json-schema", "id BIGINTEGER,"], [], "--json-schema: not a valid Spark DDL schema"),
        (["--payload-format", "avro", "--avro-schema", json.dumps(bad_avro)], ["--packages", SPARK_AVRO_PACKAGE],
         "--avro-schema: Spark refuses it"),
    ]:
        r = await asyncio.to_thread(start_member_job(
            member_job_zip, tmp_path, nats_servers=nats_server.url, stream="BS", group="g", member="m1",
            sink_path=tmp_path / "lake", spark_options=options, args=args).wait, 240)
        assert r.returncode == 1 and "Traceback" not in r.output, r.describe()
        assert f"cg_member_job: error: {field}" in r.output, r.describe()
        assert not (tmp_path / "lake").exists()
    assert await wq_messages(nc, "BS", "g") == 3


@pytest.mark.parametrize("schema", ["INT", "array<int>"])
def test_a_json_schema_that_is_not_a_list_of_fields_is_refused_naming_it(spark_session, schema):
    """Spark parses a lone type as a DDL schema too; the job needs the payload's fields."""
    with pytest.raises(ConfigError) as e:
        SparkDecoder(spark_session, "json", schema)
    assert e.value.field == "json_schema" and "fields" in e.value.rule


async def test_json_decoded_by_spark_into_postgres_one_row_per_message(nc, nats_server, member_job_zip, tmp_path,
                                                                        postgres_db):
    """No transformation, the PostgreSQL sink: Spark decodes, the rows come to the driver for the
    prepared transaction, one row per message keyed by (origin_stream, origin_seq) with the
    decoded value as jsonb; a payload that is not JSON of the schema is dead-lettered."""
    import psycopg2

    await create_group(nc, "PJ", "g", partitions=2, members=("m1",), subjects_prefix="pj")
    bad_at = 55
    published = await publish_orders(nc, "PJ", "g", 400, 6, subjects_prefix="pj",
                                      payload=lambda i: b'{"id": "x"' if i == bad_at else b'{"id": %d}' % i)
    first = min(seq for _, seq in published)
    r = await asyncio.to_thread(start_member_job(
        member_job_zip, tmp_path, nats_servers=nats_server.url, stream="PJ", group="g", member="m1", sink="postgres",
        args=["--pg-table", "pj_events", "--payload-format", "json", "--json-schema", "id BIGINT NOT NULL",
              "--batch-size", "150"], env={"CG_PG_DSN": postgres_db.dsn}).wait, 240)
    assert r.returncode == 0 and "Traceback" not in r.output, r.describe()
    assert r.summary["rows_written"] == 399 and r.summary["dead_lettered"] == 1, r.summary
    with psycopg2.connect(**postgres_db.conn_params()) as conn, conn.cursor() as cur:
        cur.execute("SELECT origin_seq, key, (value->>'id')::bigint FROM pj_events ORDER BY origin_seq")
        rows = cur.fetchall()
    assert [seq for seq, _, _ in rows] == sorted(seq for _, seq in published if seq - first != bad_at)
    assert all(v == seq - first and key == published[("PJ", seq)] for seq, key, v in rows)
    assert set(_dead_lettered(await _dlq(nc, "PJ"))) == {first + bad_at}
    assert await wq_messages(nc, "PJ", "g") == 0
