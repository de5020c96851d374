"""Pytest plugin for tests that run Airflow (see ``tests/support/airflow_env.py``).

Load it from the root ``tests/conftest.py`` with ``pytest_plugins = ["tests.airflow_conftest"]``
so ``pytest_configure`` points Airflow at a temp home before any test module is imported; a
test module may also name it in its own ``pytest_plugins`` if it imports Airflow lazily.

Fixtures: ``airflow_env`` (the activated environment: migrated SQLite DB, Airflow imported),
``nats_conn_id`` (an Airflow connection of type ``nats`` to the ``nats_server`` fixture).
"""

from __future__ import annotations

import os

import pytest

from tests.support import airflow_env as _airflow_env

NATS_CONN_ID = "nats_test"


def pytest_configure(config: pytest.Config) -> None:
    _airflow_env.configure()


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
