"""A StatsD server for tests: what Airflow's metrics send, as received on a real socket."""

from __future__ import annotations


class StatsdListener:
    """A real UDP socket on 127.0.0.1 that keeps every StatsD line it receives."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except OSError:
                continue
            self.lines += data.decode(errors="replace").splitlines()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def gauges(self, prefix: str) -> list[tuple[str, float]]:
        """Every gauge received whose name starts with ``prefix``, in order: ``(name, value)``."""
        out = []
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            if name.startswith(prefix) and rest.endswith("|g"):
                out.append((name, float(rest.split("|")[0])))
        return out
