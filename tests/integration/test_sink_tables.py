"""The Delta and Iceberg sinks: the two-phase protocol, exactly-once by the table's own
transaction, concurrent writers, schema evolution, table maintenance, bad input -- each on
local disk and on a real S3-compatible server (MinIO, tests/support/minio.py), Iceberg's SQL
catalog on SQLite and on a real PostgreSQL, read back by delta-rs / pyiceberg (not the sink's
own code)."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import CommitResult, Fence, FencedOut, WriteState
from airflow_provider_cg.core.landing.sinks.lake.tables import SchemaMismatch
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError
from tests.support import two_phase
from tests.support.sink_rows import refs_for, rows

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")


class Table:
    """One table under test: opens sinks on it and reads it as a user would."""

    def __init__(self, fmt: str, location: str, catalog: str | None = None, identifier: str = "lake.orders") -> None:
        self.fmt, self.location, self.catalog, self.identifier = fmt, location, catalog, identifier

    def sink(self, **kw):
        if self.fmt == "delta":
            from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

            return DeltaLakeSink(self.location, **kw)
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        return IcebergSink(self.catalog, self.identifier, warehouse=self.location, **kw)

    def read(self, columns=("origin_stream", "origin_seq")) -> pa.Table:
        """The table as delta-rs or pyiceberg read it (whole commits only)."""
        if self.fmt == "delta":
            from deltalake.exceptions import TableNotFoundError

            from airflow_provider_cg.core.landing.sinks.delta.writer import delta_storage_options
            from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings
            from tests.support.member_job import read_delta

            opts = delta_storage_options(ObjectStoreSettings.from_env()) if "://" in self.location else None
            try:
                return read_delta(self.location, list(columns), opts)
            except TableNotFoundError:
                return pa.table({c: pa.array([], pa.int64() if c == "origin_seq" else pa.string()) for c in columns})
        from pyiceberg.exceptions import NoSuchTableError

        from airflow_provider_cg.core.landing.sinks.iceberg.writer import open_catalog
        from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStoreSettings

        cat = open_catalog(self.catalog, self.location, ObjectStoreSettings.from_env())
        try:
            return cat.load_table(self.identifier).scan(selected_fields=tuple(columns)).to_arrow()
        except NoSuchTableError:
            return pa.table({c: pa.array([], pa.int64() if c == "origin_seq" else pa.string()) for c in columns})

    def keys(self) -> list[tuple[str, int]]:
        t = self.read()
        return list(zip(t.column("origin_stream").to_pylist(), t.column("origin_seq").to_pylist(), strict=True))

    def assert_exactly(self, expected: set[tuple[str, int]]) -> None:
        got = self.keys()
        assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicate rows"
        assert set(got) == expected


@pytest.fixture(params=["delta-local", "iceberg-local", "delta-s3", "iceberg-s3", "iceberg-pg", "iceberg-rest"])
def table(request, tmp_path) -> Table:
    fmt, where = request.param.split("-")
    if where == "rest":  # a real REST catalog server (tests/support/iceberg_rest.py), its token in the environment
        server = request.getfixturevalue("rest_catalog")
        request.getfixturevalue("monkeypatch").setenv("CG_ICEBERG_CATALOG_TOKEN", server.token)
        return Table(fmt, str(tmp_path / "warehouse"), server.url, f"t{os.urandom(4).hex()}.orders")
    if where == "pg":  # the SQL catalog in a real PostgreSQL, the table on local disk
        pg = request.getfixturevalue("postgres_db")
        uri = f"postgresql://{pg.user}:{pg.password}@{pg.host}:{pg.port}/{pg.dbname}"
        return Table(fmt, str(tmp_path / "warehouse"), uri)
    if where == "local":
        location = str(tmp_path / "warehouse" if fmt == "iceberg" else tmp_path / "orders")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        location = f"s3://{bucket}/warehouse" if fmt == "iceberg" else f"s3://{bucket}/orders"
    return Table(fmt, location, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)


def _land(sink, seqs, batch_seq, member="m1", **kw):
    p = sink.prepare(BatchId("ORDERS", "g", member, batch_seq), rows(seqs, member=member, **kw),
                     message_refs=refs_for(seqs))
    return sink.commit(sink.mark_acking(p))


def test_prepared_is_invisible_then_one_commit_shows_the_whole_batch(table):
    sink = table.sink()
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101)))
    table.assert_exactly(set())
    assert sink.commit(sink.mark_acking(p)) == CommitResult(100, 0)
    table.assert_exactly({("ORDERS", s) for s in range(1, 101)})
    assert sink.commit(p) == CommitResult(100, 0)  # idempotent
    table.assert_exactly({("ORDERS", s) for s in range(1, 101)})


def test_redelivered_messages_are_dropped_against_every_commit(table):
    sink = table.sink()
    assert _land(sink, range(1, 51), 1) == CommitResult(50, 0)
    assert _land(table.sink(), range(40, 81), 2) == CommitResult(30, 11)  # another instance
    assert _land(sink, [5, 5, 90], 3) == CommitResult(1, 2)
    table.assert_exactly({("ORDERS", s) for s in [*range(1, 81), 90]})
    mask = table.sink().committed_keys_exist("ORDERS", [1, 80, 81, 90])
    assert mask.tolist() == [True, True, False, True]


def test_crash_between_commit_record_and_table_commit_rolls_forward(table):
    sink = table.sink()
    p = sink.mark_acking(sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)),
                                      message_refs=refs_for(range(1, 11))))
    sink.publish = lambda record: None  # the commit record is durable; the job dies before the table commit
    sink.commit(p)
    table.assert_exactly(set())
    other = table.sink()
    assert other.recover("ORDERS", "g", "m1") == []  # nothing prepared: committed, and rolled forward
    table.assert_exactly({("ORDERS", s) for s in range(1, 11)})
    assert _land(other, range(5, 16), 2) == CommitResult(5, 6)
    table.assert_exactly({("ORDERS", s) for s in range(1, 16)})


def test_recovery_vs_a_zombies_acking_mark(table):
    two_phase.mark_acking_first_then_abort_unless_acking(table.sink(), table.sink())
    table.assert_exactly({("ORDERS", s) for s in range(1, 6)})


def test_recovery_first_then_the_zombie_cannot_ack(table):
    two_phase.abort_unless_acking_first_then_mark_acking(table.sink(), table.sink())
    table.assert_exactly(set())


def test_fence_stops_a_zombie_and_recovery_finishes_its_writes(table):
    two_phase.fence_stops_a_zombie_and_recovery_finishes_its_writes(table.sink(), table.sink())
    table.assert_exactly({("ORDERS", s) for s in range(1, 10)})


def test_new_owner_of_a_partition_finishes_a_dropped_members_orphan(table):
    two_phase.new_owner_of_a_partition_finishes_a_dropped_members_orphan(table.sink(), table.sink())
    table.assert_exactly({("ORDERS", s) for s in range(1, 6)})


def test_concurrent_members_commit_to_one_table(table):
    """Four writers (own sink instances, as separate jobs have) commit overlapping batches at
    once: every key lands once, and the table's recorded position covers every batch."""
    workers, batches = 4, 5
    errors = []

    def work(w):
        try:
            sink = table.sink()
            for i in range(batches):
                seqs = range(1 + i * 40 - w * 7, 1 + i * 40 + 45)
                _land(sink, [s for s in seqs if s > 0], i + 1, member=f"m{w}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    table.assert_exactly({("ORDERS", s) for s in range(1, (batches - 1) * 40 + 46)})
    sink = table.sink()
    sink._log.refresh()
    assert sink.published_through() == max(r["pos"] for r in sink._log.commits.values() if r["files"])


def test_schema_evolves_by_adding_a_column_and_refuses_a_changed_type(table):
    sink = table.sink()
    _land(sink, range(1, 4), 1)
    _land(sink, range(4, 7), 2, extra=lambda s: {"amount": pa.array(s * 1.5)})
    t = table.read(columns=("origin_seq", "amount"))
    got = dict(zip(t.column("origin_seq").to_pylist(), t.column("amount").to_pylist(), strict=True))
    assert got == {1: None, 2: None, 3: None, 4: 6.0, 5: 7.5, 6: 9.0}
    with pytest.raises(SchemaMismatch, match="'amount'.*string.*double"):
        sink.prepare(BatchId("ORDERS", "g", "m1", 3), rows([7], extra=lambda s: {"amount": pa.array(["x"])}),
                     message_refs=refs_for([7]))
    assert sink.recover("ORDERS", "g", "m1") == []  # refused before anything was staged
    table.assert_exactly({("ORDERS", s) for s in range(1, 7)})


def test_table_maintenance_does_not_weaken_exactly_once(table):
    """Compaction, VACUUM / snapshot expiry and log checkpoints, then the same messages again:
    nothing lands twice."""
    sink = table.sink()
    for i in range(4):
        _land(sink, range(1 + i * 10, 11 + i * 10), i + 1)
    if table.fmt == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(sink.uri, storage_options=sink.storage_options or None)
        dt.optimize.compact()
        dt.create_checkpoint()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        dt.cleanup_metadata()
    else:
        tbl = sink.catalog.load_table(sink.identifier)
        keep = tbl.current_snapshot().snapshot_id
        older = [s.snapshot_id for s in tbl.snapshots() if s.snapshot_id != keep]
        tbl.maintenance.expire_snapshots().by_ids(older).commit()
        assert len(sink.catalog.load_table(sink.identifier).snapshots()) == 1
    again = table.sink()
    assert _land(again, range(1, 45), 9) == CommitResult(4, 40)
    table.assert_exactly({("ORDERS", s) for s in range(1, 45)})


def test_fenced_write_of_another_instance_cannot_be_acked(table):
    a, b = table.sink(), table.sink()
    a.fence("ORDERS", "g", Fence("a", (0,)))
    p = a.prepare(BatchId("ORDERS", "g", "m1", 1), rows([1]), message_refs=refs_for([1]), fence=Fence("a", (0,)))
    b.fence("ORDERS", "g", Fence("b", (0,)))
    with pytest.raises(FencedOut):
        a.mark_acking(p)
    (found,) = b.recover("ORDERS", "g", "m1", (0,))
    assert b.abort_unless_acking(found) is WriteState.ABORTED
    table.assert_exactly(set())


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_object_store_gone_mid_batch_fails_in_one_line_and_the_next_instance_recovers(
        fmt, minio_server, s3_bucket, tmp_path):
    """The S3 server stops between prepare and commit: the commit fails with one line (no
    secret, no Rust debug dump), transient; with the server back, another instance recovers the
    batch and the table holds every row once."""
    table = Table(fmt, f"s3://{s3_bucket}/{'warehouse' if fmt == 'iceberg' else 'orders'}",
                  f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)
    sink = table.sink()
    assert _land(sink, range(1, 21), 1) == CommitResult(20, 0)
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(21, 41)), message_refs=refs_for(range(21, 41)))
    minio_server.stop()
    try:
        with pytest.raises((ConnectionError, OSError, SinkError)) as e:
            sink.commit(sink.mark_acking(p))
    finally:
        minio_server.start()
    message = str(e.value)
    assert "\n" not in message and minio_server.password not in message, message
    other = table.sink()
    other.recover("ORDERS", "g", "m1")
    assert _land(other, range(21, 61), 3) in (CommitResult(40, 0), CommitResult(20, 20))
    table.assert_exactly({("ORDERS", s) for s in range(1, 61)})


