"""The fenced nats-py internals: the version gate and the public fallback's header block."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.jetstream import fastpath as nats_fastpath
from airflow_provider_cg.core.jetstream.protocol import parse_headers, parse_status


class _FakeClient:
    stats: dict = {}

    async def _process_msg(self, sid, subject, reply, data, headers):  # the shape nats-py 2.x has
        return None


def test_fast_path_only_for_the_tested_versions(monkeypatch):
    nc = _FakeClient()
    monkeypatch.setattr(nats_fastpath, "_nats_py_version", lambda: (2, 16))
    assert nats_fastpath.fast_path_supported(nc)
    for untested in ((2, 9), (3, 0), (0, 0)):
        monkeypatch.setattr(nats_fastpath, "_nats_py_version", lambda v=untested: v)
        assert not nats_fastpath.fast_path_supported(nc)


def test_fast_path_needs_the_private_signature(monkeypatch):
    monkeypatch.setattr(nats_fastpath, "_nats_py_version", lambda: (2, 16))

    class Changed(_FakeClient):
        async def _process_msg(self, sid, subject, reply, data, headers, extra=None):
            return None

    assert not nats_fastpath.fast_path_supported(Changed())


def test_public_fallback_rebuilds_the_wire_header_block():
    block = nats_fastpath._header_block({"Nats-Pin-Id": "abc", "X-Trace": "1"})
    assert block == b"NATS/1.0\r\nNats-Pin-Id: abc\r\nX-Trace: 1\r\n\r\n"
    assert parse_headers(block) == {"Nats-Pin-Id": "abc", "X-Trace": "1"}
    status = nats_fastpath._header_block({"Status": "408", "Description": "Request Timeout",
                                          "Nats-Pending-Messages": "5"})
    assert parse_status(status) == (408, "Request Timeout")
    # nats-py 2.16 leaks the next header lines into a bare status's description
    leaked = nats_fastpath._header_block({"Status": "503", "Description": "\r\nNats-Subject: x"})
    assert parse_status(leaked)[0] == 503
    assert nats_fastpath._header_block(None) is None and nats_fastpath._header_block({}) is None


class _WireClient:
    """What nats-py's ``Parser`` calls on its client, recorded in order."""

    def __init__(self) -> None:
        from nats.protocol.parser import Parser

        self.stats = {"in_msgs": 0, "in_bytes": 0}
        self.events: list[tuple] = []
        self._ps = Parser(self)

    async def _process_msg(self, sid, subject, reply, data, headers):
        self.events.append(("nats-py", sid, subject, reply, data, headers))

    async def _process_ping(self):
        self.events.append(("ping",))

    async def _process_pong(self):
        self.events.append(("pong",))

    async def _process_info(self, info):
        self.events.append(("info", info))

    async def _process_err(self, err):
        self.events.append(("err", err))


