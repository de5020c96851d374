"""``epoch_seconds``: the one reader of the times the server, the progress board and the
summaries write (the page's times and the metrics' ages both go through it)."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.groups.lag import epoch_seconds, message_time

AT = 1796216405.123456  # 2026-12-02T13:00:05.123456Z


@pytest.mark.parametrize("raw", ["2026-12-02T13:00:05.123456789Z", "2026-12-02T13:00:05.123456789+00:00",
                                 "2026-12-02T14:00:05.123456+01:00", "2026-12-02T13:00:05.123456",
                                 "1796216405123456789", "1796216405123456", 1796216405123456789])
def test_every_way_a_time_is_written_reads_as_the_same_instant(raw):
    assert epoch_seconds(raw) == pytest.approx(AT, abs=1e-3)


def test_seconds_and_milliseconds_since_the_epoch():
    assert epoch_seconds("1796216405") == 1796216405.0
    assert epoch_seconds("1796216405123") == pytest.approx(1796216405.123)


@pytest.mark.parametrize("raw", [None, "", "yesterday", "2026-13-45T00:00:00Z"])
def test_what_is_no_time_is_none(raw):
    assert epoch_seconds(raw) is None


def test_a_stored_messages_time_keeps_its_nanoseconds_to_the_microsecond():
    assert message_time({"time": "2026-12-02T13:00:05.123456789Z"}) == pytest.approx(AT, abs=1e-6)


def test_a_stored_messages_time_is_read_in_its_zone_whatever_the_readers(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "America/New_York")  # an api-server away from UTC
    time.tzset()
    try:
        assert message_time({"time": "2026-12-02T13:00:05.123456789Z"}) == pytest.approx(AT, abs=1e-6)
    finally:
        monkeypatch.undo()
        time.tzset()
