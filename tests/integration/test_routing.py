"""One group into several tables, exactly once (``core/landing/sinks/routing.py``): the routes'
rules, a crash between two tables' steps recovered table by table (the missing part lands, and
only it), rows routed by subject and by a column of a transformation's output (a real local
SparkSession), and the member job through spark-submit routing into Parquet, Delta and an
Iceberg upsert, every table read back by a reader that is not ours, every data file within
1.1x ``target_file_size``. The randomized outside-fault run with routes is in
``test_mixed_writers.py``."""

from __future__ import annotations

import asyncio
import base64
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.contract import MemberJobSpec, Summary
from airflow_provider_cg.core.landing.pipeline.decode import SparkDecoder
from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, SparkPipeline
from airflow_provider_cg.core.landing.protocol.two_phase import recover_writes
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from tests.support.member_job import read_delta
from tests.support.sink_rows import refs_for, rows

pytestmark = [pytest.mark.integration]


def _routes(tmp_path, by_subject: bool = True) -> dict:
    a = {"sink": "delta", "sink_path": str(tmp_path / "a")}
    b = {"sink": "iceberg", "iceberg_table": "lake.b", "iceberg_catalog_uri": f"sqlite:///{tmp_path}/c.db",
         "iceberg_warehouse": str(tmp_path / "wh")}
    if by_subject:  # sink_rows' subjects are orders.<seq % 3>
        a["subjects"], b["subjects"] = ["orders.0", "orders.1"], "orders.2"
    return {"a": a, "b": b}


def _seqs(kind: str, tmp_path, column: str = "origin_seq") -> list[int]:
    if kind == "a":
        return sorted(read_delta(str(tmp_path / "a"), [column]).column(column).to_pylist())
    from pyiceberg.catalog.sql import SqlCatalog

    t = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/c.db").load_table("lake.b").scan(
        selected_fields=(column,)).to_arrow()
    return sorted(t.column(column).to_pylist())


@pytest.mark.parametrize("bad, field", [
    ({"a": {"sink_path": "/x"}}, "routes.a.subjects"),
    ({"a": {"sink_path": "/x", "subjects": "x", "colour": 1}}, "routes.a.colour"),
    ({"a": {"sink_path": "/x", "subjects": "x"}, "b": {"sink_path": "/x/", "subjects": "y"}}, "routes.b"),
    ({"a": {"sink": "delta", "subjects": "x"}}, "routes.a.sink_path"),
    ({"a": {"sink_path": "/x", "subjects": "x", "merge_keys": "id"}}, "routes.a.merge_keys"),  # parquet merges nothing
    ({"a b": {"sink_path": "/x", "subjects": "x"}}, "routes"),
    ({"a": {"sink_path": "/x", "subjects": "x..y"}}, "routes.a.subjects"),
    ({}, "routes"),
    ("[1, 2]", "routes"),
    ("{not json", "routes"),
])
def test_bad_routes_are_refused_naming_the_route_and_option(bad, field):
    with pytest.raises(ConfigError) as e:
        SinkOptions.build({"routes": bad if isinstance(bad, str) else json.dumps(bad)})
    assert e.value.field == field, str(e.value)


def test_routes_rules_across_options():
    ok = {"a": {"sink_path": "/x"}, "b": {"sink_path": "/y"}}
    with pytest.raises(ConfigError, match="^sink_path: with routes, each route names its own table"):
        SinkOptions.build({"routes": ok, "sink_path": "/z", "route_by": "t"})
    with pytest.raises(ConfigError, match="^route_by: needs routes"):
        SinkOptions.build({"sink_path": "/z", "route_by": "t"})
    with pytest.raises(ConfigError, match="^routes.a.subjects: give route_by or each route's subjects, not both"):
        SinkOptions.build({"routes": {**ok, "a": {"sink_path": "/x", "subjects": "s"}}, "route_by": "t"})
    # every other option is the top level's unless a route gives its own; the job's argv round-trips
    spec = MemberJobSpec.build({"stream": "S", "group": "g", "member": "m1", "sink": "delta", "routes": ok,
                                "route_by": "t", "target_file_size": 1 << 21})
    assert [(n, o.sink, o.target_file_size) for n, o in spec.tables()] == [("a", "delta", 1 << 21),
                                                                          ("b", "delta", 1 << 21)]
    assert MemberJobSpec.from_argv(spec.to_argv()) == spec