def _wire(rng) -> tuple[bytes, int]:
    """A server's stream of frames: raw sids 7 and 9 (HMSG and MSG, with and without a reply,
    empty payloads and headers-only), another sid's, and the other operations."""
    out, raw = [], 0
    for i in range(400):
        kind = rng.choice(["hmsg", "hmsg", "hmsg", "msg", "other", "ping", "pong", "ok", "info", "err"])
        sid = rng.choice([7, 9]) if kind in ("hmsg", "msg") else 3
        reply = rng.choice([b"", b" _INBOX.r.%d" % i])
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 5, 300, 5000])))
        if kind in ("hmsg", "other"):
            hdr = b"NATS/1.0\r\nNats-Sequence: %d\r\nX-Odd: a b  c\r\n\r\n" % i
            if rng.random() < 0.1:
                hdr = b"NATS/1.0 404 No Messages\r\n\r\n"
            out.append(b"HMSG _INBOX.x.%d %d%s %d %d\r\n" % (i, sid, reply, len(hdr), len(hdr) + len(payload))
                       + hdr + payload + b"\r\n")
        elif kind == "msg":
            out.append(b"MSG sub.%d %d%s %d\r\n" % (i, sid, reply, len(payload)) + payload + b"\r\n")
        else:
            out.append({"ping": b"PING\r\n", "pong": b"PONG\r\n", "ok": b"+OK\r\n",
                        "info": b'INFO {"server_id":"x","n":%d}\r\n' % i,
                        "err": b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n"}[kind])
        raw += kind in ("hmsg", "msg")
    return b"".join(out), raw


_RAW_FRAMES_SUPPORTED = nats_fastpath._raw_frames_supported


async def _feed(nc, wire: bytes, rng, fast: bool, monkeypatch) -> None:
    monkeypatch.setattr(nats_fastpath, "_raw_frames_supported",
                        _RAW_FRAMES_SUPPORTED if fast else (lambda parser: None))
    dispatch = nats_fastpath._Dispatch(nc)
    assert (dispatch.frames is not None) is fast
    for sid in (7, 9):
        dispatch.handlers[sid] = lambda subject, reply, data, hdr, sid=sid: nc.events.append(
            ("raw", sid, subject, reply, data, hdr))
    pos = 0
    while pos < len(wire):  # chunks as a socket gives them: from one byte to several frames
        n = rng.choice([1, 2, 7, 64, 700, 4096, 32768])
        await nc._ps.parse(wire[pos:pos + n])
        pos += n


async def test_raw_frames_hand_over_exactly_what_nats_py_would(monkeypatch):
    """Whatever the chunking, the raw sids' messages reach their handlers, and everything else
    reaches nats-py's client, in the same order and with the same bytes as through nats-py's
    own parser; the client's counters agree."""
    import random

    for seed in range(12):
        wire, raw = _wire(random.Random(seed))
        runs = []
        for fast in (False, True):
            nc = _WireClient()
            await _feed(nc, wire, random.Random(1000 + seed), fast, monkeypatch)
            assert not nc._ps.buf, "bytes left unparsed"
            runs.append((nc.events, nc.stats))
        (slow_events, slow_stats), (fast_events, fast_stats) = runs
        assert sum(e[0] == "raw" for e in fast_events) == raw
        assert fast_events == slow_events, f"seed {seed}"
        assert fast_stats == slow_stats
        assert all(type(e[2]) is bytes and type(e[3]) is bytes for e in fast_events if e[0] == "raw")


async def test_a_reconnect_does_not_wait_for_the_old_buffers_frame(monkeypatch):
    """A raw frame half read when nats-py resets its parser (a reconnect) is dropped with the
    old buffer, as nats-py drops it; what the new connection sends is parsed at once."""
    import random

    nc = _WireClient()
    await _feed(nc, b"HMSG a 7 12 5000\r\nNATS/1.0\r\n\r\n", random.Random(0), True, monkeypatch)
    nc._ps.reset()
    await nc._ps.parse(b"PING\r\nMSG b 7 2\r\nhi\r\n")
    assert nc.events == [("ping",), ("raw", 7, b"b", b"", b"hi", None)]


@pytest.mark.parametrize("bad", [b"HMSG a x 1 2\r\n..\r\n", b"HMSG a 7 - 2\r\n..\r\n", b"MSG a 7 2 x\r\n..\r\n"])
async def test_a_frame_nats_py_would_refuse_is_left_to_nats_py(monkeypatch, bad):
    from nats.errors import ProtocolError

    for fast in (False, True):
        nc = _WireClient()
        raised = None
        try:
            await _feed(nc, b"MSG a 7 2\r\nok\r\n" + bad + b"not a protocol line\r\n",
                        __import__("random").Random(3), fast, monkeypatch)
        except ProtocolError as e:
            raised = e
        assert nc.events[:1] == [("raw", 7, b"a", b"", b"ok", None)], (fast, nc.events)
        assert raised is not None, fast
