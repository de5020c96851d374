"""When a group's source counts as stalled (``sourcing.stalled``): what the server reports of it,
and what its watcher saw its stream store."""

from __future__ import annotations

from airflow_provider_cg.core.groups.sourcing import STALLED_AFTER_S, stalled


def test_a_source_with_nothing_to_take_is_never_stalled():
    assert stalled({"active": -1, "error": {"description": "gone"}}, 0, still_for=600) is None


def test_a_silent_or_failing_source_with_messages_to_take_is_stalled():
    assert "silent for 36s" in stalled({"active": 36 * 10**9}, 500)
    assert "never heard from" in stalled({"active": -1}, 5)
    assert "reports consumer not found" in stalled({"active": 0, "error": {"description": "consumer not found"}}, 5)


def test_a_source_heard_from_that_stores_nothing_is_stalled_once_its_watcher_saw_it_long_enough():
    heard = {"active": 2 * 10**9}
    assert stalled(heard, 231) is None
    assert stalled(heard, 231, still_for=STALLED_AFTER_S - 1) is None
    why = stalled(heard, 231, still_for=STALLED_AFTER_S + 1)
    assert why and "storing nothing for 11s" in why and "231 messages" in why
