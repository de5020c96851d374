"""Table maintenance beside landing (core/landing/sinks/maintenance.py, ``cg maintain``, the
maintenance operator): members keep landing into a Delta or Iceberg table while ``cg maintain``
runs in child processes that are SIGKILLed at random moments; the table ends with every
message once, and no version a reader can open ever shows part of a batch. Read back by
delta-rs / pyiceberg."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import maintenance
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from tests.support.chaos import chaos_seed
from tests.support.sink_rows import refs_for, rows

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.integration]

BATCH = 10


def _options(fmt: str, where: str, tmp_path) -> SinkOptions:
    if fmt == "delta":
        return SinkOptions(sink="delta", sink_path=os.path.join(where, "orders"), partition_by="region")
    return SinkOptions(sink="iceberg", iceberg_table="lake.orders", iceberg_catalog_uri=f"sqlite:///{tmp_path}/c.db",
                       iceberg_warehouse=os.path.join(where, "wh"), partition_by="region, bucket(2, origin_seq)")


def _regions(seqs):
    return {"region": pa.array([f"r{s % 2}" for s in seqs])}


def _land(sink, seqs, member, batch_seq):
    p = sink.prepare(BatchId("ORDERS", "g", member, batch_seq), rows(seqs, member=member, extra=_regions),
                     message_refs=refs_for(seqs))
    return sink.commit(sink.mark_acking(p))


def _cg_maintain(options: SinkOptions, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "airflow_provider_cg.core.tools.cli", "maintain", "--json", *extra]
    for name, value in options.given().items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _versions(options: SinkOptions) -> list[set[int]]:
    """Every readable version's set of origin_seq (Delta: each table version; Iceberg: each snapshot)."""
    if options.sink == "delta":
        from deltalake import DeltaTable

        from tests.support.member_job import read_delta

        dt = DeltaTable(options.sink_path)
        out = []
        for v in range(dt.version() + 1):
            t = read_delta(options.sink_path, ["origin_seq"], version=v)
            out.append(set(t.column("origin_seq").to_pylist()))
        return out
    tbl = open_sink(options).load_table()
    return [set(tbl.scan(snapshot_id=s.snapshot_id, selected_fields=("origin_seq",)).to_arrow()
                .column("origin_seq").to_pylist()) for s in tbl.snapshots()]


