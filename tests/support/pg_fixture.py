"""pytest fixtures for a real PostgreSQL 15: ``postgres_server`` (session) and ``postgres_db``.

Wire them with ``from tests.support.pg_fixture import postgres_server, postgres_db`` in a
conftest. A server that cannot start fails the test with its log tail; nothing is skipped.
"""

from __future__ import annotations

import secrets

import pytest

from tests.support.postgres import PostgresParams, PostgresTestServer


@pytest.fixture(scope="session")
def postgres_server():
    """A running PostgreSQL 15 (``max_prepared_transactions=20``) on 127.0.0.1.

    Yields the ``PostgresTestServer``; ``.params`` (a ``PostgresParams``: ``.dsn``,
    ``.conn_params()``, ``.with_db(name)``) connects as its superuser.
    """
    server = PostgresTestServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def postgres_db(postgres_server) -> PostgresParams:
    """A fresh database for one test; its prepared transactions are rolled back and it is dropped after."""
    name = f"cg_{secrets.token_hex(6)}"
    params = postgres_server.create_database(name)
    yield params
    postgres_server.drop_database(name)
