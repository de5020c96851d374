"""Splitting a planned range for Spark's tasks, and the plan the tasks get (pure logic)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from airflow_provider_cg.core.jetstream.direct_gets import ALL, ReadRange
from airflow_provider_cg.core.landing.pipeline.nats_source import batch_plan
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import decode_seqs


@pytest.mark.parametrize(("first", "last", "messages", "parts"),
                         [(1, 100, 100, 4), (10, 10, 1, 3), (5, 1_000_003, 40_000, 7), (3, 9, 2, 5)])
def test_a_range_splits_into_consecutive_parts_covering_it(first, last, messages, parts):
    r = ReadRange(2, "2.>", first, last, messages)
    split = r.split(parts)
    assert 1 <= len(split) <= parts
    assert split[0].first_seq == first and split[-1].last_seq == last
    assert all(a.last_seq + 1 == b.first_seq for a, b in zip(split, split[1:], strict=False))  # no gap, no overlap
    assert all(p.partition == 2 and p.subject == "2.>" and p.first_seq <= p.last_seq for p in split)
    assert sum(p.messages for p in split) >= messages  # each part's estimate rounds up
    assert len(r) == messages


def test_the_plan_carries_splits_keys_and_skipped_inputs_but_no_secret():
    ranges = [ReadRange(ALL, ">", 1, 1000, 1000)]
    plan = json.loads(batch_plan(ranges, stream="ORDERS-g", origin=None, group="g", member="m1",
                                 key_rules=[("orders.*", (1,))], js_prefix="$JS.API", only=None, parallelism=4,
                                 skip=np.array([7, 3, 5])))
    assert [s[2:4] for s in plan["splits"]] == [[1, 250], [251, 500], [501, 750], [751, 1000]]
    assert plan["keys"] == [["orders.*", [1]]]
    assert decode_seqs(plan["skip"]).tolist() == [3, 5, 7]
    assert set(plan) == {"stream", "origin", "group", "member", "js_prefix", "keys", "only", "splits", "skip",
                         "origin_keys"}


def test_settings_carried_to_executors_hold_tls_files_as_their_content(tmp_path):
    """``portable()``: what the tasks get instead of paths that exist only on the driver."""
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from tests.support.nats_auth import make_tls

    tls = make_tls(tmp_path / "tls")
    here = NatsConnectionSettings(servers=["tls://127.0.0.1:4222"], token="t0k", tls_ca=str(tls["ca"]),
                                  tls_cert=str(tls["client_cert"]), tls_key=str(tls["client_key"]))
    there = here.portable()
    for name, key in (("tls_ca", "ca"), ("tls_cert", "client_cert"), ("tls_key", "client_key")):
        assert getattr(there, name) == tls[key].read_text() and getattr(here, name) == str(tls[key])
    assert there.token == "t0k"
    for path in tls.values():
        path.unlink()
    assert there.connect_options()["tls"] is not None  # usable without the files
