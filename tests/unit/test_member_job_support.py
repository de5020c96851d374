"""The exactly-once checker of the member job tests catches what it claims to catch."""

from __future__ import annotations

import json

import pytest

from tests.support.member_job import JobResult, Landed, assert_exactly_once

EXPECTED = {("S", 1): "a", ("S", 2): "b", ("S", 3): "a", ("S", 4): "b"}


def rows(*seqs: int) -> list[Landed]:
    return [Landed("S", q, EXPECTED.get(("S", q), "a"), 0 if EXPECTED.get(("S", q), "a") == "a" else 1)
            for q in seqs]


def test_accepts_exactly_once_in_per_key_order():
    assert_exactly_once(rows(2, 1, 4, 3), EXPECTED)  # keys interleave freely


@pytest.mark.parametrize("landed, what", [
    (rows(1, 2, 3, 4, 3), "duplicated"),
    (rows(1, 2, 3), "lost"),
    (rows(1, 2, 3, 4, 5), "unexpected"),
    (rows(3, 1, 2, 4), "per-key order"),
    ([*rows(1, 2, 3), Landed("S", 4, "a", 0)], "wrong key"),
    ([*rows(1, 2, 4), Landed("S", 3, "a", 1)], "two partitions"),
])
def test_rejects(landed, what):
    with pytest.raises(AssertionError, match=what):
        assert_exactly_once(landed, EXPECTED)


def test_summary_must_be_the_last_stdout_line():
    line = "CG_SUMMARY " + json.dumps({"result": "committed"})
    assert JobResult(0, f"log\n{line}\n", "", [], 1.0).summary == {"result": "committed"}
    assert JobResult(0, f"{line}\nlater output\n", "", [], 1.0).summary is None
    assert JobResult(1, "", "", [], 1.0).summary is None
