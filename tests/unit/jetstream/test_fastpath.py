"""The fenced nats-py internals: the version gate and the public fallback's header block."""

from __future__ import annotations

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
