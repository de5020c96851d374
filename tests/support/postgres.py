"""A throwaway PostgreSQL 15 server for tests: loopback only, temp data dir, stopped by data dir.

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user (or
``nobody``) via ``runuser``. The superuser password is random, handed to ``initdb`` in a
file and to clients in connection parameters, never on a command line. Authentication is
scram-sha-256 on TCP; the unix socket lives in the temp dir.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"


class PostgresStartError(RuntimeError):
    """The test server could not be initialised or started (message includes its log tail)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _binary(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/lib/postgresql/15/bin/{name}" if os.path.exists(f"/usr/lib/postgresql/15/bin/{name}") else None
    )
    if not found:
        raise PostgresStartError(f"{name} not found on PATH (PostgreSQL 15 server binaries are needed)")
    return found


@dataclass(frozen=True)
class PostgresParams:
    """Where the test server listens. ``repr`` hides the password."""

    host: str
    port: int
    user: str
    dbname: str
    password: str = field(repr=False)

    def conn_params(self, **overrides) -> dict:
        params = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "dbname": self.dbname,
            "password": self.password,
            "connect_timeout": 10,
        }
        params.update(overrides)
        return params

    @property
    def dsn(self) -> str:
        return (
            f"host={self.host} port={self.port} user={self.user} dbname={self.dbname} "
            f"password={self.password} connect_timeout=10"
        )

    def with_db(self, dbname: str) -> PostgresParams:
        return PostgresParams(self.host, self.port, self.user, dbname, self.password)


class PostgresTestServer:
    """``start()`` runs initdb + pg_ctl start; ``stop()`` runs ``pg_ctl stop -m fast`` on its data dir."""

    def __init__(self, *, max_prepared_transactions: int = 20, user: str = "cg_test") -> None:
        self.max_prepared_transactions = max_prepared_transactions
        self.user = user
        self.password = secrets.token_urlsafe(18)
        # not under pytest's 0700 tmp dirs: the server user must be able to reach it
        self.base = Path(tempfile.mkdtemp(prefix="cg-pg-"))
        self.data_dir = self.base / "data"
        self.socket_dir = self.base / "sock"
        self.log_file = self.base / "server.log"
        self.port = _free_port()
        self.pid: int | None = None
        self._run_as = self._pick_user()

    @staticmethod
    def _pick_user() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                continue
        raise PostgresStartError("running as root and neither 'postgres' nor 'nobody' exists for initdb")

    @property
    def params(self) -> PostgresParams:
        return PostgresParams(LOOPBACK, self.port, self.user, "postgres", self.password)

    def _cmd(self, *args: str) -> list[str]:
        if self._run_as is None:
            return list(args)
        return ["runuser", "-u", self._run_as.pw_name, "--", *args]

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        return subprocess.run(
            self._cmd(*args), capture_output=True, text=True, timeout=timeout, env=env, cwd=self.base
        )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no server log)"

    def start(self) -> PostgresTestServer:
        try:
            self._init()
            self._start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def _init(self) -> None:
        self.socket_dir.mkdir()
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if self._run_as is not None:
            for path in (self.base, self.socket_dir, pwfile):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)
            os.chmod(self.base, 0o700)
        try:
            res = self._run(
                _binary("initdb"),
                "-D", str(self.data_dir),
                "-U", self.user,
                f"--pwfile={pwfile}",
                "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256",
                "-E", "UTF8",
                "--locale=C",
                "--no-sync",
            )  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)
        if res.returncode != 0:
            raise PostgresStartError(f"initdb failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        conf = self.data_dir / "postgresql.conf"
        with open(conf, "a") as fh:
            fh.write(
                "\n# test server\n"
                f"listen_addresses = '{LOOPBACK}'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                f"max_prepared_transactions = {self.max_prepared_transactions}\n"
                "max_connections = 60\n"
                "shared_buffers = 64MB\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "log_min_messages = warning\n"
            )

    def _start(self) -> None:
        self.log_file.touch()
        if self._run_as is not None:
            os.chown(self.log_file, self._run_as.pw_uid, self._run_as.pw_gid)
        res = self._run(
            _binary("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start"
        )
        if res.returncode != 0:
            raise PostgresStartError(
                f"pg_ctl start failed ({res.returncode}): {res.stderr.strip()[-1000:]}\n{self._log_tail()}"
            )
        pid_file = self.data_dir / "postmaster.pid"
        self.pid = int(pid_file.read_text().splitlines()[0])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise PostgresStartError(f"PostgreSQL did not listen on {LOOPBACK}:{self.port}\n{self._log_tail()}")

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` on our data dir; SIGKILL our postmaster PID if that fails."""
        if self.pid is None:
            return
        res = self._run(_binary("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop")
        if res.returncode != 0:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid = None

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def connect(self, dbname: str = "postgres"):
        import psycopg2

        conn = psycopg2.connect(**self.params.with_db(dbname).conn_params())
        conn.autocommit = True
        return conn

    def create_database(self, name: str) -> PostgresParams:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.params.with_db(name)

    def drop_database(self, name: str) -> None:
        """Roll back the database's leftover prepared transactions, then drop it."""
        conn = self.connect(name)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
                for (gid,) in cur.fetchall():
                    cur.execute("ROLLBACK PREPARED %s", (gid,))
        finally:
            conn.close()
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            conn.close()
