"""A follower's time in a scheduled DAG: ``follow="until-next-run"`` follows until the DAG's
next scheduled run starts, so a DAG scheduled every 10 minutes keeps its members landing
without a gap and without two runs of a member at once (a run that meets its predecessor still
pinned waits as its standby, and takes over when the predecessor releases the pin)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_provider_cg.core.errors import ConfigError

UNTIL_NEXT_RUN = "until-next-run"
#: kept free before the next run: the follower's last batch lands and the pin is released meanwhile
MARGIN_S = 2.0


def next_run_after(timetable: Any, now: dt.datetime, run_after: dt.datetime | None) -> dt.datetime:
    """When a DAG of ``timetable`` runs next after ``now``: the next fire of its cron expression,
    or its last run plus its interval. Read through the timetables' public faces (their
    ``expression`` / ``delta``, or ``serialize()``); ``ConfigError`` for a schedule that has no
    next run to follow until (``@continuous``, assets, ``None``)."""
    described = timetable.serialize() if hasattr(timetable, "serialize") else {}
    expression = getattr(timetable, "expression", None) or described.get("expression")
    if expression:
        from croniter import croniter
        from pendulum import timezone

        tz = getattr(timetable, "timezone", None) or described.get("timezone") or "UTC"
        local = now.astimezone(timezone(tz) if isinstance(tz, str) else tz)
        return croniter(expression, local).get_next(dt.datetime).astimezone(dt.UTC)
    delta = getattr(timetable, "delta", None) or described.get("delta")
    if isinstance(delta, int | float):
        delta = dt.timedelta(seconds=delta)
    if isinstance(delta, dt.timedelta) and delta > dt.timedelta(0):
        nxt = run_after or now
        while nxt <= now:
            nxt += delta
        return nxt
    raise ConfigError("follow", f"{UNTIL_NEXT_RUN} needs a DAG scheduled by a cron expression or an interval "
                                f"({type(timetable).__name__} has no next run): give seconds or a duration")


def check_continuous_start(dag: Any, task_start_date: dt.datetime | None) -> None:
    """A landing task in an ``@continuous`` DAG needs a start date (the DAG's, or its tasks'
    through ``default_args``): without one Airflow gives the first run a zero-length data
    interval, ``[now, now]``, and computes the second run's logical date as that same instant,
    so the scheduler finds the run already there and never starts another (Airflow 3.3's
    ``ContinuousTimetable``). ``ConfigError("start_date", ...)`` when the DAG is parsed."""
    if dag is None or type(getattr(dag, "timetable", None)).__name__ != "ContinuousTimetable":
        return
    if task_start_date is None and getattr(dag, "start_date", None) is None \
            and not any(getattr(t, "start_date", None) for t in getattr(dag, "tasks", ())):
        raise ConfigError("start_date", f"the @continuous DAG {dag.dag_id!r} needs one, in the past (for instance "
                                        "pendulum.datetime(2025, 1, 1)): without it Airflow schedules its first "
                                        "run over a zero-length interval and never starts a second")


def seconds_until_next_run(context: Any, commit_interval: float) -> float:
    """``follow`` for this task: until its DAG's next run, less the time its last batch needs."""
    now = dt.datetime.now(dt.UTC)
    dag_run = context.get("dag_run")
    nxt = next_run_after(context["dag"].timetable, now, getattr(dag_run, "run_after", None))
    return max(1.0, (nxt - now).total_seconds() - MARGIN_S - commit_interval)
