"""One PostgreSQL connection of a sink (psycopg2, imported when first used): autocommit,
``lock_timeout`` set, serialised by a lock, errors turned into ``SinkError`` with every secret
of the DSN masked (``password=``, URL credentials, ``PGPASSWORD``)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError, SinkLockTimeout

if TYPE_CHECKING:
    from collections.abc import Callable

#: psycopg2's cursor and connection (psycopg2 ships no type information)
Cursor = Any
Connection = Any
Result = TypeVar("Result")

_SECRET_PATTERNS = [
    re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
    re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)"),
]


def rollback_quietly(cur: Cursor) -> None:
    if cur.connection.closed:
        return
    try:
        cur.execute("ROLLBACK")
    except Exception:  # the original error matters
        pass



class PgConnection:
    """The connection (``dsn_or_conn_params``: a libpq DSN/URI string or psycopg2 ``connect()``
    keywords); ``run(action, fn)`` runs ``fn(cursor)`` on it."""

    def __init__(self, dsn_or_conn_params: str | Mapping[str, Any], *, lock_timeout_s: float) -> None:
        self.dsn: str | dict[str, Any] = dsn_or_conn_params if isinstance(dsn_or_conn_params, str) \
            else dict(dsn_or_conn_params)
        self.lock_timeout_s = lock_timeout_s
        self._conn: Any = None
        self.lock = threading.RLock()
        self._secrets = self._find_secrets()

    def describe(self) -> str:
        """Where it connects, without a secret (``repr`` of the sink)."""
        if isinstance(self.dsn, dict):
            return f"host={self.dsn.get('host')!r}, dbname={self.dsn.get('dbname')!r}"
        return "dsn=***"

    def _find_secrets(self) -> list[str]:
        found = [os.environ.get("PGPASSWORD", "")]
        if isinstance(self.dsn, dict):
            found.append(str(self.dsn.get("password") or ""))
        else:
            try:
                from psycopg2.extensions import parse_dsn

                found.append(parse_dsn(self.dsn).get("password", ""))
            except Exception:  # unparsable DSN: take what looks like a password
                for pattern in _SECRET_PATTERNS:
                    found.extend(m.group(2).strip("'") for m in pattern.finditer(self.dsn))
        return [s for s in found if s]

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub(lambda m: m.group(1) + "***" + (m.group(3) if m.lastindex == 3 else ""), text)
        return text

    def error(self, exc: BaseException, action: str) -> SinkError:
        code = getattr(exc, "pgcode", None)
        message = " ".join(self._redact(str(exc).strip()).split()) or type(exc).__name__  # one line
        err = SinkError(f"postgres {action} failed{f' [{code}]' if code else ''}: {message}")
        err.pgcode = code  # type: ignore[attr-defined]
        return err

    def lock_error(self, exc: SinkError, what: str) -> SinkError:
        """A lock timeout (55P03) told as what it is, with the prepared writes holding locks."""
        if getattr(exc, "pgcode", None) != "55P03":
            return exc
        try:
            pending = self.run(
                "list prepared",
                lambda cur: (
                    cur.execute(
                        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                        "AND left(gid, 3) = 'cg:' ORDER BY prepared"
                    ),
                    [r[0] for r in cur.fetchall()],
                )[1],
            )
        except SinkError:
            pending = ["(could not list)"]
        err = SinkLockTimeout(
            f"{what} waited more than {self.lock_timeout_s:g}s for rows or tables locked by another "
            f"transaction. Prepared writes pending in this database: {pending or 'none'}. A prepared "
            "write keeps its locks until committed or aborted: run recover() for its member first."
        )
        err.pgcode = "55P03"  # type: ignore[attr-defined]
        return err

    def _connection(self) -> Connection:
        import psycopg2

        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            if isinstance(self.dsn, dict):
                conn = psycopg2.connect(**self.dsn)
            else:
                conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SET lock_timeout = %s", (f"{int(self.lock_timeout_s * 1000)}ms",))
                cur.execute("SET application_name = 'airflow-provider-cg'")
        except psycopg2.Error as exc:
            raise self.error(exc, "connect") from None
        self._conn = conn
        return conn

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None

    def run(self, action: str, fn: Callable[[Cursor], Result]) -> Result:
        """Run ``fn(cursor)`` on the autocommit connection; map psycopg2 errors."""
        import psycopg2

        with self.lock:
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    return fn(cur)
            except psycopg2.Error as exc:
                if conn.closed or isinstance(exc, psycopg2.InterfaceError):
                    self._drop_connection()
                raise self.error(exc, action) from None

    def _drop_connection(self) -> None:
        try:
            if self._conn is not None:
                self._conn.close()
        except Exception:
            pass
        self._conn = None