def test_a_crash_between_two_tables_lands_the_missing_part_only(tmp_path):
    """Table a marked its write acking, then the job died before table b's mark (and so before
    any ack): a's recovery commits, b's rolls back, and the batch redelivered lands into b only
    -- each table holds each of its rows once."""
    options = SinkOptions.build({"routes": _routes(tmp_path)})
    sink, seqs = open_sink(options), list(range(1, 31))
    batch = BatchId("ORDERS", "g", "m1", 1)
    w = sink.prepare(batch, ArrowPipeline().process(sink, rows(seqs), batch).rows, message_refs=refs_for(seqs))
    sink.sinks["a"].mark_acking(w.parts["a"])  # ... and the job is SIGKILLed here

    summary = Summary("ORDERS", "g", "m1")
    again = open_sink(options)  # the member's next run
    committed = recover_writes(again, "ORDERS", "g", "m1", summary)
    assert [list(c.parts) for c in committed] == [["a"]] and summary.recovered_aborted == 1
    assert summary.routes["a"]["rows_written"] == 20
    assert _seqs("a", tmp_path) == [s for s in seqs if s % 3 != 2]
    batch = BatchId("ORDERS", "g", "m1", 2)  # the messages come again (nothing was acked)
    processed = ArrowPipeline().process(again, rows(seqs), batch)
    result = again.commit(again.mark_acking(again.prepare(batch, processed.rows, message_refs=refs_for(seqs))))
    assert (result.routes["a"].rows_written, result.routes["a"].duplicates_skipped) == (0, 20)
    assert result.routes["b"].rows_written == 10
    assert _seqs("a", tmp_path) == [s for s in seqs if s % 3 != 2]
    assert _seqs("b", tmp_path) == [s for s in seqs if s % 3 == 2]
    assert again.recover("ORDERS", "g", "m1") == []


@pytest.mark.spark
def test_a_transformations_rows_routed_by_a_column_recover_table_by_table(spark_session, tmp_path):
    """Routed by a column of the transformation's output; after the same crash, the batch is
    computed again with table a's share left out (a holds its inputs), so b gets its rows and a
    nothing new -- even though each table records every input of the batch."""
    options = SinkOptions.build({"routes": _routes(tmp_path, by_subject=False), "route_by": "route"})
    sql = ("SELECT origin_stream, origin_seq, key, CASE WHEN origin_seq % 3 = 0 THEN 'b' ELSE 'a' END AS route "
           "FROM batch WHERE origin_seq % 10 <> 7")

    def pipeline():
        return SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"), sql=sql)

    sink, seqs = open_sink(options, transformed=True), list(range(1, 41))
    want_a = [s for s in seqs if s % 3 != 0 and s % 10 != 7]
    want_b = [s for s in seqs if s % 3 == 0 and s % 10 != 7]
    batch = BatchId("ORDERS", "g", "m1", 1)
    processed = pipeline().process(sink, rows(seqs), batch)
    assert {n: sorted(p.input_keys["ORDERS"]) for n, p in processed.rows.parts.items()} == {"a": seqs, "b": seqs}
    w = sink.prepare(batch, processed.rows, message_refs=refs_for(seqs))
    sink.sinks["a"].mark_acking(w.parts["a"])  # the job dies here

    again = open_sink(options, transformed=True)
    recover_writes(again, "ORDERS", "g", "m1", Summary("ORDERS", "g", "m1"))
    batch = BatchId("ORDERS", "g", "m1", 2)
    processed = pipeline().process(again, rows(seqs), batch)
    assert not processed.rows.parts["a"].input_keys and sorted(processed.rows.parts["b"].input_keys["ORDERS"]) == seqs
    again.commit(again.mark_acking(again.prepare(batch, processed.rows, message_refs=refs_for(seqs))))
    assert _seqs("a", tmp_path) == want_a and _seqs("b", tmp_path) == want_b
    # a third delivery: every table holds every input, nothing is computed
    processed = pipeline().process(again, rows(seqs), BatchId("ORDERS", "g", "m1", 3))
    assert processed.skipped == len(seqs)


@pytest.mark.spark
def test_a_row_whose_route_names_no_table_is_dead_lettered(spark_session, tmp_path):
    options = SinkOptions.build({"routes": _routes(tmp_path, by_subject=False), "route_by": "route"})
    sql = ("SELECT origin_stream, origin_seq, CASE WHEN origin_seq = 5 THEN 'c' WHEN origin_seq = 6 THEN NULL "
           "ELSE 'a' END AS route FROM batch")
    sink = open_sink(options, transformed=True)
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"), sql=sql)
    processed = pipeline.process(sink, rows(range(1, 11)), BatchId("ORDERS", "g", "m1", 1))
    assert sorted(processed.bad) == [4, 5], processed.bad  # rows 5 and 6: their messages are poison
    assert "column 'route': names no route ('c'" in processed.bad[4] and "(None;" in processed.bad[5]
    assert sorted(processed.rows.parts["a"].input_keys["ORDERS"]) == [1, 2, 3, 4, 7, 8, 9, 10]


# --- the member job end to end -------------------------------------------------------------------