# -- bad input ------------------------------------------------------------------------------------


def test_an_object_store_copy_of_a_missing_object_is_a_missing_file(minio_server, s3_bucket):
    """Publishing copies staged files and treats a missing one as published already (or the
    table as corrupt), and a commit links staged keys that another instance may have published
    meanwhile: on S3 both rely on the same ``FileNotFoundError`` a local disk raises."""
    from airflow_provider_cg.core.landing.sinks.lake.storage import ObjectStorage

    store = ObjectStorage(f"s3://{s3_bucket}/copies")
    store.write("a", b"x")
    store.copy("a", "b")
    assert store.read("b") == b"x"
    with pytest.raises(FileNotFoundError):
        store.copy("missing", "c")
    assert not store.exists("c")


def test_object_store_bad_input_names_the_setting(minio_server, s3_bucket, monkeypatch, tmp_path):
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

    with pytest.raises(ConfigError, match="sink_path: bucket 'no-such-bucket' does not exist"):
        DeltaLakeSink("s3://no-such-bucket/t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    with pytest.raises(ConfigError, match="aws credentials: refused") as e:
        DeltaLakeSink(f"s3://{s3_bucket}/t")
    assert "wrong-secret-value" not in str(e.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ConnectionError, match="unreachable"):
        DeltaLakeSink(f"s3://{s3_bucket}/t")
    with pytest.raises(ConfigError, match="iceberg_catalog_uri"):
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import IcebergSink

        IcebergSink("mysql://x/y", "lake.orders", warehouse=str(tmp_path))
    with pytest.raises(ConfigError, match="iceberg_table"):
        IcebergSink(f"sqlite:///{tmp_path}/c.db", "orders", warehouse=str(tmp_path))


def test_nothing_is_written_for_a_table_of_another_schema(tmp_path):
    from deltalake import write_deltalake

    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

    loc = str(tmp_path / "theirs")
    write_deltalake(loc, pa.table({"origin_stream": ["x"], "origin_seq": pa.array(["not a number"])}))
    sink = DeltaLakeSink(loc)
    with pytest.raises(SchemaMismatch, match="column 'origin_seq'"):
        sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows([1]), message_refs=refs_for([1]))
    assert sink.recover("ORDERS", "g", "m1") == []
    assert sorted(os.listdir(os.path.join(loc, "_delta_log"))) == ["00000000000000000000.json"]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_spark_zoned_timestamps_land_as_utc_instants(fmt, tmp_path):
    """Spark labels timestamps with its session zone (``Etc/UTC``, ``Europe/Paris``); the table
    stores the same instants labelled UTC (a Delta table refuses any other label)."""
    loc = str(tmp_path / ("warehouse" if fmt == "iceberg" else "orders"))
    table = Table(fmt, loc, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)
    sink = table.sink()
    batch = rows(range(1, 4))
    instants = pa.array([1_700_000_000_000_000, 1_700_000_001_000_000, 1_700_000_002_000_000], pa.int64())
    batch = batch.append_column("seen_at", instants.cast(pa.timestamp("us", "Europe/Paris")))
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), batch, message_refs=refs_for(range(1, 4)))
    assert sink.commit(sink.mark_acking(p)) == CommitResult(3, 0)
    got = table.read(["origin_seq", "seen_at"]).sort_by("origin_seq")
    assert got.schema.field("seen_at").type == pa.timestamp("us", "UTC")
    assert got.column("seen_at").cast(pa.int64()).to_pylist() == instants.to_pylist()


