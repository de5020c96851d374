"""The member job's progress line (``Progress``): one every ``progress_interval`` from the run's
start to its end whatever the run waits on, naming it (``waiting=pin``, ``take-over``,
``table``: what ``member.py`` sets), with ``rate`` the messages read since the line before.
A standby's ``waiting=pin`` lines from a real job are in ``tests/integration/test_follow.py``."""

from __future__ import annotations

import asyncio
import logging
import re

from airflow_provider_cg.core.landing.contract import Summary
from airflow_provider_cg.core.landing.reads.reading import Progress


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("cg progress")]


async def test_a_line_every_interval_names_what_the_run_waits_on(caplog):
    caplog.set_level(logging.INFO, logger="airflow_provider_cg.landing")
    summary = Summary("ORDERS", "g", "m1")
    progress = Progress(summary, 0.2)
    talking = asyncio.create_task(progress.keep_talking())
    try:
        for waiting in ("pin", "take-over", None, "table"):
            progress.waiting = waiting
            if waiting is None:  # landing: 300 messages in the next half second
                summary.messages_read += 300
            await asyncio.sleep(0.5)
    finally:
        talking.cancel()
    lines = _lines(caplog)
    assert len(lines) >= 8, lines  # about every 0.2 s of 2 s, nothing else ticking
    said = [m.group(1) if (m := re.search(r" waiting=(\S+)$", ln)) else None for ln in lines]
    assert [w for i, w in enumerate(said) if i == 0 or w != said[i - 1]] == ["pin", "take-over", None, "table"]
    rates = [int(re.search(r" rate=(\d+) msg/s", ln).group(1)) for ln in lines]
    landing = [r for r, w in zip(rates, said, strict=True) if w is None]
    assert any(r > 0 for r in landing), lines  # what it read since the line before, per second
    assert all(r == 0 for r, w in zip(rates, said, strict=True) if w == "table"), lines


def test_lines_come_no_more_often_than_the_interval(caplog):
    caplog.set_level(logging.INFO, logger="airflow_provider_cg.landing")
    progress = Progress(Summary("ORDERS", "g", "m1"), 60.0)
    for _ in range(100):
        progress.tick()  # the readers tick between their steps
    assert _lines(caplog) == []
    progress.tick(force=True)  # the run's last line
    assert len(_lines(caplog)) == 1


def test_a_warming_follower_says_so_and_the_members_lag_when_known(caplog):
    """A pinned follower whose first batch waits for Spark's warm-up says ``waiting=warm-up``
    (the reader names nothing then); a named wait comes first; ``lag=`` once the board read it."""
    import threading

    caplog.set_level(logging.INFO, logger="airflow_provider_cg.landing")
    warm, lag = threading.Event(), [None]
    progress = Progress(Summary("ORDERS", "g", "m1"), 60.0, lag=lambda: lag[0],
                        busy=lambda: None if warm.is_set() else "warm-up")
    progress.tick(force=True)
    lag[0] = 229
    progress.waiting = "pin"
    progress.tick(force=True)
    progress.waiting = None
    warm.set()
    progress.tick(force=True)
    first, second, third = _lines(caplog)
    assert first.endswith("backlog_left=0 waiting=warm-up") and " lag=" not in first, first
    assert second.endswith("lag=229 waiting=pin"), second
    assert third.endswith("lag=229") and "waiting=" not in third, third
