"""A real Airflow API server (UI and REST API) on 127.0.0.1 for browser tests, and Chromium.

``AirflowUI.start(home_env)`` runs ``airflow api-server`` on the test Airflow's home and
SQLite DB with the simple auth manager and two users of known passwords (``admin``: admin,
``viewer``: viewer), and waits for its health endpoint; ``stop()`` ends it by its process
group. ``browser()`` launches Debian's Chromium (``/usr/bin/chromium``, installed by
``ensure_chromium``) through Playwright, with the flags this closed network needs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.gobuild import cache_dir
from tests.support.shared import build_lock

CHROMIUM = os.environ.get("CG_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
USERS = {"admin": ("admin", "admin-pw-3c1f"), "viewer": ("viewer", "viewer-pw-88a2")}


def ensure_chromium() -> str | None:
    """Debian's chromium, installed with apt-get when missing and allowed (root). None: not had."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with build_lock(cache_dir() / "chromium-apt"):  # apt-get beside another apt-get fails on dpkg's lock
            for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                        ["apt-get", "install", "-y", "-q", "chromium"]):
                if os.path.exists(CHROMIUM):
                    return CHROMIUM
                subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    return CHROMIUM if os.path.exists(CHROMIUM) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AirflowUI:
    proc: subprocess.Popen
    url: str
    log: Path

    @classmethod
    def start(cls, home: Path, timeout: float = 120.0, extra_env: dict[str, str] | None = None) -> AirflowUI:
        port = _free_port()
        passwords = home / "cg_ui_passwords.json"
        passwords.write_text(json.dumps({name: pw for name, (_, pw) in USERS.items()}))
        env = {**os.environ,
               "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                                              "SimpleAuthManager",
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{n}:{r}" for n, (r, _) in USERS.items()),
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
               "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
               "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(16).hex(), **(extra_env or {})}
        log = home / "api-server.log"
        out = open(log, "wb")
        proc = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", "1", "--apps", "all"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        ui = cls(proc, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"airflow api-server exited {proc.returncode}:\n{ui.log_tail()}")
            try:
                with urllib.request.urlopen(f"{ui.url}/api/v2/monitor/health", timeout=2) as r:
                    if r.status == 200:
                        return ui
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        ui.stop()
        raise RuntimeError(f"airflow api-server not healthy within {timeout}s:\n{ui.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def token(self, user: str = "admin") -> str:
        body = json.dumps({"username": user, "password": USERS[user][1]}).encode()
        req = urllib.request.Request(f"{self.url}/auth/token", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["access_token"]

    def api(self, method: str, path: str, body: dict | None = None, user: str | None = "admin") -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if user:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        req = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw.strip().startswith((b"{", b"[")) else {"text": raw.decode()})
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"text": raw.decode(errors="replace")}


def browser(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