def _rows(options: SinkOptions) -> list[int]:
    if options.sink == "delta":
        from tests.support.member_job import read_delta

        return read_delta(options.sink_path, ["origin_seq"]).column("origin_seq").to_pylist()
    return open_sink(options).load_table().scan(selected_fields=("origin_seq",)).to_arrow().column("origin_seq").to_pylist()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_maintenance_killed_at_random_beside_two_landing_members_loses_and_duplicates_nothing(fmt, tmp_path, request):
    seed = chaos_seed(request)
    print(f"\nmaintenance chaos seed {seed} ({fmt}): replay with --chaos-seed {seed}")
    rnd = random.Random(seed)
    options = _options(fmt, str(tmp_path), tmp_path)
    batches: list[set[int]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def member(name: str, first: int) -> None:
        member_rnd = random.Random(f"{seed}-{name}")
        try:
            sink = open_sink(options)
            for i in range(12):
                seqs = list(range(first + i * BATCH, first + (i + 1) * BATCH))
                _land(sink, seqs, name, i + 1)
                batches.append(set(seqs))
                time.sleep(member_rnd.uniform(0.3, 1.0))  # landing for as long as several maintenance runs
            # a replay of messages landed already (a reset, a redelivery): nothing lands twice
            assert _land(sink, list(range(first, first + 2 * BATCH)), name, 100).rows_written == 0
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def maintainer() -> None:
        runs = killed = 0
        while not stop.is_set():
            p = _cg_maintain(options, *(["--target-file-size", str(1 << 20)] if fmt == "delta" else []))
            if rnd.random() < 0.5:
                time.sleep(rnd.uniform(0.0, 0.8))
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    killed += 1
            out, err = p.communicate(timeout=120)
            if p.returncode not in (0, -signal.SIGKILL):
                errors.append(AssertionError(f"cg maintain exit {p.returncode}: {err.strip()}"))
            runs += 1
        result["runs"], result["killed"] = runs, killed

    result: dict = {}
    members = [threading.Thread(target=member, args=(m, first)) for m, first in (("m1", 1), ("m2", 10_001))]
    m = threading.Thread(target=maintainer)
    m.start()
    for t in members:
        t.start()
    for t in members:
        t.join(300)
    stop.set()
    m.join(300)
    assert not errors, (seed, errors)
    # one last maintenance run to the end: the table compacts and stays exact
    p = _cg_maintain(options)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    expected = set().union(*batches)
    got = _rows(options)
    assert len(got) == len(set(got)) == len(expected) and set(got) == expected, seed
    for seen in _versions(options):  # no version shows part of a batch
        assert all(b <= seen or not (b & seen) for b in batches), (seed, sorted(seen))
    print(f"cg maintain runs: {result['runs']}, SIGKILLed: {result['killed']}")
    assert result["runs"] >= 3, result  # maintenance ran (and was killed) while the members landed


def test_vacuum_and_expiry_remove_old_files_and_the_table_stays_exact(tmp_path, monkeypatch):
    """With the retention lowered (only here, nothing lands meanwhile): Delta's compacted-away
    files and Iceberg's expired snapshots are removed; landing the same messages again after
    maintenance adds nothing."""
    monkeypatch.setattr(maintenance, "MIN_RETENTION_HOURS", 0.0)
    for fmt in ("delta", "iceberg"):
        options = _options(fmt, str(tmp_path / fmt), tmp_path / fmt)
        os.makedirs(tmp_path / fmt, exist_ok=True)
        sink = open_sink(options)
        for i in range(6):
            _land(sink, list(range(1 + i * BATCH, 1 + (i + 1) * BATCH)), "m1", i + 1)
        report = maintenance.maintain(options, compact=fmt == "delta", retention_hours=0.0)
        if fmt == "delta":
            assert report.compacted["numFilesRemoved"] > report.compacted["numFilesAdded"] > 0, report
            assert report.removed_files >= report.compacted["numFilesRemoved"], report
            # the log's entries older than the retention are gone with the tombstones they held:
            # a reader opens the table from the checkpoint alone
            log_dir = os.path.join(options.sink_path, "_delta_log")
            entries = [n for n in os.listdir(log_dir) if n.endswith(".json") and n[:20].isdigit()]
            assert min(entries) > f"{7:020d}.json" and len(entries) <= 3, sorted(entries)  # 0-6: the batches
        else:
            assert report.expired_snapshots == 5 and len(open_sink(options).load_table().snapshots()) == 1, report
        assert _land(open_sink(options), list(range(1, 6 * BATCH + 1)), "m2", 1).rows_written == 0
        got = _rows(options)
        assert sorted(got) == list(range(1, 6 * BATCH + 1)), fmt


@pytest.mark.parametrize(("args", "field"), [
    (["--sink", "parquet", "--sink-path", "/nonexistent-cg/t"], "sink"),
    (["--sink", "delta", "--sink-path", "/nonexistent-cg/t", "--retention-hours", "0.5"], "retention_hours"),
    (["--sink", "delta", "--sink-path", "/nonexistent-cg/t", "--target-file-size", "10"], "target_file_size"),
    (["--sink", "iceberg", "--iceberg-table", "a.b", "--compact"], "compact"),
    (["--sink", "delta", "--iceberg-table", "a.b"], "iceberg_table"),
    (["--sink-path", "/nonexistent-cg/t"], "sink_path"),
])
def test_cg_maintain_refuses_bad_input_naming_the_field(args, field, tmp_path):
    from airflow_provider_cg.core.tools.cli import main

    out, err = _Capture(), _Capture()
    assert main(["maintain", *args], stdout=out, stderr=err) == 1
    assert err.text.startswith(f"cg: error: {field}: ") and "Traceback" not in err.text, err.text
    assert not os.path.exists("/nonexistent-cg")


class _Capture:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s


@pytest.mark.airflow
def test_the_maintenance_operator_compacts_a_delta_table_in_a_dag_run(airflow_env, tmp_path):
    """``ConsumerGroupTableMaintenanceOperator`` under ``dag.test()``: its XCom says what it did,
    the table keeps every row once; an option of another sink fails the task without retries."""
    import datetime as dt

    from airflow.sdk import DAG

    from airflow_provider_cg.operators.maintenance import ConsumerGroupTableMaintenanceOperator

    options = _options("delta", str(tmp_path), tmp_path)
    sink = open_sink(options)
    for i in range(5):
        _land(sink, list(range(1 + i * BATCH, 1 + (i + 1) * BATCH)), "m1", i + 1)
    with DAG("cg_test_maintenance", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        ConsumerGroupTableMaintenanceOperator(task_id="maintain", sink="delta", sink_path="{{ params.table }}",
                                              params={"table": options.sink_path})
        ConsumerGroupTableMaintenanceOperator(task_id="wrong", sink="delta", sink_path=options.sink_path,
                                              iceberg_table="lake.orders", retries=3)
    result = airflow_env.run_dag(dag)
    report = result.xcom("maintain")
    assert result.state_of("maintain") == "success", result
    assert report["compacted"]["numFilesRemoved"] > report["compacted"]["numFilesAdded"] >= 1, report
    assert report["checkpoint"] is True and report["table"].endswith("/orders"), report
    assert result.state_of("wrong") == "failed", result
    assert sorted(_rows(options)) == list(range(1, 5 * BATCH + 1))


@pytest.mark.airflow
def test_a_rest_catalog_table_is_maintained_with_the_credentials_of_an_iceberg_connection(airflow_env, rest_catalog,
                                                                                   tmp_path, monkeypatch):
    """The REST catalog's bearer token (extra ``token``) or OAuth2 client credentials (login /
    password) come from an Airflow ``iceberg`` connection and reach ``cg maintain`` as
    environment only; without them, or with a wrong secret, the task fails at once (the catalog
    answers 401), naming the setting; no token or secret in any log."""
    import datetime as dt

    from airflow.sdk import DAG

    from airflow_provider_cg.operators.maintenance import ConsumerGroupTableMaintenanceOperator

    monkeypatch.setenv("CG_ICEBERG_CATALOG_TOKEN", rest_catalog.token)
    options = SinkOptions(sink="iceberg", iceberg_table=f"m{os.urandom(3).hex()}.orders",
                          iceberg_warehouse=str(tmp_path / "wh"), iceberg_catalog_uri=rest_catalog.url)
    sink = open_sink(options)
    for i in range(3):
        _land(sink, list(range(1 + i * BATCH, 1 + (i + 1) * BATCH)), "m1", i + 1)
    monkeypatch.delenv("CG_ICEBERG_CATALOG_TOKEN")
    airflow_env.add_connection("rest_catalog", "iceberg", host=rest_catalog.url, extra={"token": rest_catalog.token})
    airflow_env.add_connection("rest_no_token", "iceberg", host=rest_catalog.url)
    # the Iceberg provider's fields for OAuth2 client credentials: login = client id, password = secret
    airflow_env.add_connection("rest_client", "iceberg", host=rest_catalog.url, login=rest_catalog.client_id,
                               password=rest_catalog.client_secret)
    airflow_env.add_connection("rest_bad_client", "iceberg", host=rest_catalog.url, login=rest_catalog.client_id,
                               password="not-the-secret")
    common = {"sink": "iceberg", "iceberg_table": options.iceberg_table, "iceberg_warehouse": options.iceberg_warehouse,
              "retention_hours": 1}
    with DAG("cg_test_rest_maintenance", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) as dag:
        ConsumerGroupTableMaintenanceOperator(task_id="maintain", iceberg_conn_id="rest_catalog", **common)
        ConsumerGroupTableMaintenanceOperator(task_id="refused", iceberg_conn_id="rest_no_token", retries=2, **common)
        ConsumerGroupTableMaintenanceOperator(task_id="by_client", iceberg_conn_id="rest_client", **common)
        ConsumerGroupTableMaintenanceOperator(task_id="bad_client", iceberg_conn_id="rest_bad_client", retries=2,
                                              **common)
    result = airflow_env.run_dag(dag)
    assert result.state_of("maintain") == "success", result
    assert result.xcom("maintain")["table"] == options.iceberg_table
    assert result.state_of("refused") == "failed", result
    assert result.state_of("by_client") == "success", result
    assert result.state_of("bad_client") == "failed", result  # refused credentials: exit 1, no retry
    logs = "".join(p.read_text(errors="replace") for p in airflow_env.home.rglob("*.log"))
    assert rest_catalog.token not in logs and rest_catalog.client_secret not in logs