def test_a_column_delta_cannot_hold_is_refused_before_anything_is_acked(tmp_path):
    from airflow_provider_cg.core.landing.sinks.delta.writer import DeltaLakeSink

    sink = DeltaLakeSink(str(tmp_path / "orders"))
    batch = rows([1, 2]).append_column("at", pa.array([1, 2], pa.int64()).cast(pa.time64("us")))
    with pytest.raises(SchemaMismatch, match="column 'at': has type time64"):
        sink.prepare(BatchId("ORDERS", "g", "m1", 1), batch, message_refs=refs_for([1, 2]))
    assert sink.recover("ORDERS", "g", "m1") == []
    assert not (tmp_path / "orders" / "_delta_log").exists()


def test_an_iceberg_catalog_in_a_folder_not_made_yet_is_created_with_it(tmp_path):
    """As a Delta table's folder is: the embedded default's catalog sits next to tables that
    do not exist before the first batch."""
    table = Table("iceberg", str(tmp_path / "lake" / "warehouse"), f"sqlite:///{tmp_path}/lake/catalog.db")
    assert _land(table.sink(), range(1, 4), 1) == CommitResult(3, 0)
    table.assert_exactly({("ORDERS", s) for s in range(1, 4)})


#: each format's partitioning of the test rows: Delta by a column, Iceberg by transforms too; ``region``
#: stands for a column the user's transformation derives
PARTITIONING = {"delta": "region", "iceberg": "region, day(timestamp), bucket(4, origin_seq)"}


