"""The backfill's rows (core/landing/run/backfill.py) are the rows live consumption lands for the
same origin messages: partition as the server's transform computes it, key, owner member."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter, StaticGroupConfig
from airflow_provider_cg.core.landing.contract import parse_time
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA
from airflow_provider_cg.core.landing.run.backfill import BACKFILL_MEMBER, OriginRows, window_member


def msg(subject: str, seq: int, data: bytes = b"x"):
    return SimpleNamespace(subject=subject, stream="O", stream_seq=seq, data=data, _hdr=None, timestamp_ns=seq * 1000)


def test_elastic_rows_match_the_servers_partitions_and_keys():
    cfg = ElasticGroupConfig(4, (PartitioningFilter("orders.*.*", (2,)),), members=("a", "b"))
    rows = OriginRows(cfg, "g")
    assert rows.consumer_filters == ["orders.*.*"]
    msgs = [msg(f"orders.eu.c{i}", i) for i in range(1, 40)] + [msg("other.x", 99)]
    table, kept, skipped = rows.build(msgs)
    assert table.schema == ROW_SCHEMA and skipped == 1 and len(kept) == 39
    owner = {p: m for m, ps in partitioning.assign_partitions(cfg).items() for p in ps}
    for r in table.to_pylist():
        p = partitioning.partition_of(r["subject"], 4, (2,), "orders.*.*")
        assert (r["partition"], r["key"], r["member"], r["group"]) == (p, r["subject"].split(".")[2], owner[p], "g")
        assert r["delivery_count"] == 1 and r["payload_text"] is None


def test_static_rows_take_the_partition_token_and_skip_the_rest():
    cfg = StaticGroupConfig(2, ("orders.>",), members=("a",))
    rows = OriginRows(cfg, "g")
    assert rows.consumer_filters == ["*.orders.>"]
    table, kept, skipped = rows.build([msg("1.orders.x", 1), msg("7.orders.x", 2), msg("x.orders.y", 3)])
    assert skipped == 2 and table.column("partition").to_pylist() == [1]
    assert table.column("subject").to_pylist() == ["orders.x"]
    owner = {p: m for m, ps in partitioning.assign_partitions(cfg).items() for p in ps}
    assert table.column("member").to_pylist() == [owner.get(1, BACKFILL_MEMBER)]


def test_window_member_names_the_window():
    start, end = parse_time("s", "2026-01-01T00:00:00Z"), parse_time("e", "2026-01-01T01:00:00+01:00")
    assert window_member(start, end) == "bf-1767225600000-1767225600000"