@pytest.mark.spark
async def test_the_member_job_routes_into_three_formats_at_the_target_file_size(nc, nats_server, member_job_zip,
                                                                              tmp_path):
    """spark-submit with executor reads, a transformation routing each order by a column into a
    Parquet lake, a Delta table and an Iceberg table upserted by key, each with a 1 MiB target:
    every table holds exactly its route's rows (read by pyarrow, delta-rs and pyiceberg), every
    data file is at most 1.1x the target (the file sizes those readers list), the summary and
    asset extras count per table -- and the records no table can take (an upsert without its
    key, a kind no route names) are dead-lettered with their reasons, the rest landing."""
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_provider_cg.assets import landed_extras
    from tests.support.member_job import create_group, run_member_job, wq_messages

    target = 1 << 20
    await create_group(nc, "ORD", "g", partitions=2, members=("m1",))
    js = nc.jetstream()
    n = 3600
    keyless, unrouted = {7, 301, 2999}, {11, 1200}
    for i in range(1, n + 1):  # ~2.7 kB each: ~3 MB a table in one batch, several files each
        order = {"id": i, "kind": "pdi"[i % 3], "blob": base64.b64encode(os.urandom(2000)).decode()}
        if i in keyless:
            order["kind"] = "i"
            del order["id"]
        if i in unrouted:
            order["kind"] = "x"
        await js.publish(f"orders.c{i % 50}", json.dumps(order).encode())
    for _ in range(200):
        if await wq_messages(nc, "ORD", "g") >= n:
            break
        await asyncio.sleep(0.1)
    catalog = f"sqlite:///{tmp_path}/c.db"
    routes = {
        "p": {"sink": "parquet", "sink_path": str(tmp_path / "p")},
        "d": {"sink": "delta", "sink_path": str(tmp_path / "d"), "partition_by": "lane"},
        "i": {"sink": "iceberg", "iceberg_table": "lake.i", "iceberg_catalog_uri": catalog,
              "iceberg_warehouse": str(tmp_path / "wh"), "merge_keys": "id"},
    }
    sql = ("SELECT origin_stream, origin_seq, `partition`, value.id AS id, value.blob AS blob, "
           "concat('lane', value.id % 2) AS lane, value.kind AS route FROM batch")
    args = ["--payload-format", "json", "--json-schema", "id BIGINT, kind STRING, blob STRING", "--transform-sql",
            sql, "--routes", json.dumps(routes), "--route-by", "route", "--target-file-size", str(target),
            "--read", "executors", "--batch-size", "3600"]
    r = await asyncio.to_thread(run_member_job, member_job_zip, tmp_path, nats_servers=nats_server.url, stream="ORD",
                                group="g", member="m1", args=args, timeout=300)
    assert r.returncode == 0 and r.summary["result"] == "committed", r.describe()
    assert await wq_messages(nc, "ORD", "g") == 0
    bad = keyless | unrouted
    want = {name: {i for i in range(1, n + 1) if "pdi"[i % 3] == name and i not in bad} for name in "pdi"}
    per_route = r.summary["routes"]
    assert {k: v["rows_written"] for k, v in per_route.items()} == {k: len(v) for k, v in want.items()}, per_route
    assert all(v["messages_landed"] == n - len(bad) for v in per_route.values())  # each table records every input
    assert r.summary["dead_lettered"] == len(bad)
    dead = []  # (the message's origin sequence, its id, why)
    for seq in range(1, len(bad) + 1):
        msg = await js.get_msg("ORD-g-dlq", seq)
        dead.append((int(msg.headers["Cg-Origin-Seq"]), json.loads(msg.data).get("id"), msg.headers["Cg-Error"]))
    assert sorted(q for q, _, _ in dead) == sorted(bad), dead  # the origin holds them at seq = i
    assert all("column 'id': a merge key" in why for q, i, why in dead if q in keyless), dead
    assert all(i == q and "column 'route': names no route ('x'" in why for q, i, why in dead if q in unrouted), dead

    sizes: dict[str, list[int]] = {}
    got: dict[str, list[int]] = {}
    data = tmp_path / "p" / "data"  # the Parquet lake: its data folder, read by pyarrow
    sizes["p"] = [f.stat().st_size for f in data.glob("*.parquet")]
    got["p"] = pq.read_table(data, columns=["id"]).column("id").to_pylist()
    from deltalake import DeltaTable

    dt = DeltaTable(str(tmp_path / "d"))
    sizes["d"] = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes").to_pylist()
    got["d"] = read_delta(str(tmp_path / "d"), ["id"]).column("id").to_pylist()
    tbl = SqlCatalog("default", uri=catalog).load_table("lake.i")
    sizes["i"] = [t.file.file_size_in_bytes for t in tbl.scan().plan_files()]
    got["i"] = tbl.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    for name in "pdi":
        assert sorted(got[name]) == sorted(want[name]), name  # every row of its route once, none of another
        # files split at the target (not one file per task), and none above 1.1x of it
        assert len(sizes[name]) >= 3 and 0.5 * target <= max(sizes[name]) <= 1.1 * target, (name, sorted(sizes[name]))
    print("file sizes (x target):", {k: [round(s / target, 2) for s in sorted(v)] for k, v in sizes.items()})

    spec = MemberJobSpec.from_argv(["--stream", "ORD", "--group", "g", "--member", "m1", *args])
    extras = landed_extras(spec, r.summary)
    assert [e["route"] for e in extras] == ["p", "d", "i"]
    assert [e["format"] for e in extras] == ["parquet", "delta", "iceberg"]
    assert [e["rows_written"] for e in extras] == [len(want[k]) for k in "pdi"]
