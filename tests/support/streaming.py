"""Run a user's streaming application (``tests/apps/streaming_app.py``) through a real
``spark-submit`` with Spark's own Delta package, as a ``MemberJob`` (its own process group,
so a test can SIGKILL the JVM and its Python processes together)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from airflow_provider_cg.core.jetstream.api import JsApi
from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
from airflow_provider_cg.core.jetstream.publish import publish_many
from tests.support.member_job import MemberJob, job_env
from tests.support.spark_reader import DELTA_SPARK_PACKAGE

STREAM = "ORD"
CUSTOMERS = 7
APP = Path(__file__).resolve().parents[1] / "apps" / "streaming_app.py"
DELTA_CONF = ("--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
              "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog")


def start_streaming_app(zip_path, workdir, *, nats_servers: str, args: list[str], name: str = "app",
                        env: dict[str, str] | None = None, app: Path = APP, master: str = "local[2]") -> MemberJob:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, "spark-submit"), "--master", master, "--driver-java-options",
           "-XX:TieredStopAtLevel=1", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
           "--packages", DELTA_SPARK_PACKAGE, *DELTA_CONF, "--py-files", str(zip_path), str(app), *args]
    tag = f"{name}-{time.monotonic_ns()}"
    out, err = workdir / f"{tag}.out", workdir / f"{tag}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, env=job_env(nats_servers, env), cwd=workdir, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return MemberJob(proc, cmd, out, err)


class Publisher(threading.Thread):
    """Orders published at about ``rate`` a second on its own connection, each with its
    event time (``ts``, the publish time) and the origin sequence it got."""

    def __init__(self, url: str, n: int, rate: float, subject_prefix: str = "orders") -> None:
        super().__init__(daemon=True)
        self.url, self.n, self.rate, self.prefix = url, n, rate, subject_prefix
        self.orders: dict[int, dict] = {}  # origin seq -> order
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._go())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    async def _go(self) -> None:
        nc = await NatsConnectionSettings(servers=[self.url]).connect()
        try:
            api = JsApi(nc)
            step = 50
            for i0 in range(0, self.n, step):
                first = int((await api.stream_info(STREAM))["state"]["last_seq"]) + 1
                now = time.time()
                batch = [{"id": i, "customer": f"c{i % CUSTOMERS}", "amount": float(i % 13), "ts": now}
                         for i in range(i0, min(self.n, i0 + step))]
                res = await publish_many(nc, ((f"{self.prefix}.k{o['id'] % CUSTOMERS}", json.dumps(o).encode())
                                              for o in batch))
                assert res.published == len(batch) and res.first_seq == first
                for k, o in enumerate(batch):
                    self.orders[first + k] = o
                await asyncio.sleep(step / self.rate)
        finally:
            await nc.close()


async def publish_flush(nc) -> int:
    """An order far in event time: the watermark passes every window before it."""
    res = await publish_many(nc, [("orders.k0", json.dumps({"id": -1, "customer": "flush", "amount": 0.0,
                                                             "ts": time.time() + 3600}).encode())])
    return res.first_seq


def windows_from(orders: dict[int, dict]) -> dict[tuple[int, str], tuple[int, float, list[int]]]:
    out: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0.0, []])
    for o in orders.values():
        w = out[(int(o["ts"] // 10 * 10), o["customer"])]
        w[0] += 1
        w[1] += o["amount"]
        w[2].append(o["id"])
    return {k: (n, a, sorted(ids)) for k, (n, a, ids) in out.items()}


def windows_landed(path: str) -> dict[tuple[int, str], tuple[int, float, list[int]]]:
    from tests.support.member_job import read_delta

    rows = read_delta(path).to_pylist()
    keys = [(int(r["window_start"].timestamp()), r["customer"]) for r in rows]
    assert len(keys) == len(set(keys)), "a window was appended twice"
    return {k: (r["orders"], r["amount"], sorted(r["ids"])) for k, r in zip(keys, rows, strict=True)}


async def wq_left(nc, group: str) -> int:
    return int((await JsApi(nc).stream_info(f"{STREAM}-{group}"))["state"]["messages"])
