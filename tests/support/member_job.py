"""Run ``spark_apps/cg_member_job.py`` through a real ``spark-submit`` for integration tests.

``member_job_zip`` (session fixture) builds the ``--py-files`` zip once. ``start_member_job``
starts the job in its own process group (so a test can SIGKILL / SIGSTOP / SIGCONT the whole
JVM + Python driver tree by the id it started) and returns a ``MemberJob``; ``.wait()`` gives
a ``JobResult`` with the exit status, the output and the parsed ``CG_SUMMARY``. Output goes to
files, never to pipes, so a chatty or suspended job cannot block on a full pipe.

Secrets go to the job only through its environment (``CG_NATS_*``, ``CG_PG_DSN``), never as
arguments; ``JobResult.cmd`` is the exact command line for tests to check that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_cg.core.landing.contract import SUMMARY_PREFIX
from airflow_provider_cg.core.tools.packaging import build_core_zip, member_job_path
from tests.support.spark_cds import spark_driver_java_options

DEFAULT_TIMEOUT = 240.0


@pytest.fixture(scope="session")
def member_job_zip(tmp_path_factory) -> Path:
    """The core zip for ``--py-files``, built once per test session."""
    return build_core_zip(tmp_path_factory.mktemp("cg-zip") / "cg_core.zip")


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    cmd: list[str]
    duration_s: float

    @property
    def output(self) -> str:
        """stdout and stderr: spark-submit merges the Python driver's stderr into its stdout."""
        return self.stdout + self.stderr

    @property
    def summary(self) -> dict | None:
        """The ``CG_SUMMARY`` JSON; it must be the last line on stdout."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        if not lines or not lines[-1].startswith(SUMMARY_PREFIX):
            return None
        return json.loads(lines[-1][len(SUMMARY_PREFIX):])

    def describe(self) -> str:
        """A failure message: status, command, summary and the job's log tail."""
        out = "\n".join(line for line in self.stdout.splitlines() if " INFO " not in line)
        err = "\n".join([line for line in self.stderr.splitlines() if " INFO " not in line][-40:])
        return (f"member job exited {self.returncode} after {self.duration_s:.1f}s\n"
                f"cmd: {' '.join(self.cmd)}\nstdout (no INFO):\n{out[-5000:]}\nstderr tail (no INFO):\n{err}")


