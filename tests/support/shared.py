"""What the processes of one test run share. ``make test`` runs the suite in pytest-xdist's
workers (``-n auto``): each worker collects every test and starts the background work its
collection asks for. Work whose result any worker may need is done once:

- ``run_dir()``: a folder for the whole run, made by the controlling process (or by the only
  process, without xdist) and removed after every worker has ended, so a result one worker made
  stays readable by the others until the run ends;
- ``claim(name)``: true in exactly one process of the run, the one to do ``name``;
- ``build_lock(target)``: held while one process builds a cached ``target`` (a Go binary, the
  Spark archive, a browser); another process, or another test run, waits and then finds it built;
- ``background_niceness()``: how much to nice work started in the background.

Loaded as a pytest plugin by ``tests/conftest.py``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_WORKER_INPUT_KEY = "cg_run_dir"
_RUN_DIR: Path | None = None
_MADE_HERE = False


def pytest_configure(config: pytest.Config) -> None:
    global _RUN_DIR, _MADE_HERE
    given = getattr(config, "workerinput", {}).get(_WORKER_INPUT_KEY)
    if given:
        _RUN_DIR = Path(given)
    else:
        _RUN_DIR, _MADE_HERE = Path(tempfile.mkdtemp(prefix="cg-run-")), True


@pytest.hookimpl(optionalhook=True)  # xdist's: in the controlling process, once per worker it starts
def pytest_configure_node(node) -> None:
    node.workerinput[_WORKER_INPUT_KEY] = str(_RUN_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _MADE_HERE and _RUN_DIR is not None:
        shutil.rmtree(_RUN_DIR, ignore_errors=True)


def run_dir() -> Path:
    if _RUN_DIR is None:
        raise RuntimeError("tests.support.shared is a pytest plugin: load it from tests/conftest.py")
    return _RUN_DIR


def claim(name: str) -> bool:
    """True in exactly one process of the run (the first to ask): the one to do ``name``."""
    try:
        os.close(os.open(run_dir() / f"{name}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Held while this process builds ``target``: check for it again inside, then build."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def background_niceness() -> int:
    """In one process the tests leave about 40 % of two cores idle, which niced background work
    (builds, the wheel's install) takes without slowing them. xdist's workers leave none: niced,
    that work would starve until a test waits for it, and that worker would then sit idle."""
    return 0 if os.environ.get("PYTEST_XDIST_WORKER") else 10
