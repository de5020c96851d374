"""Parsing and status handling of the priority client, without a server."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.jetstream.client import PriorityClient, _Pull
from airflow_provider_cg.core.jetstream.protocol import (
    AckMetadata,
    AckOutcome,
    AckResults,
    ConsumerGone,
    PinLost,
    PulledMsg,
    PullEnd,
    PullRejected,
    PullTransient,
    classify_status,
    parse_ack_subject,
    parse_headers,
    parse_status,
)

V1 = "$JS.ACK.ORDERS.m1.2.1043.17.1763776245123456789.99"
V2 = "$JS.ACK.hub.ACCHASH.ORDERS.m1.2.1043.17.1763776245123456789.99.rNd"


def test_ack_subject_v1():
    assert parse_ack_subject(V1) == AckMetadata("ORDERS", "m1", 2, 1043, 17, 1763776245123456789, 99)


def test_ack_subject_v2_with_domain_account_and_random_token():
    md = parse_ack_subject(V2)
    assert md == AckMetadata("ORDERS", "m1", 2, 1043, 17, 1763776245123456789, 99, "hub", "ACCHASH")


def test_ack_subject_v2_without_domain_and_without_random_token():
    md = parse_ack_subject("$JS.ACK._.ACC.S.c.1.5.6.7.8")
    assert (md.domain, md.account_hash, md.stream, md.stream_seq, md.num_pending) == (None, "ACC", "S", 5, 8)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "_INBOX.x.y",
        "$JS.ACK.S.c.1.2.3",
        "$JS.ACK.S.c.x.2.3.4.5",
        "$JS.ACK.S.c.1.2.3.4.5.6",
        "$JS.API.S.c.1.2.3.4.5",
    ],
)
def test_ack_subject_rejects_other_subjects(bad):
    with pytest.raises(ValueError):
        parse_ack_subject(bad)


def test_pulled_msg_parses_lazily_and_exposes_metadata():
    raw = b"NATS/1.0\r\nNats-Stream-Source: ORIGIN 41 x\r\nNats-Pin-Id: p1\r\n\r\n"
    m = PulledMsg("0.orders.eu", V1, b"payload", raw, pin_id="p1")
    assert m._meta is None and m._headers is None
    assert (m.stream, m.consumer, m.num_delivered, m.stream_seq, m.consumer_seq) == (
        "ORDERS",
        "m1",
        2,
        1043,
        17,
    )
    assert (m.timestamp_ns, m.num_pending) == (1763776245123456789, 99)
    assert m.headers == {"Nats-Stream-Source": "ORIGIN 41 x", "Nats-Pin-Id": "p1"}
    assert PulledMsg("s", V1, b"").headers is None
    assert PulledMsg("s", V1, b"", headers={"a": "b"}).headers == {"a": "b"}


def test_headers_and_status_blocks():
    assert parse_headers(b"NATS/1.0\r\nA: 1\r\nB:2\r\nA: 3\r\n\r\n") == {"A": "3", "B": "2"}
    assert parse_status(b"NATS/1.0\r\nA: 1\r\n\r\n") is None
    assert parse_status(b"NATS/1.0 404 No Messages\r\n\r\n") == (404, "No Messages")
    assert parse_status(b"NATS/1.0 503\r\n\r\n") == (503, "")
    hb = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 3\r\nNats-Last-Stream: 9\r\n\r\n"
    assert parse_status(hb) == (100, "Idle Heartbeat")
    timeout = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\nNats-Pending-Bytes: 0\r\n\r\n"
    assert parse_status(timeout) == (408, "Request Timeout")
    assert parse_headers(timeout)["Nats-Pending-Messages"] == "7"


@pytest.mark.parametrize(
    ("code", "desc", "expected"),
    [
        (100, "Idle Heartbeat", None),
        (404, "No Messages", PullEnd.NO_MESSAGES),
        (408, "Request Timeout", PullEnd.EXPIRED),
        (408, "Interest Expired", PullEnd.EXPIRED),
        (408, "Requests Pending", PullEnd.EXPIRED),
        (409, "Batch Completed", PullEnd.MAX_BYTES),
        (409, "Message Size Exceeds MaxBytes", PullEnd.MAX_BYTES),
        (409, "Consumer Deleted", ConsumerGone),
        (409, "Leadership Change", PullTransient),
        (409, "Server Shutdown", PullTransient),
        (409, "Exceeded MaxWaiting", PullTransient),
        (409, "Exceeded MaxRequestBatch of 10", PullRejected),
        (409, "Exceeded MaxRequestExpires of 1s", PullRejected),
        (409, "Consumer is push based", PullRejected),
        (423, "Nats-Pin-Id mismatch", PinLost),
        (423, "Nats-Wrong-Pin-Id", PinLost),
        (400, "Bad Request - Invalid Priority Group", PullRejected),
        (412, "Required Api Level", PullRejected),
        (503, "", ConsumerGone),
    ],
)
def test_status_classification(code, desc, expected):
    assert classify_status(code, desc) == expected


def test_ack_outcomes():
    assert AckOutcome.ACKED.acked and not AckOutcome.TIMEOUT.acked and not AckOutcome.ERROR.acked
    r = AckResults([AckOutcome.ACKED, AckOutcome.TIMEOUT])
    assert not r.all_acked and r.counts()[AckOutcome.TIMEOUT] == 1 and r.details == {}
    assert isinstance(r, list) and r == [AckOutcome.ACKED, AckOutcome.TIMEOUT]


# --- inbound routing on raw bytes (the fast path handler), driven without a server -------------


class _FakeNc:
    def new_inbox(self) -> str:
        return "_INBOX.test"


def _client(**kw) -> PriorityClient:
    c = PriorityClient(_FakeNc(), "S", "C", **kw)
    c._pull_prefix, c._pull_plen = "_INBOX.test.P.", len("_INBOX.test.P.")
    return c


def _pull(c: PriorityClient, token: int, batch: int, pin: str | None = None) -> _Pull:
    p = _Pull(token, batch, asyncio.get_running_loop().create_future(), pin)
    c._cur, c._sent_ids[token] = p, pin
    return p


async def test_raw_handler_tracks_pin_and_fills_batch():
    events = []
    c = _client(on_pinned=lambda pin: events.append(("pinned", pin)))
    p = _pull(c, 1, 2)
    hdr = b"NATS/1.0\r\nNats-Pin-Id: PIN1\r\n\r\n"
    c._on_pull_raw(b"s.1", V1.encode(), b"a", hdr)
    c._on_pull_raw(b"s.2", V1.encode(), b"b", hdr)
    assert p.fut.done() and p.end is PullEnd.BATCH_FULL and [m.data for m in p.msgs] == [b"a", b"b"]
    assert c.pin_id == "PIN1" and c.is_pinned and events == [("pinned", "PIN1")]
    assert all(m.pin_id == "PIN1" for m in p.msgs)
    c._on_pull_raw(b"s.3", V1.encode(), b"c", hdr)  # no pull outstanding: kept for the next one
    assert c.buffered == 1


async def test_raw_handler_statuses_end_the_matching_pull_only():
    c = _client()
    p = _pull(c, 5, 10)
    c._on_pull_raw(b"_INBOX.test.P.4", b"", b"", b"NATS/1.0 408 Request Timeout\r\n\r\n")  # stale
    c._on_pull_raw(b"_INBOX.test.P.5", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")
    assert not p.fut.done() and p.seen == 1
    c._on_pull_raw(b"_INBOX.test.P.5", b"", b"", b"NATS/1.0 409 Consumer Deleted\r\n\r\n")
    assert p.fut.done() and isinstance(p.error, ConsumerGone) and p.error.code == 409


async def test_423_clears_the_pin_and_fires_on_unpinned_once():
    events = []
    c = _client(on_unpinned=lambda pin, why: events.append((pin, why)))
    c._pinned("OLD")
    p = _pull(c, 7, 10, pin="OLD")
    c._on_pull_raw(b"x", V1.encode(), b"m", b"NATS/1.0\r\nNats-Pin-Id: OLD\r\n\r\n")
    c._on_pull_raw(
        b"_INBOX.test.P.7", b"", b"", b"NATS/1.0 423 Nats-Wrong-Pin-Id\r\nNats-Pending-Messages: 9\r\n\r\n"
    )
    assert isinstance(p.error, PinLost) and p.error.pin_id == "OLD" and len(p.error.messages) == 1
    assert c.pin_id is None and events == [("OLD", "423 Nats-Wrong-Pin-Id")]
    c._on_pull_raw(b"_INBOX.test.P.6", b"", b"", b"NATS/1.0 423 Nats-Wrong-Pin-Id\r\n\r\n")
    assert len(events) == 1


async def test_ack_reply_routing():
    c = _client()
    c._ack_prefix, c._ack_plen = "_INBOX.test.A.", len("_INBOX.test.A.")
    from airflow_provider_cg.core.jetstream.client import _AckBatch

    res = AckResults([AckOutcome.TIMEOUT] * 3)
    b = _AckBatch(res, asyncio.get_running_loop().create_future())
    c._ack_batches[3] = b
    c._on_ack_raw(b"_INBOX.test.A.3.0", b"", b"", None)
    c._on_ack_raw(b"_INBOX.test.A.3.0", b"", b"", b"NATS/1.0 503\r\n\r\n")  # duplicate: ignored
    c._on_ack_raw(b"_INBOX.test.A.2.1", b"", b"", None)  # another generation: ignored
    c._on_ack_raw(b"_INBOX.test.A.3.2", b"", b"", b"NATS/1.0 503\r\n\r\n")
    assert res == [AckOutcome.ACKED, AckOutcome.TIMEOUT, AckOutcome.ERROR] and res.details == {
        2: "503 No Responders"
    }
    assert not b.fut.done()
    c._on_ack_raw(b"_INBOX.test.A.3.1", b"", b"", None)
    assert b.fut.done() and res.counts()[AckOutcome.ACKED] == 2


async def test_max_bytes_is_tracked_like_the_server_so_an_exact_hit_ends_the_pull():
    c = _client()
    c._pinned("PIN")
    p = _pull(c, 1, 10, pin="PIN")
    pin_only = b"NATS/1.0\r\nNats-Pin-Id: PIN\r\n\r\n"  # the server counts no header bytes
    with_hdr = b"NATS/1.0\r\nFoo: bar\r\nNats-Pin-Id: PIN\r\n\r\n"  # counts "NATS/1.0\r\nFoo: bar\r\n\r\n"
    size1 = len(b"s.1") + len(V1) + len(b"12345")
    size2 = len(b"s.2") + len(V1) + len(b"67") + len(b"NATS/1.0\r\nFoo: bar\r\n\r\n")
    p.bytes_left = size1 + size2
    c._on_pull_raw(b"s.1", V1.encode(), b"12345", pin_only)
    assert not p.fut.done() and p.bytes_left == size2
    c._on_pull_raw(b"s.2", V1.encode(), b"67", with_hdr)
    assert p.fut.done() and p.end is PullEnd.MAX_BYTES and len(p.msgs) == 2