class MemberJob:
    """One running ``spark-submit`` of the member job (a process group led by ``pid``)."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], out: Path, err: Path) -> None:
        self.proc, self.cmd, self.out, self.err = proc, cmd, out, err
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the job's whole process group (JVM and Python driver)."""
        if self.running():
            os.killpg(self.proc.pid, sig)

    def suspend(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stderr_so_far(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def output_so_far(self) -> str:
        """stdout and stderr: spark-submit merges the Python driver's stderr into its stdout."""
        out = self.out.read_text(errors="replace") if self.out.exists() else ""
        return out + self.stderr_so_far()

    def wait_for_log(self, text: str, timeout: float = 120.0) -> bool:
        """Wait until ``text`` shows up in the job's output (or the job ends)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output_so_far():
                return True
            if not self.running():
                return text in self.output_so_far()
            time.sleep(0.05)
        return False

    def wait(self, timeout: float = DEFAULT_TIMEOUT) -> JobResult:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"member job did not finish within {timeout}s:\n"
                                 + self.result().describe()) from None
        return self.result()

    def result(self) -> JobResult:
        return JobResult(
            returncode=self.proc.returncode if self.proc.returncode is not None else -1,
            stdout=self.out.read_text(errors="replace") if self.out.exists() else "",
            stderr=self.stderr_so_far(),
            cmd=list(self.cmd),
            duration_s=time.monotonic() - self.started,
        )


def job_env(nats_servers: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job: this interpreter for PySpark, NATS servers, extras."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CG_NATS_", "CG_PG_")) and k != "CG_FAILPOINT"}
    bindir = os.path.dirname(sys.executable)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PATH=bindir + os.pathsep + env.get("PATH", ""), SPARK_LOCAL_IP="127.0.0.1")
    if nats_servers:
        env["CG_NATS_SERVERS"] = nats_servers
    env.update(extra or {})
    return env


def start_member_job(
    zip_path: str | os.PathLike,
    workdir: str | os.PathLike,
    *,
    nats_servers: str | None,
    stream: str,
    group: str,
    member: str | None,
    sink: str = "parquet",
    sink_path: str | os.PathLike | None = None,
    args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    name: str | None = None,
    spark: bool = True,
    py_files: list[str] | tuple[str, ...] = (),
    spark_options: list[str] | tuple[str, ...] = (),
) -> MemberJob:
    """Start ``spark-submit --master local[2]`` of the member job; returns at once.

    ``spark=False`` runs the same entry point as a plain Python driver with ``--no-spark``
    (raw payloads; the protocol code is the same): for tests that start and kill many jobs
    on a small machine, where a JVM per job would dominate."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = name or f"{group}-{member}-{time.monotonic_ns()}"
    bindir = os.path.dirname(sys.executable)
    if spark:
        # C1-only JIT (a JVM that starts ~1.5 s sooner; the tests' batches are small) and a
        # class-data-sharing archive of Spark's classes (~3 s sooner)
        launch = [os.path.join(bindir, "spark-submit"), "--master", "local[2]",
                  "--driver-java-options", spark_driver_java_options(),
                  "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
                  "--py-files", ",".join([str(zip_path), *map(str, py_files)]), *spark_options,
                  str(member_job_path())]
    else:
        launch = [sys.executable, str(member_job_path()), "--no-spark"]
    cmd = [
        *launch,
        "--stream", stream, "--group", group, *(["--member", member] if member else []), "--sink", sink,
    ]
    if sink_path is not None:
        cmd += ["--sink-path", str(sink_path)]
    cmd += list(args)
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, env=job_env(nats_servers, env), cwd=workdir, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return MemberJob(proc, cmd, out, err)


def run_member_job(zip_path, workdir, *, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> JobResult:
    """``start_member_job`` and wait for it."""
    return start_member_job(zip_path, workdir, **kwargs).wait(timeout)


# --- what landed -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Landed:
    """One landed row, in the sink's commit order."""

    origin_stream: str
    origin_seq: int
    key: str
    partition: int


def parquet_landed(path: str | os.PathLike) -> list[Landed]:
    """The committed rows of a Parquet lake, file by file in commit-log order."""
    import pyarrow.parquet as pq

    from airflow_provider_cg.core.landing.sinks.lake.reader import committed_files

    out: list[Landed] = []
    for f in committed_files(path):
        t = pq.read_table(f, columns=["origin_stream", "origin_seq", "key", "partition"])
        out += [Landed(*r) for r in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)]
    return out


def postgres_landed(conn_params: dict, table: str = "cg_events") -> list[Landed]:
    """The committed rows of a PostgreSQL sink table, in commit order.

    Each batch is one (prepared, then committed) transaction and a member prepares batch k+1
    only after batch k committed, so the inserting transaction id orders one member's
    batches; within a batch rows are ordered by origin_seq."""
    import psycopg2

    with psycopg2.connect(**conn_params) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT origin_stream, origin_seq, key, partition FROM "{table}" '
                    "ORDER BY xmin::text::bigint, origin_seq")
        rows = [Landed(*r) for r in cur.fetchall()]
    conn.close()
    return rows


def assert_exactly_once(landed: list[Landed], expected: dict[tuple[str, int], str], *,
                        resized_after: int | None = None) -> None:
    """Every expected ``(origin_stream, origin_seq) -> key`` landed once, nothing else landed,
    and within every key the rows appear in the sink's commit order by increasing origin_seq
    (within a life of the stream; a later life's after an earlier one's).
    Each key stays in one partition (with ``resized_after``: one up to that origin sequence,
    one after it)."""
    seen: dict[tuple[str, int], int] = {}
    for r in landed:
        seen[(r.origin_stream, r.origin_seq)] = seen.get((r.origin_stream, r.origin_seq), 0) + 1
    dups = sorted(k for k, n in seen.items() if n > 1)
    lost = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    assert not dups, f"{len(dups)} duplicated rows, e.g. {dups[:5]}"
    assert not lost, f"{len(lost)} lost messages, e.g. {lost[:5]}"
    assert not extra, f"{len(extra)} unexpected rows, e.g. {extra[:5]}"
    wrong_key = [(r.origin_seq, r.key) for r in landed if expected[(r.origin_stream, r.origin_seq)] != r.key]
    assert not wrong_key, f"rows with the wrong key: {wrong_key[:5]}"
    partition_of_key: dict[tuple[str, bool], int] = {}
    for r in landed:
        era = resized_after is not None and r.origin_seq > resized_after
        assert partition_of_key.setdefault((r.key, era), r.partition) == r.partition, \
            f"key {r.key!r} in two partitions"
    # per key, in commit order: origin sequences increase within a life of the stream, and a
    # later life's messages (published after the earlier one's: stream_life.py) come after
    from airflow_provider_cg.core.landing.stream_life import life_number

    last: dict[str, tuple[int, int]] = {}
    for r in landed:
        prev, now = last.get(r.key), (life_number(r.origin_stream), r.origin_seq)
        assert prev is None or now > prev, (
            f"key {r.key!r}: {r.origin_stream} {r.origin_seq} committed after life {prev[0]} seq {prev[1]} "
            "(per-key order broken)")
        last[r.key] = now


def assert_each_order_counted_once(out, orders: dict) -> None:
    """A per-batch aggregation's rows (``customer``, ``orders``, ``total``: the example
    ``totals_per_customer``) add up to every order of ``orders`` (origin seq -> order) once."""
    from collections import Counter

    counts, totals = Counter(), Counter()
    for c, n, t in zip(out.column("customer").to_pylist(), out.column("orders").to_pylist(),
                       out.column("total").to_pylist(), strict=True):
        counts[c] += n
        totals[c] += t
    assert counts == Counter(o["customer"] for o in orders.values())  # each order counted once
    want = Counter()
    for o in orders.values():
        want[o["customer"]] += o["amount"]
    assert all(abs(totals[c] - want[c]) < 1e-6 for c in want)


# --- test data ---------------------------------------------------------------------------------

async def create_group(nc, stream: str, group: str, *, partitions: int, members: tuple[str, ...],
                       subjects_prefix: str = "orders", replicas: int = 1) -> None:
    """An origin stream ``<prefix>.*`` and an elastic group partitioned by the key token (the
    group's work-queue stream gets the origin's ``replicas``)."""
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter

    await nc.jetstream().add_stream(name=stream, subjects=[f"{subjects_prefix}.*"], num_replicas=replicas)
    await ConsumerGroups(nc).create(stream, group, ElasticGroupConfig(
        partitions, (PartitioningFilter(f"{subjects_prefix}.*", (1,)),), members=members))


async def publish_orders(nc, stream: str, group: str, n: int, keys: int, *, subjects_prefix: str = "orders",
                         payload=None, wait_sourced: bool = True) -> dict[tuple[str, int], str]:
    """Publish ``n`` JSON messages round-robin over ``keys`` keys (acked by JetStream), wait until
    the group's work-queue stream sourced all of them (unless not ``wait_sourced``); return
    ``{(stream, seq): key}``."""
    import asyncio

    from airflow_provider_cg.core.jetstream.api import JsApi
    from airflow_provider_cg.core.jetstream.publish import publish_many

    payload = payload or (lambda i: b'{"id":%d}' % i)
    api = JsApi(nc)
    first = int((await api.stream_info(stream))["state"]["last_seq"]) + 1
    res = await publish_many(nc, ((f"{subjects_prefix}.k{i % keys}", payload(i)) for i in range(n)))
    assert res.published == n and res.first_seq == first, res
    expected = {(stream, first + i): f"k{i % keys}" for i in range(n)}
    if not wait_sourced:
        return expected
    want = len(expected) + first - 1
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # the work queue, or the partition log in the partition-streams layout, sources the origin
        for name in (f"{stream}-{group}", f"{stream}-{group}-log"):
            try:
                info = await api.stream_info(name)
            except Exception:  # noqa: BLE001 - no log: the work queue sources
                continue
            sources = info.get("sources") or []
            if sources and int(sources[0].get("seq") or 0) >= want:
                return expected
        assert asyncio.get_running_loop().time() < deadline, f"the group of {stream} sourced only {info}"
        await asyncio.sleep(0.1)


async def wq_messages(nc, stream: str, group: str) -> int:
    from airflow_provider_cg.core.jetstream.api import JsApi

    return int((await JsApi(nc).stream_info(f"{stream}-{group}"))["state"]["messages"])


def _s3_filesystem(storage_options: dict | None):
    import pyarrow.fs as pafs

    o = storage_options or {}
    endpoint = o["AWS_ENDPOINT"].split("://", 1)
    return pafs.S3FileSystem(access_key=o["AWS_ACCESS_KEY_ID"], secret_key=o["AWS_SECRET_ACCESS_KEY"],
                             region=o.get("AWS_REGION", "us-east-1"), scheme=endpoint[0], endpoint_override=endpoint[1])


def read_delta(location: str, columns=None, storage_options: dict | None = None, version: int | None = None,
               partitions: list | None = None):
    """A Delta table (as of ``version``; only the files of ``partitions``, delta-rs partition
    filters such as ``[("region", "=", "r1")]``) as delta-rs lists its files, read by pyarrow.

    Not ``DeltaTable.to_pyarrow_dataset()``: a scan through it leaves threads that abort the
    interpreter at exit ("terminate called without an active exception", delta-rs issue 2184),
    which would turn a green test run into exit 134."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(str(location), storage_options=storage_options, version=version)
    schema = pa.schema(dt.schema().to_arrow())
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    uris = dt.file_uris(partitions)
    if not uris:
        return schema.empty_table()
    if str(location).startswith("s3://"):
        return pq.read_table([u[len("s3://"):] for u in uris], schema=schema, filesystem=_s3_filesystem(storage_options))
    return pq.read_table(uris, schema=schema)


def delta_landed(location: str, storage_options: dict | None = None) -> list[Landed]:
    """The rows of a Delta table in commit order: the ``add`` actions of each ``_delta_log``
    version in turn (read with pyarrow's filesystems, not the sink), cross-checked against
    what delta-rs reads as the table."""
    import json as _json

    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(location, storage_options=storage_options)
    if location.startswith("s3://"):
        fs, root = _s3_filesystem(storage_options), location[len("s3://"):]
    else:
        fs, root = pafs.LocalFileSystem(), str(location)
    cols = ["origin_stream", "origin_seq", "key", "partition"]
    out: list[Landed] = []
    for version in range(dt.version() + 1):
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as f:
            actions = [_json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
        for a in actions:
            if "add" in a:
                t = pq.read_table(f"{root}/{a['add']['path']}", columns=cols, filesystem=fs)
                out += [Landed(*r) for r in zip(*(t.column(c).to_pylist() for c in cols), strict=True)]
    table = read_delta(location, ["origin_stream", "origin_seq"], storage_options)
    read = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
    logged = sorted((r.origin_stream, r.origin_seq) for r in out)
    assert read == logged, (f"delta-rs reads other rows than the log adds: {len(read)} vs {len(logged)}, "
                            f"{read[:3]} vs {logged[:3]}")
    return out


def iceberg_landed(catalog_uri: str, identifier: str, catalog_name: str = "default") -> list[Landed]:
    """The rows of an Iceberg table in snapshot order (each snapshot's added files), through
    pyiceberg's catalog and scan planning."""
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_provider_cg.core.landing.sinks.iceberg.writer import iceberg_io_properties
    from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

    # the object store's endpoint and keys (from AWS_*), for tables whose files are on S3
    props = iceberg_io_properties(ObjectStoreSettings.from_env())
    tbl = SqlCatalog(catalog_name, uri=catalog_uri, **props).load_table(identifier)
    cols = ("origin_stream", "origin_seq", "key", "partition")
    out: list[Landed] = []
    seen: set[str] = set()
    for snap in sorted(tbl.snapshots(), key=lambda s: s.sequence_number):
        files = [t.file for t in tbl.scan(snapshot_id=snap.snapshot_id, selected_fields=cols).plan_files()]
        new = [f for f in files if f.file_path not in seen]
        seen |= {f.file_path for f in new}
        for f in sorted(new, key=lambda f: f.file_path):
            t = _read_iceberg_file(tbl, f.file_path, cols)
            out += [Landed(*r) for r in zip(*(t.column(c).to_pylist() for c in cols), strict=True)]
    return out


def _read_iceberg_file(tbl, path: str, cols):
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = tbl.io if isinstance(tbl.io, PyArrowFileIO) else PyArrowFileIO(tbl.io.properties)
    with io.new_input(path).open() as f:
        return pq.read_table(f, columns=list(cols))