def _regions(seqs):
    return {"region": pa.array([f"r{s % 3}" for s in seqs])}


def _partitioned(table: Table, text: str | None = None):
    from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning

    return table.sink(partitioning=Partitioning.parse(text or PARTITIONING[table.fmt], table.fmt,
                                                                  transforms=table.fmt == "iceberg"))


def test_a_partitioned_table_holds_one_partition_per_file_and_readers_prune_by_it(table):
    sink = _partitioned(table)
    assert _land(sink, range(1, 41), 1, extra=_regions) == CommitResult(40, 0)
    # another instance, with redeliveries: the partitioned files are rewritten without them
    assert _land(_partitioned(table), range(30, 61), 2, extra=_regions) == CommitResult(20, 11)
    table.assert_exactly({("ORDERS", s) for s in range(1, 61)})
    if table.fmt == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(sink.uri, storage_options=sink.storage_options or None)
        assert dt.metadata().partition_columns == ["region"]
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        assert sorted(set(actions["partition.region"])) == ["r0", "r1", "r2"]
        for path, value in zip(actions["path"], actions["partition.region"], strict=True):  # one partition per file
            assert set(pa.parquet.read_table(pa.BufferReader(sink.store.read(path)), columns=["region"])
                       .column("region").to_pylist()) == {value}
        from tests.support.member_job import read_delta

        got = read_delta(table.location, ["origin_seq"], sink.storage_options or None,
                         partitions=[("region", "=", "r1")])
        files = dt.file_uris([("region", "=", "r1")])
    else:
        from pyiceberg.expressions import EqualTo

        tbl = sink.catalog.load_table(sink.identifier)
        assert [str(f.transform) for f in tbl.spec().fields] == ["identity", "day", "bucket[4]"]
        scan = tbl.scan(row_filter=EqualTo("region", "r1"), selected_fields=("origin_seq",))
        files = [t.file.file_path for t in scan.plan_files()]
        every = [t.file for t in tbl.scan().plan_files()]
        for f in every:  # each file's partition record is what its rows compute to
            with tbl.io.new_input(f.file_path).open() as stream:
                data = pa.parquet.read_table(stream, columns=["region"])
            assert set(data.column("region").to_pylist()) == {f.partition[0]}
        got = scan.to_arrow()
        assert len(every) > len(files)
    assert sorted(got.column("origin_seq").to_pylist()) == [s for s in range(1, 61) if s % 3 == 1]
    assert 0 < len(files) < 60
    if table.location.startswith("/"):  # DuckDB and Polars read the local tables the same
        from tests.support.outside_readers import duckdb_rows, polars_rows

        location = table.location if table.fmt == "delta" else sink.catalog.load_table(
            sink.identifier).metadata_location
        assert sorted(duckdb_rows(table.fmt, location, ["origin_seq"], "region = 'r1'")) == \
            [(s,) for s in range(1, 61) if s % 3 == 1]
        assert sorted(polars_rows(table.fmt, location, ["origin_stream", "origin_seq"])) == \
            [("ORDERS", s) for s in range(1, 61)]


