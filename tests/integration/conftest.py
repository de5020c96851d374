"""PostgreSQL fixtures for the integration tests (see tests/support/pg_fixture.py)."""

from tests.support.pg_fixture import postgres_db, postgres_server  # noqa: F401
