"""The wheel test's slow parts, the install of the wheel and its dependencies into a fresh
virtual environment, the probes of that install and the README's demo run from it (together
about three minutes here), run in the background from the start of the session (niced in one
process), and the test runs last and checks what they printed: the suite does not wait for pip
nor the demo.
Under pytest-xdist one worker of the run does it (``tests/support/shared.py``) and leaves its
result in the run's folder for whichever worker runs the test."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.shared import background_niceness, claim, run_dir

ROOT = Path(__file__).resolve().parents[2]
WHEEL_TEST = "tests/install/test_wheel_install.py"
DEMO_ARGS = ("--messages", "5000", "--customers", "50")
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_future: concurrent.futures.Future | None = None


def _run(cmd, *, cwd, env=None, timeout=900) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       preexec_fn=lambda: os.nice(background_niceness()))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def venv_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell in ``venv``: nothing of the test run's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(
        ("AIRFLOW", "CG_", "PYSPARK", "SPARK_"))}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    return env


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path
    #: what the test's probes printed in the venv (``test_wheel_install._ONE_PYSPARK``, ``_BUNDLES``)
    probe: str
    bundles: str
    #: what ``python -m airflow_provider_cg.demo`` printed, run in the venv (exit 0)
    demo: str


def _install(base: Path) -> InstalledWheel:
    """Build the wheel, make a venv, install the wheel with every extra, run the test's probes
    of the install (each a fresh interpreter importing Airflow or PySpark), then the demo."""
    from tests.install.test_wheel_install import _BUNDLES, _ONE_PYSPARK

    dist = base / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT], cwd=base)
    (wheel,) = dist.glob("airflow_provider_cg-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=base)
    # --no-compile: byte-compiling every file of Airflow and PySpark is a third of the install
    # here (58 s against 39 s) and nothing depends on it (imports compile what they use)
    py, env = venv / "bin" / "python", venv_env(venv)
    _run([py, "-m", "pip", "install", "-q", "--no-compile", f"{wheel}[all]"], cwd=base, env=env)
    home = base / "airflow-home"
    home.mkdir()
    airflow_env = {**env, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "True"}
    probe = _run([py, "-c", _ONE_PYSPARK], cwd=base, env=env)
    bundles = _run([py, "-c", _BUNDLES], cwd=base, env=airflow_env)
    demo = _run([py, "-m", "airflow_provider_cg.demo", *DEMO_ARGS, "--dir", base / "demo"], cwd=base, env=env,
                timeout=1200)
    return InstalledWheel(wheel, venv, probe, bundles, demo)


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only a test that runs starts it
def pytest_collection_modifyitems(config, items):
    global _pool, _future
    wheel_tests = [i for i in items if i.nodeid.startswith(WHEEL_TEST)]
    if not wheel_tests or config.option.collectonly:
        return
    items[:] = [i for i in items if not i.nodeid.startswith(WHEEL_TEST)] + wheel_tests
    if not claim("wheel-install"):  # another worker of the run installs it; the test reads its result
        return
    _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cg-wheel-install")
    _future = _pool.submit(_install_and_record, run_dir() / "wheel")
    _pool.shutdown(wait=False)


def _install_and_record(base: Path) -> InstalledWheel:
    """``_install``, its result (or its error) left in the run's folder for the worker that runs the test."""
    base.mkdir()
    try:
        installed = _install(base)
    except BaseException as e:
        _publish(base / "error.txt", f"{type(e).__name__}: {e}")
        raise
    _publish(base / "result.json", json.dumps({k: str(v) for k, v in dataclasses.asdict(installed).items()}))
    return installed


def _publish(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def pytest_sessionfinish(session, exitstatus):
    if _pool is not None:
        _pool.shutdown(wait=True)  # the run's folder, the install's, goes when the run ends (shared.py)


@pytest.fixture
def installed_wheel() -> InstalledWheel:
    """The background install's result (its failure fails the test), from this process or from
    the worker of the run that claimed it."""
    if _future is not None:
        return _future.result(timeout=900)
    base, deadline = run_dir() / "wheel", time.monotonic() + 900
    while time.monotonic() < deadline:
        if (base / "error.txt").exists():
            pytest.fail(f"the wheel's background install failed: {(base / 'error.txt').read_text()}")
        if (base / "result.json").exists():
            fields = json.loads((base / "result.json").read_text())
            return InstalledWheel(**{**fields, "wheel": Path(fields["wheel"]), "venv": Path(fields["venv"])})
        time.sleep(1)
    pytest.fail("the wheel's background install did not finish in 900 s")