def test_a_table_partitioned_otherwise_is_refused_before_anything_is_written(table):
    _land(_partitioned(table), range(1, 11), 1, extra=_regions)
    other = "partition" if table.fmt == "delta" else "region, bucket(8, origin_seq)"
    with pytest.raises(ConfigError, match="partition_by.*exists partitioned by") as refused:
        _partitioned(table, other)
    assert refused.value.field == "partition_by"
    unpartitioned = table.sink()  # no option: the table's own partitioning is kept
    assert _land(unpartitioned, range(11, 21), 2, extra=_regions) == CommitResult(10, 0)
    with pytest.raises(SchemaMismatch, match="'region'.*partition column"):  # a transformation that lost it
        unpartitioned.prepare(BatchId("ORDERS", "g", "m1", 3), rows([30]), message_refs=refs_for([30]))
    assert unpartitioned.recover("ORDERS", "g", "m1") == []
    table.assert_exactly({("ORDERS", s) for s in range(1, 21)})


def test_a_spark_task_whose_staging_was_removed_reports_it_without_failing(tmp_path):
    """The code Spark's tasks run (``TaskFileWriter``), called as a task would call it, after a
    recovering instance removed the write's staging folder: it tells the driver (rows -1, which
    stage() turns into PreparedWriteLost) instead of failing the task with a stack trace."""
    from airflow_provider_cg.core.landing.sinks.lake.parquet_files import TaskFileWriter
    from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning

    (tmp_path / "t").mkdir()
    for partitioning in (None, Partitioning.parse("key", "delta", transforms=False)):
        writer = TaskFileWriter(str(tmp_path / "t"), "_cg_staging/gone/spark", "snappy", partitioning)
        out = [b.to_pydict() for b in writer(iter(rows(range(1, 7)).to_batches()))]
        assert out == [{"file": [""], "rows": [-1]}], out
    (tmp_path / "t" / "here").mkdir()
    writer = TaskFileWriter(str(tmp_path / "t"), "here", "snappy", Partitioning.parse("key", "delta", transforms=False))
    out = [b.to_pydict() for b in writer(iter(rows(range(1, 7)).to_batches()))]
    assert sorted(r for b in out for r in b["rows"]) == [2, 2, 2]  # one file per key value


