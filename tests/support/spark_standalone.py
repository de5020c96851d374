"""A Spark standalone master and worker from PySpark's own distribution (``spark-class``),
on 127.0.0.1, started as processes of the test and stopped by their PIDs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from airflow_provider_cg.core.tools.server import free_port


class StandaloneCluster:
    def __init__(self, workdir: Path, cores: int = 2, memory: str = "2g", workers: int = 1) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cores, self.memory, self.workers = cores, memory, workers
        self.procs: list[subprocess.Popen] = []
        bindir = Path(sys.executable).parent
        self.spark_class = str(bindir / "spark-class")
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER_HOST": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "SPARK_NO_DAEMONIZE": "1", "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> Path:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen([self.spark_class, *args], env=self.env, stdout=out,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True))
        return log

    def start(self, timeout: float = 120) -> StandaloneCluster:
        master_log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                 "--port", str(self.port), "--webui-port", str(free_port()))
        self._wait(master_log, "Starting Spark master", timeout)
        for i in range(self.workers):
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.master, "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                        "--work-dir", str(self.workdir / "work"))  # executors get their own dirs in it
        deadline = time.monotonic() + timeout
        self._wait(master_log, "Registering worker", timeout)
        while master_log.read_text(errors="replace").count("Registering worker") < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                raise RuntimeError(f"Spark standalone: not every worker registered ({master_log})")
            time.sleep(0.5)
        return self

    def _wait(self, log: Path, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Spark standalone: {text!r} not seen in {log}: {log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_group(p)
        self.procs.clear()


def stop_group(p: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a process the test started in a session of its own, with its children: SIGTERM to
    its group, SIGKILL if it is still there after ``timeout``."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)
