"""Pytest plugin for tests that run Airflow (see ``tests/support/airflow_env.py``).

Load it from the root ``tests/conftest.py`` with ``pytest_plugins = ["tests.airflow_conftest"]``
so ``pytest_configure`` points Airflow at a temp home before any test module is imported; a
test module may also name it in its own ``pytest_plugins`` if it imports Airflow lazily.

Fixtures: ``airflow_env`` (the activated environment: migrated SQLite DB, Airflow imported),
``nats_conn_id`` (an Airflow connection of type ``nats`` to the ``nats_server`` fixture),
``spark_env`` (real spark-submit in local mode: the Spark connection ``spark_test``),
``example_dag`` (loads a shipped example DAG from ``dags/`` as a fresh module).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest

from tests.support import airflow_env as _airflow_env

NATS_CONN_ID = "nats_test"


def pytest_configure(config: pytest.Config) -> None:
    _airflow_env.configure()


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only tests that run start it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.option.collectonly and any("airflow_session_env" in getattr(item, "fixturenames", ())
                                             for item in items):
        _airflow_env.start_migration()


def pytest_unconfigure(config: pytest.Config) -> None:
    _airflow_env.cleanup()


@pytest.fixture(scope="session")
def airflow_session_env() -> _airflow_env.AirflowEnv:
    return _airflow_env.activate()


@pytest.fixture
def airflow_env(airflow_session_env: _airflow_env.AirflowEnv):
    """The Airflow test environment; connections added during the test vanish after it."""
    before = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")}
    yield airflow_session_env
    for name in [k for k in os.environ if k.startswith("AIRFLOW_CONN_")]:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]


@pytest.fixture
def nats_conn_id(airflow_env: _airflow_env.AirflowEnv, nats_server) -> str:
    """Connection ``nats_test`` (type ``nats``) pointing at the ``nats_server`` fixture."""
    airflow_env.add_connection(NATS_CONN_ID, "nats", host="127.0.0.1", port=nats_server.port)
    return NATS_CONN_ID


@pytest.fixture
def spark_env(airflow_env, monkeypatch):
    """spark-submit of the venv first on PATH, the driver on this interpreter, spark_test = local[2]."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    airflow_env.add_connection("spark_test", "spark", host="local[2]")
    return "spark_test"


@pytest.fixture
def example_dag():
    """``load(file_name)``: the module of a shipped example DAG, loaded afresh (it reads its
    environment, e.g. ``CG_BACKFILL_*``, when loaded)."""
    from airflow_provider_cg.core.tools.packaging import example_dags_folder

    def load(file_name: str):
        path = example_dags_folder() / file_name
        spec = importlib.util.spec_from_file_location(f"{path.stem}_{uuid.uuid4().hex[:6]}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
