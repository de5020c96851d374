"""The order ``make test``'s workers take test files in: the longest first (by the seconds each
file took in a recorded run, ``tests/file_durations.json``), so the run ends on short files and
no worker sits idle while another finishes a long one. Files the record does not know yet go
first. Tests keep their order inside a file, and a file runs in one worker (``--dist
loadfile``): its module fixtures (the UI's api-server) start once.

``pytest --record-file-durations`` writes the record again from the run's own reports. The
order changes only how soon the run ends, never what a test sees.

Loaded as a pytest plugin by ``tests/conftest.py``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[1] / "file_durations.json"
_took: dict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-file-durations", action="store_true",
                     help=f"write each test file's seconds in this run to {RECORD.name} (the order make test's "
                          "workers take files in)")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before the hooks that move single tests (the wheel's test, last)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds, unknown = _recorded(), float("inf")
    items.sort(key=lambda item: -seconds.get(_file(item.nodeid), unknown))  # stable: a file's own order stays


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _took[_file(report.nodeid)] += report.duration  # under xdist: in the controlling process, every worker's


def _recorded() -> dict[str, float]:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The files this run ran replace their recorded seconds; the others keep theirs."""
    if session.config.getoption("record_file_durations") and not hasattr(session.config, "workerinput") and _took:
        merged = {**_recorded(), **{f: round(s, 1) for f, s in _took.items()}}
        RECORD.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