def test_a_folded_and_cleaned_protocol_log_keeps_exactly_once(table):
    """Checkpoints fold the log (publishing what they fold first) and clean-up deletes what
    they folded: a sink opened afterwards still drops every landed input, and the table holds
    each once."""
    from airflow_provider_cg.core.landing.sinks.lake.protocol_log import clean_protocol_log

    writers = [table.sink(checkpoint_interval=5), table.sink(checkpoint_interval=5)]
    for w in writers:
        w._log.keep = 3
    for i in range(12):
        for n, w in enumerate(writers):
            _land(w, [s for s in range(1 + i * 20 - n * 7, 1 + i * 20 + 25) if s > 0], i + 1, member=f"m{n}")
    assert writers[0]._log.pointer() is not None
    done = clean_protocol_log(writers[0].store, retention_hours=0)
    assert done.records > 10, done
    fresh = table.sink()
    fresh._log.refresh()
    assert fresh._log.folded_pos > 10 and len(fresh._log.records) < 15
    landed = 11 * 20 + 25
    assert _land(fresh, range(1, landed + 6), 1, member="m9") == CommitResult(5, landed)
    table.assert_exactly({("ORDERS", s) for s in range(1, landed + 6)})


def test_target_file_size_splits_a_large_batch_in_row_order(table):
    """A batch above ``target_file_size`` lands as several files of about that size (one commit,
    whole or not at all); the rows keep their order across the files."""
    sink = table.sink(target_file_size=1 << 20)
    seqs = list(range(1, 3001))
    blobs = {s: os.urandom(1000) for s in seqs}  # incompressible: ~3 MB of Parquet
    assert _land(sink, seqs, 1, extra=lambda s: {"blob": pa.array([blobs[int(x)] for x in s])}) == CommitResult(3000, 0)
    table.assert_exactly({("ORDERS", s) for s in seqs})
    if table.fmt == "delta":
        from deltalake import DeltaTable

        dt = DeltaTable(sink.uri, storage_options=sink.storage_options or None)
        sizes = dict(zip(*(pa.table(dt.get_add_actions(flatten=True)).column(c).to_pylist() for c in ("path", "size_bytes")), strict=True))
    else:
        tbl = sink.catalog.load_table(sink.identifier)
        sizes = {t.file.file_path: t.file.file_size_in_bytes for t in tbl.scan().plan_files()}
    assert 3 <= len(sizes) <= 4 and max(sizes.values()) <= 1.1 * (1 << 20), sizes
    first = []  # each file's first origin_seq, by name: the batch's order
    for path in sorted(sizes, key=lambda p: p.rsplit("/", 1)[-1]):
        rel = path.split(sink.store.uri(""), 1)[-1].lstrip("/") if "://" in path else path
        data = pa.parquet.read_table(pa.BufferReader(sink.store.read(rel if not rel.startswith("/") else
                                                                     os.path.relpath(rel, sink.store.location))),
                                     columns=["origin_seq"]).column("origin_seq").to_pylist()
        assert data == sorted(data)
        first.append(data[0])
    assert first == sorted(first)


