"""``follow="until-next-run"``: the next scheduled run of a DAG's timetable, read through the
timetables' public faces (Airflow's own timetable classes, no mock)."""

from __future__ import annotations

import datetime as dt

import pendulum
import pytest

from airflow_provider_cg.core.durations import parse_duration
from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.operators.follow import next_run_after

NOW = dt.datetime(2026, 11, 28, 9, 3, 20, tzinfo=dt.UTC)


def _timetable(schedule):
    from airflow.sdk import DAG

    return DAG("x", schedule=schedule, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")).timetable


def test_a_cron_schedule_runs_next_at_its_next_fire():
    from airflow.timetables.interval import CronDataIntervalTimetable

    assert next_run_after(_timetable("*/10 * * * *"), NOW, None) == NOW.replace(minute=10, second=0)
    assert next_run_after(CronDataIntervalTimetable("0 * * * *", timezone="UTC"), NOW, None) == NOW.replace(
        hour=10, minute=0, second=0)
    # in the schedule's own time zone: 10:00 in Berlin is 09:00 UTC in winter
    berlin = CronDataIntervalTimetable("0 10 * * *", timezone="Europe/Berlin")
    assert next_run_after(berlin, NOW, None) == dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.UTC)


def test_an_interval_schedule_runs_next_an_interval_after_its_last_run():
    every_7 = _timetable(dt.timedelta(minutes=7))
    last = NOW - dt.timedelta(minutes=2)
    assert next_run_after(every_7, NOW, last) == last + dt.timedelta(minutes=7)
    assert next_run_after(every_7, NOW, NOW - dt.timedelta(minutes=20)) == NOW + dt.timedelta(minutes=1)


def test_a_schedule_without_a_next_run_is_refused_naming_follow():
    with pytest.raises(ConfigError) as e:
        next_run_after(_timetable(None), NOW, None)
    assert e.value.field == "follow" and "until-next-run" in str(e.value)


def test_bad_follow_options_name_the_field_exit_1_and_read_nothing(tmp_path):
    """The member job refuses them before it connects (no server is running here) or writes."""
    import subprocess
    import sys
    from pathlib import Path

    job = Path(__file__).resolve().parents[2] / "spark_apps" / "cg_member_job.py"
    base = [sys.executable, str(job), "--no-spark", "--stream", "S", "--group", "g", "--member", "m1",
            "--sink-path", str(tmp_path / "lake")]
    for args, field in ((["--follow", "soon"], "--follow"), (["--follow", "0"], "--follow"),
                        (["--follow", "5", "--commit-interval", "-1"], "--commit-interval")):
        r = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and field in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1h30m", 5400.0),
                                               ("2d", 172800.0), (" 1.5h ", 5400.0), (2.5, 2.5)])
def test_durations_as_people_write_them(text, seconds):
    assert parse_duration(text, "follow") == seconds


@pytest.mark.parametrize(("value", "rule"), [("soon", "a duration such as"), ("15x", "a duration such as"),
                                             ("1h 30m", "a duration such as"), (True, "a duration such as"),
                                             ("0", "finite duration > 0"), ("-5", "finite duration > 0"),
                                             ("nan", "finite duration > 0"), ("inf", "finite duration > 0"),
                                             ("1e400", "finite duration > 0")])
def test_a_bad_duration_names_its_field_and_rule(value, rule):
    with pytest.raises(ConfigError) as e:
        parse_duration(value, "follow")
    assert e.value.field == "follow" and rule in str(e.value), str(e.value)
