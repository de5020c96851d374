"""A Spark Connect server from PySpark's own distribution (``spark-submit --class
SparkConnectServer``), bound to 127.0.0.1 with a local master, started as a process of the test
and stopped by its PID; the provider's core is on its Python workers' path (``--py-files``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from airflow_provider_cg.core.tools.server import free_port
from tests.support.spark_standalone import stop_group

STARTED = b"Spark Connect server started"


class SparkConnectServer:
    def __init__(self, workdir: Path, py_files: Path) -> None:
        self.workdir, self.py_files = Path(workdir), Path(py_files)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> SparkConnectServer:
        for attempt in range(3):  # a port another process took first: another port
            self.port = free_port()
            log = self.workdir / f"connect-{attempt}.log"
            bindir = os.path.dirname(sys.executable)
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
                   "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
            with open(log, "wb") as out:
                self.proc = subprocess.Popen(
                    [os.path.join(bindir, "spark-submit"), "--class",
                     "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
                     "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                     "--conf", f"spark.connect.grpc.binding.port={self.port}", "--conf", "spark.ui.enabled=false",
                     "--conf", "spark.sql.shuffle.partitions=2", "--driver-java-options", "-XX:TieredStopAtLevel=1",
                     "--py-files", str(self.py_files), "spark-internal"],
                    env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if STARTED in log.read_bytes():
                    return self
                time.sleep(0.5)
            text = log.read_text(errors="replace")
            self.stop()
            if "Address already in use" not in text:
                raise RuntimeError(f"Spark Connect server did not start: {text[-2000:]}")
        raise RuntimeError("Spark Connect server: no free port")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc, 30.0)
