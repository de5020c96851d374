"""Rows from direct-get answers, parsed column-wise (core/jetstream/direct_gets.py), against the per-message
row builder's rules: origin from Nats-Stream-Source, partition token stripped, the key, and only
the message's own headers kept."""

from __future__ import annotations

import json

from airflow_provider_cg.core.jetstream.direct_gets import ALL, PartitionBatch, subject_filter
from airflow_provider_cg.core.jetstream.protocol import PulledMsg
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, KeySelector, build_rows, rows_from_batches


def _block(seq: int, subject: str, origin: str = "ORD", oseq: int = 0, own: dict | None = None) -> bytes:
    """A direct-get answer's header block as nats-server 2.15 writes it for a sourced message."""
    lines = ["NATS/1.0"] + [f"{k}: {v}" for k, v in (own or {}).items()]
    lines.append(f"Nats-Stream-Source: {origin} {oseq or seq + 100} ord.* {{{{Partition(3,1)}}}}.ord.{{{{Wildcard(1)}}}}")
    lines += ["Nats-Stream: ORD-g", f"Nats-Subject: {subject}", f"Nats-Sequence: {seq}",
              "Nats-Time-Stamp: 2026-11-22T20:38:34.435622239Z", "Nats-Num-Pending: 7", "Nats-Last-Sequence: 0"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_rows_columns_and_refs():
    a = PartitionBatch(0, [_block(1, "0.ord.k1"), _block(4, "0.ord.k9", own={"X-Trace": "t1"})], [b"a", b"bb"], 4)
    b = PartitionBatch(2, [_block(2, "2.ord.k2", origin="ORD:ab12cd", oseq=77)], [b"c"], 2)
    table, refs = rows_from_batches([a, b], group="g", member="m1", keys=KeySelector([("ord.*", (1,))]))
    assert table.schema == ROW_SCHEMA
    assert refs.tolist() == [1, 4, 2]
    rows = table.to_pylist()
    assert [(r["origin_stream"], r["origin_seq"]) for r in rows] == [("ORD", 101), ("ORD", 104), ("ORD", 77)]
    assert [(r["partition"], r["subject"], r["key"]) for r in rows] == [
        (0, "ord.k1", "k1"), (0, "ord.k9", "k9"), (2, "ord.k2", "k2")]
    assert [r["payload"] for r in rows] == [b"a", b"bb", b"c"]
    assert rows[0]["headers"] is None and rows[2]["headers"] is None
    assert json.loads(rows[1]["headers"]) == {"X-Trace": "t1"}  # server-added ones dropped
    assert rows[0]["timestamp"].value == 1795379914435622239
    assert {r["group"] for r in rows} == {"g"} and {r["member"] for r in rows} == {"m1"}
    assert all(r["delivery_count"] is None for r in rows)


def test_keys_of_multi_token_and_whole_subject_rules():
    batch = PartitionBatch(1, [_block(5, "1.ord.eu.k5"), _block(6, "1.ord.us.k6")], [b"x", b"y"], 6)
    table, _ = rows_from_batches([batch], group="g", member="m", keys=KeySelector([("ord.*.*", (1, 2))]))
    assert table.column("key").to_pylist() == ["eu.k5", "us.k6"]
    table, _ = rows_from_batches([batch], group="g", member="m", keys=KeySelector([]))
    assert table.column("key").to_pylist() == ["ord.eu.k5", "ord.us.k6"]  # whole-subject hashing


def test_empty_read_and_filters():
    table, refs = rows_from_batches([], group="g", member="m", keys=KeySelector([]))
    assert table.num_rows == 0 and len(refs) == 0
    assert subject_filter(3) == "3.>" and subject_filter(ALL) == ">"


def test_pulled_rows_read_v1_and_v2_ack_subjects_and_keep_their_metadata_whole():
    """Pulled messages' rows take the stream, sequence, time and deliveries from the ack
    subject in either form; a v2 subject's domain and account hash stay in the message's
    metadata (parsed once, by ``jetstream/protocol.py``)."""
    v1 = PulledMsg("1.ord.k1", "$JS.ACK.ORD.m1.2.41.7.1700000000000000001.3", b"a")
    v2 = PulledMsg("2.ord.k2", "$JS.ACK.hub.ACCHASH.ORD.m1.1.42.8.1700000000000000002.2.tok", b"b")
    rows = build_rows([v1, v2], group="g", member="m1", keys=KeySelector([("ord.*", (1,))]),
                      sourced=False).to_pylist()
    assert [(r["origin_stream"], r["origin_seq"], r["delivery_count"], r["timestamp"].value) for r in rows] == [
        ("ORD", 41, 2, 1700000000000000001), ("ORD", 42, 1, 1700000000000000002)]
    assert (v2.metadata.domain, v2.metadata.account_hash, v2.metadata.consumer_seq) == ("hub", "ACCHASH", 8)
    assert (v1.metadata.domain, v1.metadata.account_hash) == (None, None)
