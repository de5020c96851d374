"""Landed data as Assets (``airflow_provider_cg/assets.py``): URIs, event extras, and reading
exactly the rows an event announced from a real Delta table (delta-rs, no servers)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_cg.assets import landed_extra, landed_rows, table_uri
from airflow_provider_cg.core.landing.contract import MemberJobSpec, Summary
from airflow_provider_cg.core.landing.sinks.options import SinkOptions


def _uri(sink: str, **location) -> str:
    return table_uri(SinkOptions.build({"sink": sink, **location}))


def test_table_uris():
    assert _uri("delta", sink_path="/lake/paid orders") == "file:///lake/paid%20orders"
    assert _uri("delta", sink_path="s3://bucket/wh/paid_orders/") == "s3://bucket/wh/paid_orders"
    assert _uri("parquet", sink_path="/lake/raw") == "file:///lake/raw"
    assert _uri("iceberg", iceberg_table="lake.paid_orders",
                iceberg_catalog_uri="sqlite:////tmp/cat.db") == "iceberg://sqlite/lake/paid_orders"
    assert _uri("iceberg", iceberg_table="a.t", iceberg_catalog_uri="postgresql+psycopg2://u@db:5432/cat") \
        == "iceberg://db:5432/a/t"
    assert _uri("iceberg", iceberg_table="lake.t") == "iceberg://catalog/lake/t"  # catalog from a connection
    assert _uri("postgres") == "postgres:///cg_events"
    with pytest.raises(ValueError, match="sink_path"):
        _uri("delta")


def test_asset_names_read_as_the_table_and_never_share_a_uri():
    """The table's own name first; one name per URI (Airflow fails a task whose outlet asset it
    cannot activate, and it activates one URI per name): same leaf, other place, other name."""
    from airflow_provider_cg.assets import table_asset_name

    def name(sink: str, **location) -> str:
        return table_asset_name(SinkOptions.build({"sink": sink, **location}))

    assert name("delta", sink_path="/lake/paid_orders") == "paid_orders (delta, /lake/paid_orders)"
    assert name("delta", sink_path="/lake/paid orders") == "paid orders (delta, /lake/paid orders)"
    assert name("delta", sink_path="s3://bucket/wh/orders") == "orders (delta, s3://bucket/wh/orders)"
    assert name("iceberg", iceberg_table="lake.orders", iceberg_catalog_uri="sqlite:////c.db") == (
        "lake.orders (iceberg, sqlite)")
    tables = [("parquet", {"sink_path": "/lake/dev/orders"}), ("parquet", {"sink_path": "/lake/prod/orders"}),
              ("delta", {"sink_path": "s3://a/orders"}), ("delta", {"sink_path": "s3://b/orders"}),
              ("iceberg", {"iceberg_table": "dev.orders", "iceberg_catalog_uri": "sqlite:////c.db"}),
              ("iceberg", {"iceberg_table": "lake.orders", "iceberg_catalog_uri": "postgresql://db:5432/cat"})]
    names = {name(sink, **where) for sink, where in tables}
    uris = {_uri(sink, **where) for sink, where in tables}
    assert len(names) == len(uris) == len(tables)


def _summary(**partitions) -> dict:
    s = Summary("ORDERS", "g", "m1", result="committed", messages_read=9, rows_written=8, duplicates_skipped=1)
    for p, (first, last, n) in partitions.items():
        s.count_partition(int(p[1:]), first, last, n)
    s.batch_ids.append("cg:ORDERS:g:m1:1:0a0b0c0d")
    return s.to_dict()


def test_the_extra_says_what_landed_and_holds_no_secret():
    spec = MemberJobSpec.build({"stream": "ORDERS", "group": "g", "member": "m1", "sink": "iceberg",
                                "iceberg_table": "lake.t", "iceberg_catalog_uri": "sqlite:////tmp/c.db"})
    extra = landed_extra(spec, _summary(p0=(3, 11, 5), p2=(4, 9, 4)))
    assert extra["table"] == "iceberg://sqlite/lake/t" and extra["iceberg_catalog_uri"] == "sqlite:////tmp/c.db"
    assert extra["origin"] == {"ORDERS": {"0": {"first_seq": 3, "last_seq": 11, "messages": 5},
                                          "2": {"first_seq": 4, "last_seq": 9, "messages": 4}}}
    assert (extra["messages_read"], extra["messages_landed"], extra["rows_written"]) == (9, 8, 8)
    assert extra["batch_ids"] == ["cg:ORDERS:g:m1:1:0a0b0c0d"]
    json.dumps(extra)  # an asset event's extra is JSON


def test_landed_rows_are_exactly_the_announced_ones(tmp_path):
    from deltalake import write_deltalake

    # Two runs landed into one table: run 1 partition 0 seqs 1..5 and partition 1 seqs 2..6;
    # run 2 partition 0 seqs 7..9. Rows keep origin_stream, partition, origin_seq.
    rows = [("ORDERS", 0, q) for q in (1, 3, 5)] + [("ORDERS", 1, q) for q in (2, 4, 6)] \
        + [("ORDERS", 0, q) for q in (7, 9)] + [("OTHER", 0, 3)]
    table = pa.table({"origin_stream": [r[0] for r in rows], "partition": pa.array([r[1] for r in rows], pa.int32()),
                      "origin_seq": pa.array([r[2] for r in rows], pa.int64()),
                      "customer": [f"c{r[2]}" for r in rows]})
    path = str(tmp_path / "paid_orders")
    write_deltalake(path, table)
    spec = MemberJobSpec.build({"stream": "ORDERS", "group": "g", "member": "m1", "sink": "delta", "sink_path": path})
    run1 = landed_extra(spec, _summary(p0=(1, 5, 3), p1=(2, 6, 3)))
    run2 = landed_extra(spec, _summary(p0=(7, 9, 2)))

    got = landed_rows([run2], ["origin_seq", "customer"])
    assert got.to_pylist() == [{"origin_seq": 7, "customer": "c7"}, {"origin_seq": 9, "customer": "c9"}]
    got = landed_rows([run1])
    assert sorted(zip(got.column("partition").to_pylist(), got.column("origin_seq").to_pylist(), strict=True)) == [
        (0, 1), (0, 3), (0, 5), (1, 2), (1, 4), (1, 6)]  # not OTHER's seq 3, not run 2's rows
    assert landed_rows([run1, run2]).num_rows == 8
    assert landed_rows([]) is None
    other = dict(run1, table="file:///elsewhere")
    with pytest.raises(ValueError, match="one table"):
        landed_rows([run1, other])


def test_the_extra_names_the_servers_without_credentials_and_the_origins_life():
    from airflow_provider_cg.assets import server_addresses

    assert server_addresses(["nats://u:secret@Nats.Example:4333", "tls://10.0.0.1", "127.0.0.1:4222"]) == [
        "10.0.0.1:4222", "127.0.0.1:4222", "nats.example:4333"]
    spec = MemberJobSpec.build({"stream": "S", "group": "g", "member": "m1", "sink": "delta", "sink_path": "/t"})
    extra = landed_extra(spec, {**_summary(p0=(1, 5, 3)), "origin_key": "S#2"}, ["nats://u:pw@h:1"])
    assert extra["nats_servers"] == ["h:1"] and "pw" not in str(extra)
    assert set(extra["origin"]) == {"S#2"}  # the rows' origin_stream of a stream's second life
