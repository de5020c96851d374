"""Run a user's streaming application (``tests/apps/streaming_app.py``) through a real
``spark-submit`` with Spark's own Delta package, as a ``MemberJob`` (its own process group,
so a test can SIGKILL the JVM and its Python processes together)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.member_job import MemberJob, job_env
from tests.support.spark_reader import DELTA_SPARK_PACKAGE

APP = Path(__file__).resolve().parents[1] / "apps" / "streaming_app.py"
DELTA_CONF = ("--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
              "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog")


def start_streaming_app(zip_path, workdir, *, nats_servers: str, args: list[str], name: str = "app",
                        env: dict[str, str] | None = None, app: Path = APP) -> MemberJob:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, "spark-submit"), "--master", "local[2]", "--driver-java-options",
           "-XX:TieredStopAtLevel=1", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
           "--packages", DELTA_SPARK_PACKAGE, *DELTA_CONF, "--py-files", str(zip_path), str(app), *args]
    tag = f"{name}-{time.monotonic_ns()}"
    out, err = workdir / f"{tag}.out", workdir / f"{tag}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, env=job_env(nats_servers, env), cwd=workdir, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return MemberJob(proc, cmd, out, err)
