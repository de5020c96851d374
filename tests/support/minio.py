"""A real S3-compatible server for the lake tests: MinIO, built from the Go module proxy.

Built once into ``$CG_ORBIT_CACHE`` (default ``~/.cache/airflow-provider-cg``), as orbit's CLI
is; started on 127.0.0.1 with a temp data directory, stopped by the PID it started. The
``minio_server`` fixture is per session (a server starts in ~2 s, a build takes minutes);
each test gets its own bucket from ``s3_bucket``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gobuild import go_build
from tests.support.prebuild import built

MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"  # the newest the proxy serves (2026-02)


def build_minio(version: str = MINIO_VERSION) -> Path:
    return go_build("minio", MINIO_MODULE, version, MINIO_MODULE, "minio", timeout=1800)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MinioServer:
    binary: Path
    data: Path
    port: int
    user: str
    password: str
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **overrides: str) -> dict[str, str]:
        """The AWS_* variables a job or sink reads."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.user,
                "AWS_SECRET_ACCESS_KEY": self.password, "AWS_REGION": "us-east-1", **overrides}

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "MINIO_ROOT_USER": self.user, "MINIO_ROOT_PASSWORD": self.password,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"}
        log = open(self.data.parent / "minio.log", "ab")  # noqa: SIM115 - the server's own log
        self.proc = subprocess.Popen(
            [str(self.binary), "server", str(self.data), "--address", f"127.0.0.1:{self.port}",
             "--console-address", f"127.0.0.1:{_free_port()}", "--quiet"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("MinIO did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown of its own."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def make_bucket(self, name: str | None = None) -> str:
        import pyarrow.fs as pafs

        name = name or f"b{secrets.token_hex(6)}"
        fs = pafs.S3FileSystem(access_key=self.user, secret_key=self.password, region="us-east-1",
                               endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir(name)
        return name


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("minio")
    (root / "data").mkdir()
    server = MinioServer(built(build_minio), root / "data", _free_port(), "cgtest", secrets.token_hex(12))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(minio_server, monkeypatch) -> str:
    """A fresh bucket, with this process's AWS_* environment pointing at the server."""
    for k, v in minio_server.env().items():
        monkeypatch.setenv(k, v)
    return minio_server.make_bucket()
