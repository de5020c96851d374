"""The getting-started page (``docs/getting-started.md``), run as written: every command of its
block in one shell's order, in a fresh home directory and a copy of the checkout, with only its
two ports changed to free ones. Airflow's services (api-server, scheduler, dag-processor,
triggerer: LocalExecutor on SQLite) and nats-server are the page's own background commands,
stopped here by their PIDs. The page's waits are its own (``until curl ...``); where it says
"again, until", the test polls. It checks what the page promises: the example DAGs parsed from
the provider's bundle and all unpaused, every run successful, the downstream report run by the
asset events, the sign-in with the generated password, the grid's address, and after each of
the two publishes every paid order in the table exactly once, read with the page's command
(the backfill every 30 s here, so its windows hold orders published while DAG 1 lands them).

Marked ``services`` (several minutes on two cores): ``make test-services`` runs it; the
default ``make test`` leaves it out to stay in its time budget.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.services]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
DAG_ID = "cg_scheduled_consumption"
REPORT_ID = "cg_paid_orders_report"
PIDS = "~/cg-getting-started.pids"  # where the page keeps its background processes' ids
EXAMPLE_DAGS = {DAG_ID, REPORT_ID, "cg_backfill", "cg_overflow_scaleout", "cg_overflow_scaleout_sensor",
                "cg_table_maintenance", "cg_follow_orders"}


def page_commands(marker: str = "begin") -> list[str]:
    """The commands of the page's block after ``<!-- getting-started: MARKER -->`` (continuation
    lines joined, comment lines and blank lines dropped)."""
    text = PAGE.read_text()
    block = text.split(f"<!-- getting-started: {marker} -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Shell:
    """One shell's state across commands: each runs in ``bash -c`` with the environment the one
    before left (so ``export`` and ``. activate`` carry over); ``... &`` starts a process of its
    own, kept by PID."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path):
        self.cwd, self.env, self.log, self.background = cwd, env, log, []

    def run(self, command: str, timeout: float = 1200) -> str:
        if command.endswith("&"):
            out = open(self.log, "ab")
            self.background.append(subprocess.Popen(["bash", "-c", "exec " + command[:-1].strip()], cwd=self.cwd,
                                                    env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                    start_new_session=True))
            return ""
        envfile = self.cwd.parent / "shell.env"
        r = subprocess.run(["bash", "-c", f"set -e\n{command}\nenv -0 > {shlex.quote(str(envfile))}"], cwd=self.cwd,
                           env=self.env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{command} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n" \
                                  f"{self.log.read_text(errors='replace')[-3000:] if self.log.exists() else ''}"
        self.env = dict(item.split("=", 1) for item in envfile.read_text().split("\0") if "=" in item)
        return r.stdout

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_the_getting_started_page_as_written(tmp_path):
    commands = page_commands()
    assert any(c.startswith("pip install") for c in commands) and any(c.startswith("airflow api-server") for c in commands)
    background = [c for c in commands if c.split()[:2] in (
        ["airflow", "api-server"], ["airflow", "scheduler"], ["airflow", "dag-processor"], ["airflow", "triggerer"],
        ["nats-server", "-js"])]
    assert len(background) == 5 and all(c.endswith(f"& echo $! >> {PIDS}") for c in background), background
    api_port, nats_port, monitor_port = _free_port(), _free_port(), _free_port()

    def local(command: str) -> str:  # the page's ports, here free ones
        return command.replace("8080", str(api_port)).replace("4222", str(nats_port)).replace("8222", str(monitor_port))

    checkout = tmp_path / "checkout"  # the repository's checkout, without what a build leaves
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", ".demo", "*.egg-info", "__pycache__", ".*_cache"))
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(
        ("AIRFLOW", "CG_", "PYSPARK", "SPARK_"))}
    env.update({"HOME": str(home), "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache/pip")),
                "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p),
                # the backfill every 30 s from now (hourly by default), so its windows hold orders
                "CG_BACKFILL_INTERVAL_SECONDS": "30",
                "CG_BACKFILL_START_DATE": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                "CG_FOLLOW_SECONDS": "60"})  # DAG 6 every minute here (10 minutes by default)
    fresh_env = dict(env)  # what a new shell starts with
    shell = Shell(checkout, env, home / "airflow" / "scheduler.log")  # the page sends it there
    paid: set[int] = set()
    published_at = 0.0
    reads = 0
    try:
        for command in map(local, commands):
            argv = shlex.split(command.rstrip("&"))
            out = shell.run(command)
            if argv[:3] == ["python", "-m", "airflow_provider_cg.demo"]:
                paid |= _published(argv, paid)
                published_at = time.time()
            elif argv[:3] == ["airflow", "dags", "unpause"]:
                listed = {d["dag_id"]: d for d in _json(shell.run("airflow dags list -o json"))}
                assert EXAMPLE_DAGS <= set(listed), sorted(listed)
                assert {listed[d].get("bundle_name") for d in EXAMPLE_DAGS} == {"airflow-provider-cg-example-dags"}
                unpaused = EXAMPLE_DAGS - {"cg_follow_orders"}  # the page leaves the followers' DAG paused
                assert all(str(listed[d].get("is_paused")).lower() == "false" for d in unpaused), listed
                assert str(listed["cg_follow_orders"].get("is_paused")).lower() == "true", listed
            elif argv[:3] == ["airflow", "dags", "list"]:  # the state after unpausing, as the page says
                def paused(dag_id: str, listing: str = out) -> bool:
                    (line,) = [ln for ln in listing.splitlines() if re.search(rf"\b{dag_id}\b", ln)]
                    return bool(re.search(r"\bTrue\b", line))

                assert not paused(DAG_ID) and paused("cg_follow_orders"), out
            elif argv[:3] == ["airflow", "dags", "list-runs"]:  # "again, until its state is success"
                _wait(lambda: _runs_done(shell, DAG_ID), 900, f"{DAG_ID}'s runs", shell.log)
            elif argv[:2] == ["python", "-c"]:
                reads += 1
                rows, distinct = map(int, re.findall(r"\d+", out.strip().splitlines()[-1]))
                assert (rows, distinct) == (len(paid), len(paid)), out  # every paid order once, none twice
        assert reads == 1 and published_at

        # after the page's last trigger: DAG 1's runs, the backfill's windows over the second
        # publish and the report all end in success, and the table holds every paid order once
        def backfilled() -> bool:  # a run's window is [logical_date, run_after)
            runs = _json(shell.run("airflow dags list-runs cg_backfill -o json 2> /dev/null || true"))
            over = [r for r in runs if _epoch(r["logical_date"]) <= published_at + 5
                    and _epoch(r["run_after"]) >= published_at - 5]
            return bool(over) and any(_epoch(r["run_after"]) > published_at + 5 for r in over) and all(
                r["state"] in ("success", "failed") for r in over)

        _wait(backfilled, 600, "cg_backfill's runs over the second publish", shell.log)
        _wait(lambda: _runs_done(shell, DAG_ID), 900, f"{DAG_ID}'s runs", shell.log)
        for dag_id in (DAG_ID, "cg_backfill"):
            runs = [r for r in _json(shell.run(f"airflow dags list-runs {dag_id} -o json"))
                    if r["state"] not in ("queued", "running")]
            assert runs and all(r["state"] == "success" for r in runs), (dag_id, runs)
        dag1_runs = _json(shell.run(f"airflow dags list-runs {DAG_ID} -o json"))
        assert sum(r["run_id"].startswith("manual__") for r in dag1_runs) == 1  # the page's one trigger
        assert any(r["run_id"].startswith("scheduled__") for r in dag1_runs)  # the one unpausing started
        _wait(lambda: any(r["state"] == "success" for r in _json(shell.run(
            f"airflow dags list-runs {REPORT_ID} -o json"))), 300, f"{REPORT_ID}'s run", shell.log)
        reports = _json(shell.run(f"airflow dags list-runs {REPORT_ID} -o json"))
        assert all(r["run_id"].startswith("asset_triggered__") for r in reports), reports  # events, not a clock
        (read,) = [local(c) for c in commands if c.startswith("python -c")]
        rows, distinct = map(int, re.findall(r"\d+", shell.run(read).strip().splitlines()[-1]))
        assert (rows, distinct) == (len(paid), len(paid))

        # sign in as the page says, and the grid's address
        (show,) = page_commands("sign-in")
        password = json.loads(shell.run(show))["admin"]
        body = json.dumps({"username": "admin", "password": password}).encode()
        token = _http(f"http://127.0.0.1:{api_port}/auth/token", body)["access_token"]
        dag = _http(f"http://127.0.0.1:{api_port}/api/v2/dags/{DAG_ID}", token=token)
        assert dag["dag_id"] == DAG_ID
        text = PAGE.read_text()
        assert f"http://127.0.0.1:8080/dags/{DAG_ID}>" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/dags/{DAG_ID}", timeout=30) as r:
            assert r.status == 200 and b"<html" in r.read().lower()

        # landing continuously instead: DAG 6's runs one after another, without a touch
        for command in map(local, page_commands("follow")):
            argv = shlex.split(command)
            out = shell.run(command)
            if argv[:3] == ["python", "-m", "airflow_provider_cg.demo"]:
                paid |= _published(argv, paid)
        gaps = _consecutive_follow_runs(shell, 3)
        print("DAG 6: gaps between a run's end and the next run's start:", [f"{g:.1f} s" for g in gaps])
        assert all(g < 90 for g in gaps), gaps  # the scheduler's next loop, not a stall
        rows, distinct = map(int, re.findall(r"\d+", shell.run(read).strip().splitlines()[-1]))
        assert (rows, distinct) == (len(paid), len(paid))  # the followers' orders too, each once

        # a burst over the overflow DAG's threshold while the followers land (getting started
        # leaves both unpaused): its overflow members join once warm and leave; no partition
        # waits for a Spark start meanwhile, every order lands once, the membership comes back
        burst = local(f"python -m airflow_provider_cg.demo --publish-to nats://127.0.0.1:4222 --messages 80000 "
                      f"--first-order {max(paid) + 1000}")
        oldest = _OldestPending(nats_port)
        try:
            shell.run(burst)
            paid |= _published(shlex.split(burst), paid)
            _wait(lambda: any(r["state"] in ("success", "failed") for r in _json(shell.run(
                "airflow dags list-runs cg_overflow_scaleout -o json 2> /dev/null || true"))), 900,
                "cg_overflow_scaleout's run", shell.log)
        finally:
            worst = oldest.stop()
        overflow = _json(shell.run("airflow dags list-runs cg_overflow_scaleout -o json"))
        assert [r["state"] for r in overflow if r["state"] not in ("queued", "running")] == ["success"], overflow
        print(f"overflow beside followers: the oldest pending order at most {worst:.1f} s old")
        assert worst < 60, worst  # a partition without a server would wait for a Spark start and more
        _wait(lambda: tuple(oldest.members()) == ("m1", "m2", "m3"), 120, "the membership restored", shell.log)
        _wait(lambda: tuple(map(int, re.findall(r"\d+", shell.run(read).strip().splitlines()[-1]))) ==
              (len(paid), len(paid)), 300, "the burst landed", shell.log)

        # stop, as the page says, from a new shell
        (stop,) = page_commands("stop")
        pids = [int(p) for p in (home / PIDS.removeprefix("~/")).read_text().split()]
        Shell(checkout, fresh_env, shell.log).run(stop)
        _wait(lambda: not any(_alive(p) for p in pids), 90, "the services stopped by the page's command", shell.log)
    finally:
        shell.stop()
        pidfile = home / PIDS.removeprefix("~/")
        left = [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []
        for sig in (signal.SIGTERM, signal.SIGKILL):  # started by the page's commands: stopped by their PIDs
            for pid in (p for p in left if _alive(p)):
                os.kill(pid, sig)
            deadline = time.monotonic() + 30
            while any(_alive(p) for p in left) and time.monotonic() < deadline:
                time.sleep(0.5)


def _published(argv: list[str], paid: set[int]) -> set[int]:
    """The paid orders a ``demo --publish-to`` command of the page published (new ids, as it says)."""
    from airflow_provider_cg.demo import _orders

    n = int(argv[argv.index("--messages") + 1])
    first = int(argv[argv.index("--first-order") + 1]) if "--first-order" in argv else 1
    assert not paid & set(range(first, first + n))
    return {o["order_id"] for o in (json.loads(b) for _, b in _orders(n, 3000, first=first)) if o["status"] == "paid"}


def _consecutive_follow_runs(shell: Shell, n: int) -> list[float]:
    """Waits for ``n`` successful runs of DAG 6 in a row (under the real scheduler: each started
    by the end of the one before); returns the gaps between a run's end and the next one's start."""
    def done() -> list[dict]:
        runs = _json(shell.run("airflow dags list-runs cg_follow_orders -o json 2> /dev/null || true"))
        finished = sorted((r for r in runs if r["state"] in ("success", "failed")), key=lambda r: _epoch(r["start_date"]))
        assert all(r["state"] == "success" for r in finished), finished
        return finished

    _wait(lambda: len(done()) >= n, 1200, f"{n} runs of cg_follow_orders", shell.log)
    runs = done()
    assert all(r["run_id"].startswith("scheduled__") for r in runs), runs  # the scheduler's, none by hand
    return [_epoch(b["start_date"]) - _epoch(a["end_date"]) for a, b in zip(runs, runs[1:], strict=False)]


class _OldestPending:
    """The age of the group's oldest pending message, read every second from the test's side
    (``group_lag``, as ``cg lag`` reads it) while it runs; ``stop`` returns the largest."""

    def __init__(self, nats_port: int) -> None:
        import threading

        self.url, self.worst, self._stop = f"nats://127.0.0.1:{nats_port}", 0.0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import asyncio

        from airflow_provider_cg.core.groups.lag import group_lag
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        async def go() -> None:
            nc = await NatsConnectionSettings(servers=[self.url]).connect()
            try:
                while not self._stop.is_set():
                    lag = await group_lag(nc, "ORDERS", "orders-lake")
                    self.worst = max(self.worst, lag.oldest_pending_age_s or 0.0)
                    await asyncio.sleep(1.0)
            finally:
                await nc.close()

        asyncio.run(go())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(30)
        return self.worst

    def members(self) -> tuple[str, ...]:
        import asyncio

        from airflow_provider_cg.core.groups.admin import ConsumerGroups
        from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings

        async def go() -> tuple[str, ...]:
            nc = await NatsConnectionSettings(servers=[self.url]).connect()
            try:
                return tuple((await ConsumerGroups(nc).get("ORDERS", "orders-lake")).config.members)
            finally:
                await nc.close()

        return asyncio.run(go())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _runs_done(shell: Shell, dag_id: str) -> bool:
    runs = _json(shell.run(f"airflow dags list-runs {dag_id} -o json 2> /dev/null || true"))
    return bool(runs) and all(r["state"] in ("success", "failed") for r in runs)


def _http(url: str, body: bytes | None = None, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as r:
        return json.loads(r.read())


def _epoch(iso: str) -> float:
    import datetime as dt

    if not iso:
        return 0.0
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _json(out: str) -> list:
    """The JSON list an ``airflow ... -o json`` command printed (after any log lines)."""
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    return json.loads(lines[-1]) if lines else []


def _wait(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(3)
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tail}")