def _table_commits(table: Table) -> list[dict]:
    """Each table commit that published protocol records, oldest first: its time (s) and the
    last log position it recorded, as delta-rs's history or pyiceberg's snapshots say."""
    from airflow_provider_cg.core.landing.sinks.iceberg.writer import POSITION_PROPERTY

    if table.fmt == "delta":
        from deltalake import DeltaTable

        out = [{"at": h["timestamp"] / 1000, "pos": int(h["cg.position"])} for h in DeltaTable(table.location).history()
               if "cg.position" in h]
    else:
        tbl = table.sink().load_table()
        out = [{"at": s.timestamp_ms / 1000, "pos": int(s.summary[POSITION_PROPERTY])} for s in tbl.snapshots()
               if s.summary is not None and POSITION_PROPERTY in (s.summary.additional_properties or {})]
    return sorted(out, key=lambda c: c["pos"])


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_group_commit_publishes_every_writers_batches_in_one_table_commit_per_interval(fmt, tmp_path):
    """Four writers (separate sink instances, as separate jobs) commit batches as fast as they
    can with a 0.5 s table commit interval: the table gets at most one commit per interval
    (each publishing several writers' records, in log order), every key lands once, and a
    writer's ``flush`` returns once its batches are readable. A writer whose commit record is
    published by another counts nothing; each table commit is counted once, by its maker."""
    location = str(tmp_path / ("warehouse" if fmt == "iceberg" else "orders"))
    table = Table(fmt, location, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)
    interval, workers, batches = 0.5, 4, 12
    errors, counts = [], []

    def work(w):
        try:
            sink = table.sink()
            sink.set_table_commit_interval(interval)
            for i in range(batches):
                first = 1 + (w * batches + i) * 10
                _land(sink, range(first, first + 10), i + 1, member=f"m{w}")
            sink.flush()
            mine = {("ORDERS", s) for s in range(1 + w * batches * 10, 1 + (w + 1) * batches * 10)}
            assert mine <= set(table.keys()), "flush returned before the writer's batches were readable"
            counts.append(sink.publish_counts())
            sink.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    started = time.time()
    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.time() - started
    assert not errors, errors
    table.assert_exactly({("ORDERS", s) for s in range(1, 1 + workers * batches * 10)})
    commits = _table_commits(table)
    made = sum(c["table_commits"] for c in counts)
    # every table commit, expired snapshots included (an Iceberg commit's sequence number counts them)
    ever = len(commits) if fmt == "delta" else table.sink().load_table().metadata.last_sequence_number
    assert made == ever, (counts, ever)
    assert sum(c["records_published"] for c in counts) == workers * batches
    assert made <= elapsed / interval + 2, (made, elapsed)
    assert made < workers * batches / 2, made  # records were published together
    slots = [int(c["at"] // interval) for c in commits]
    assert len(slots) - len(set(slots)) <= 1, commits  # one commit per slot (a flush's may share one)
    assert [c["pos"] for c in commits] == sorted({c["pos"] for c in commits})  # in log order
    if fmt == "iceberg":  # each commit expires the snapshots beyond the newest 10
        from airflow_provider_cg.core.landing.sinks.iceberg.writer import SNAPSHOTS_KEPT

        assert len(table.sink().load_table().snapshots()) == min(SNAPSHOTS_KEPT, made), made


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_writer_that_dies_before_its_slot_is_published_by_the_next_slots_winner(fmt, tmp_path):
    """A writer's commit record, deferred to a later slot, and then the writer gone (its
    process killed: no timer, no flush): the next writer to win a slot publishes it with its
    own, and counts the publish."""
    location = str(tmp_path / ("warehouse" if fmt == "iceberg" else "orders"))
    table = Table(fmt, location, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)
    gone = table.sink()
    gone.set_table_commit_interval(3600)  # never its slot again within the test
    gone._slot_tried = int(time.time() // 3600)  # as if it had just lost this slot
    _land(gone, range(1, 11), 1, member="m1")
    gone._closing = True  # its timer thread, as after SIGKILL: never runs
    table.assert_exactly(set())
    other = table.sink()
    other.set_table_commit_interval(0.2)
    _land(other, range(11, 21), 1, member="m2")
    other.flush()
    table.assert_exactly({("ORDERS", s) for s in range(1, 21)})
    assert other.publish_counts()["records_published"] == 2


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_writer_that_finds_its_records_published_meanwhile_commits_and_counts_nothing(fmt, tmp_path, monkeypatch):
    """A writer reads the table and its ready records, and another writer publishes them before
    its commit (two jobs' timers racing): its table transaction commits nothing (False, or a
    lost race) and it counts no commit, so the summaries' table commits add up to the table's."""
    from airflow_provider_cg.core.landing.sinks.lake.tables import TableConflict

    location = str(tmp_path / ("warehouse" if fmt == "iceberg" else "orders"))
    table = Table(fmt, location, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)
    first = table.sink()
    first.set_table_commit_interval(0.2)
    _land(first, range(1, 11), 1, member="m0")
    first.flush()  # the table exists
    first.close()  # its timer publishes nothing more
    slow = table.sink()
    slow.set_table_commit_interval(3600)
    slow._slot_tried = int(time.time() // 3600)  # it lost this slot: its record waits
    _land(slow, range(11, 21), 1, member="m1")
    slow._log.refresh()
    state = slow._loaded()
    pending = slow._ready(state.position)
    files = [f for r in pending for f in slow._data_files(r)]
    schema = pa.unify_schemas([f.metadata.schema.to_arrow_schema() for f in files])
    fast = table.sink()
    fast.set_table_commit_interval(0.2)
    _land(fast, range(21, 31), 1, member="m2")
    fast.flush()  # publishes the slow writer's record with its own
    try:
        assert slow.commit_files(pending, files, schema, state) is False
    except TableConflict:
        pass  # Iceberg: the commit on the table as read loses the race
    made = sum(s.publish_counts()["table_commits"] for s in (first, slow, fast))
    ever = len(_table_commits(table)) if fmt == "delta" else table.sink().load_table().metadata.last_sequence_number
    assert made == ever == 2, (made, ever)
    # and the writer's count: a transaction that found its records in the table is no commit of its own
    _land(slow, range(31, 41), 2, member="m1")
    monkeypatch.setattr(slow, "commit_files", lambda *_a, **_k: False)
    assert slow._publish_ready()
    counts = slow.publish_counts()
    assert counts["table_commits"] == 0 and counts["records_published"] == 0 and counts["table_conflicts"] == 1, counts
    table.assert_exactly({("ORDERS", s) for s in range(1, 31)})
    for s in (slow, fast):
        s.close()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_writer_that_read_no_table_publishes_nothing_another_writer_published_since(fmt, tmp_path):
    """Two members' first records into a table that does not exist yet: each writer reads the
    table (none) and its ready records; one creates the table and publishes its record; the
    other's commit, planned on no table, would publish that record's files a second time (a
    CI run's Delta log added 9,000 rows for 6,000 landed). It loses the race instead, reads
    again and publishes only its own: every file is in the table once."""
    from airflow_provider_cg.core.landing.sinks.lake.tables import TableConflict

    location = str(tmp_path / ("warehouse" if fmt == "iceberg" else "orders"))
    table = Table(fmt, location, f"sqlite:///{tmp_path}/catalog.db" if fmt == "iceberg" else None)

    def planned(sink):
        sink._log.refresh()
        state = sink._loaded()
        pending = sink._ready(state.position)
        files = [f for r in pending for f in sink._data_files(r)]
        return pending, files, pa.unify_schemas([f.metadata.schema.to_arrow_schema() for f in files]), state

    first, second = table.sink(), table.sink()
    for sink in (first, second):
        sink.set_table_commit_interval(3600)
        sink._slot_tried = int(time.time() // 3600)  # both lost this slot: their records wait
    _land(first, range(1, 11), 1, member="m1")
    first_plan = planned(first)  # [its record], on no table
    _land(second, range(11, 21), 1, member="m2")
    second_plan = planned(second)  # [the first's record, its own], on no table
    assert first_plan[3].schema is None and second_plan[3].schema is None
    assert [r["pos"] for r in second_plan[0]] == [first_plan[0][0]["pos"], second_plan[0][1]["pos"]]
    assert first.commit_files(*first_plan) is True
    with pytest.raises(TableConflict):
        second.commit_files(*second_plan)
    second._state = None
    assert second._publish_ready()  # read again: only its own record is left to publish
    table.assert_exactly({("ORDERS", s) for s in range(1, 21)})
    assert [c["pos"] for c in _table_commits(table)] == [r["pos"] for r in second_plan[0]]
    if fmt == "delta":  # the log adds each file once (a reader of the log replays what it adds)
        import json

        adds = [json.loads(line)["add"]["path"] for log in sorted((tmp_path / "orders" / "_delta_log").glob("*.json"))
                for line in log.read_text().splitlines() if '"add"' in line]
        assert len(adds) == len(set(adds)) == 2, adds
    for sink in (first, second):
        sink.close()
