"""ParquetLakeSink: two-phase protocol, dedupe, concurrency, crash recovery, plain readers."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, BatchId
from airflow_provider_cg.core.landing.sinks import (
    CommitResult,
    Fence,
    FencedOut,
    ParquetLakeSink,
    PreparedWriteLost,
    SinkError,
    WriteState,
    read_committed,
)
from airflow_provider_cg.core.landing.sinks.lake.lake_sink import STAGING_DIR
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import npy_load
from tests.support import two_phase
from tests.support.sink_rows import refs_for, rows

REPO = Path(__file__).resolve().parents[3]


def keys(table: pa.Table) -> list[tuple[str, int]]:
    return list(
        zip(table.column("origin_stream").to_pylist(), table.column("origin_seq").to_pylist(), strict=True)
    )


def plain_read(root: Path) -> pa.Table:
    files = sorted((root / "data").glob("*.parquet"))
    if not files:
        return pa.table({"origin_stream": pa.array([], pa.string()), "origin_seq": pa.array([], pa.int64())})
    return pq.read_table(root / "data", columns=["origin_stream", "origin_seq"])


def assert_exactly(root: Path, expected: set[tuple[str, int]]) -> None:
    committed = keys(read_committed(root, columns=["origin_stream", "origin_seq"]))
    assert len(committed) == len(set(committed)), "duplicate rows committed"
    assert set(committed) == expected
    plain = keys(plain_read(root))
    assert len(plain) == len(set(plain)), "plain reader sees duplicates"
    assert set(plain) == expected


@pytest.fixture
def lake(tmp_path) -> Path:
    return tmp_path / "lake"


# -- BatchId / schema ---------------------------------------------------------------------------


def test_gid_round_trip_and_limits():
    b = BatchId("ORD:ERS", "g%1", "m-1", 42)
    assert b.gid.startswith("cg:ORD%3AERS:g%251:m-1:42:")
    assert BatchId.parse(b.gid) == b
    assert b.gid.startswith(BatchId.member_prefix("ORD:ERS", "g%1", "m-1"))
    assert BatchId("S", "g", "m", 1).gid != BatchId("S", "g", "m", 1).gid  # fresh uid per batch
    with pytest.raises(ConfigError):
        BatchId("S" * 200, "g", "m", 1)
    with pytest.raises(ConfigError):
        BatchId.parse("cg:S:g:m:x:abcdef01")
    with pytest.raises(ConfigError):
        BatchId("S", "g", "m", -1)


def test_row_schema_columns():
    assert ROW_SCHEMA.names == [
        "origin_stream", "origin_seq", "subject", "partition", "key", "payload", "payload_text",
        "headers", "timestamp", "delivery_count", "group", "member",
    ]  # fmt: skip
    assert ROW_SCHEMA.field("timestamp").type == pa.timestamp("ns", tz="UTC")


# -- protocol -----------------------------------------------------------------------------------


def test_prepare_is_invisible_until_commit(lake):
    sink = ParquetLakeSink(lake)
    prepared = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101))
    )
    assert sink.state(prepared) is WriteState.PREPARED
    assert read_committed(lake).num_rows == 0
    assert not list((lake / "data").iterdir())
    assert pq.read_table(lake).num_rows == 0  # even reading the root skips _cg_* directories

    result = sink.commit(prepared)
    assert result == CommitResult(rows_written=100, duplicates_skipped=0)
    assert sink.state(prepared) is WriteState.COMMITTED
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 101)})
    assert not (lake / STAGING_DIR / "x").exists() and not list((lake / STAGING_DIR).iterdir())

    table = read_committed(lake)
    assert table.column("payload").to_pylist()[:2] == [b"payload-1", b"payload-2"]
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert json.loads(table.column("headers")[0].as_py()) == {"Nats-Msg-Id": "1"}


def test_commit_is_idempotent_across_instances(lake):
    sink = ParquetLakeSink(lake)
    prepared = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    first = sink.commit(prepared)
    assert sink.commit(prepared) == first
    assert ParquetLakeSink(lake).commit(prepared) == first
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 11)})
    assert len(list((lake / "_cg_log").glob("*.json"))) == 1


def test_abort_is_idempotent_and_final(lake):
    sink = ParquetLakeSink(lake)
    prepared = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    assert sink.abort(prepared) is WriteState.ABORTED
    assert sink.abort(prepared) is WriteState.ABORTED
    assert ParquetLakeSink(lake).state(prepared) is WriteState.ABORTED
    assert not list((lake / STAGING_DIR).iterdir())
    with pytest.raises(PreparedWriteLost):
        sink.commit(prepared)
    with pytest.raises(PreparedWriteLost):
        ParquetLakeSink(lake).commit(prepared)
    assert_exactly(lake, set())

    other = sink.prepare(
        BatchId("ORDERS", "g", "m1", 2), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    sink.commit(other)
    assert sink.abort(other) is WriteState.COMMITTED  # commit won; abort cannot undo it
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 11)})


def test_duplicates_across_commits_and_within_a_batch_are_dropped(lake):
    sink = ParquetLakeSink(lake)
    p1 = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101))
    )
    assert sink.commit(p1) == CommitResult(100, 0)
    # a redelivery: 50..150 with 60 twice in the batch
    seqs = [*range(50, 151), 60]
    p2 = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(seqs), message_refs=refs_for(seqs))
    assert p2.rows == 102
    assert sink.commit(p2) == CommitResult(rows_written=50, duplicates_skipped=52)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 151)})
    # same seq in another origin stream is not a duplicate
    p3 = sink.prepare(
        BatchId("ORDERS", "g", "m1", 3), rows(range(1, 6), stream="OTHER"), message_refs={"X": [1]}
    )
    assert sink.commit(p3) == CommitResult(5, 0)
    assert sink.committed_keys_exist("ORDERS", [0, 1, 150, 151, 60]).tolist() == [
        False,
        True,
        True,
        False,
        True,
    ]
    assert sink.committed_keys_exist("OTHER", [5, 6]).tolist() == [True, False]


def test_duplicate_found_at_commit_rewrites_the_staged_file(lake):
    sink = ParquetLakeSink(lake)
    a = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101))
    )
    b = sink.prepare(
        BatchId("ORDERS", "g", "m2", 1), rows(range(91, 201)), message_refs=refs_for(range(91, 201))
    )
    assert sink.commit(b) == CommitResult(110, 0)
    assert sink.commit(a) == CommitResult(90, 10)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 201)})
    # every file in data/ is duplicate-free on its own and across files
    assert plain_read(lake).num_rows == 200


def test_mixed_streams_and_in_batch_duplicates(lake):
    sink = ParquetLakeSink(lake)
    t = pa.concat_tables([rows([1, 2, 3], stream="A"), rows([1, 2, 2], stream="B")])
    p = sink.prepare(BatchId("S", "g", "m", 1), t, message_refs={"S-g": [1, 2, 3, 4, 5, 6]})
    assert sink.commit(p) == CommitResult(5, 1)
    t2 = pa.concat_tables([rows([3, 4], stream="A"), rows([2, 3], stream="B")])
    p2 = sink.prepare(BatchId("S", "g", "m", 2), t2, message_refs={"S-g": [7, 8, 9, 10]})
    assert sink.commit(p2) == CommitResult(2, 2)
    assert_exactly(lake, {("A", 1), ("A", 2), ("A", 3), ("A", 4), ("B", 1), ("B", 2), ("B", 3)})


def test_empty_and_all_duplicate_batches(lake):
    sink = ParquetLakeSink(lake)
    p0 = sink.prepare(BatchId("ORDERS", "g", "m1", 0), rows([]), message_refs=[])
    assert sink.commit(p0) == CommitResult(0, 0)
    p1 = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    sink.commit(p1)
    p2 = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    assert sink.commit(p2) == CommitResult(0, 3)
    assert sink.commit(p2) == CommitResult(0, 3)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 4)})


def test_extra_struct_column_and_schema_unification(lake):
    sink = ParquetLakeSink(lake)
    p1 = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    sink.commit(p1)

    def value(seqs):
        return {"value": pa.array([{"id": int(s), "name": f"n{s}"} for s in seqs])}

    p2 = sink.prepare(
        BatchId("ORDERS", "g", "m1", 2), rows(range(4, 7), extra=value), message_refs=refs_for(range(4, 7))
    )
    sink.commit(p2)
    table = read_committed(lake).sort_by("origin_seq")
    assert table.column("value").to_pylist() == [None, None, None] + [
        {"id": s, "name": f"n{s}"} for s in (4, 5, 6)
    ]


def test_rejects_bad_tables(lake):
    sink = ParquetLakeSink(lake)
    with pytest.raises(SinkError, match="origin_seq"):
        sink.prepare(BatchId("S", "g", "m", 1), pa.table({"origin_stream": ["S"]}), message_refs=[])
    bad = rows([1, 2]).set_column(1, "origin_seq", pa.array([1, None], pa.int64()))
    with pytest.raises(SinkError, match="null"):
        sink.prepare(BatchId("S", "g", "m", 2), bad, message_refs=[])
    batch = BatchId("S", "g", "m", 3)
    sink.prepare(batch, rows([1]), message_refs=[("S", 1)])
    with pytest.raises(SinkError, match="already prepared"):
        sink.prepare(batch, rows([1]), message_refs=[("S", 1)])


# -- recovery -----------------------------------------------------------------------------------


def test_recover_returns_only_this_members_pending_writes(lake):
    sink = ParquetLakeSink(lake)
    mine = sink.prepare(
        BatchId("ORDERS", "g", "m1", 7), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    done = sink.prepare(
        BatchId("ORDERS", "g", "m1", 6), rows(range(11, 21)), message_refs=refs_for(range(11, 21))
    )
    sink.commit(done)
    sink.prepare(BatchId("ORDERS", "g", "m10", 1), rows(range(21, 31)), message_refs=refs_for(range(21, 31)))
    sink.prepare(BatchId("ORDERS", "g2", "m1", 1), rows(range(31, 41)), message_refs=refs_for(range(31, 41)))

    found = ParquetLakeSink(lake).recover("ORDERS", "g", "m1")
    assert [p.gid for p in found] == [mine.gid]
    assert found[0].rows == 10
    assert found[0].message_refs == refs_for(range(1, 11))
    assert list(found[0].iter_ref_ranges()) == [("ORDERS-g", 1, 10)]
    assert ParquetLakeSink(lake).commit(found[0]) == CommitResult(10, 0)
    assert sink.recover("ORDERS", "g", "m1") == []


def test_mark_acking_is_durable_and_drives_recovery(lake):
    sink = ParquetLakeSink(lake)
    quiet = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    acking = sink.prepare(
        BatchId("ORDERS", "g", "m1", 2), rows(range(11, 21)), message_refs=refs_for(range(11, 21))
    )
    assert sink.mark_acking(acking).acking is True
    assert sink.mark_acking(acking).acking is True  # idempotent
    fresh = ParquetLakeSink(lake)
    found = {p.batch_id.batch_seq: p for p in fresh.recover("ORDERS", "g", "m1")}
    assert found[1].acking is False and found[2].acking is True
    assert fresh.abort(found[1]) is WriteState.ABORTED
    assert fresh.commit(found[2]) == CommitResult(10, 0)
    with pytest.raises(PreparedWriteLost):
        fresh.mark_acking(quiet)
    assert fresh.mark_acking(acking).acking is True  # already committed: fine
    assert fresh.recover("ORDERS", "g", "m1") == []
    assert_exactly(lake, {("ORDERS", s) for s in range(11, 21)})


def test_every_fsync_finds_the_file_written(lake, monkeypatch):
    """A file's fsync comes after its bytes left Python's buffer: small files (the manifest, the
    log's records, a small batch's keys) were once synced empty and written after."""
    synced: dict[int, int] = {}  # inode -> size when synced, per regular file
    real_fsync = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            synced[st.st_ino] = st.st_size
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    sink = ParquetLakeSink(lake)
    prepared = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    sink.commit(sink.mark_acking(prepared))
    monkeypatch.undo()
    final = {p.stat().st_ino: p for p in lake.rglob("*") if p.is_file()}
    # the data file, the acking and commit records, the committed keys (the staging is gone)
    kept = [ino for ino in synced if ino in final]
    assert len(kept) >= 4
    for ino in kept:
        assert synced[ino] == final[ino].stat().st_size, f"{final[ino]} was synced before it was written"
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 4)})



def _durable_steps(lake: Path, monkeypatch) -> list[tuple[str, str]]:
    """(what, path relative to ``lake``) of every fsync ("sync") and rename or link onto a
    name ("name") the sink does, in order."""
    steps: list[tuple[str, str]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def rel(path) -> str:
        return os.path.relpath(path, lake)

    def fsync(fd):
        steps.append(("sync", rel(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst, *a, **k):
        real_replace(src, dst, *a, **k)
        steps.append(("name", rel(dst)))

    def link(src, dst, *a, **k):
        real_link(src, dst, *a, **k)
        steps.append(("name", rel(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    return steps


def test_a_prepared_write_is_durable_in_name_and_bytes_before_anything_names_it(lake, monkeypatch):
    """Power-loss order on a local disk: the staging's own name, each staged file's bytes, then
    the manifest with one sync of the staging that makes every name in it durable; at commit,
    the keys' directory name before the commit record names them. The committed keys are a
    link to the staged ones (no second file) unless rows were dropped at commit."""
    sink = ParquetLakeSink(lake)
    sink.prepare(BatchId("ORDERS", "g", "m2", 1), rows(range(5, 8)), message_refs=refs_for(range(5, 8)))
    steps = _durable_steps(lake, monkeypatch)
    prepared = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 7)), message_refs=refs_for(range(1, 7)))
    staging = os.path.relpath(prepared.token, lake)
    names = [p for what, p in steps if what == "name"]
    assert names == [f"{staging}/prepared.json"], "staged data and keys are written in place, only the manifest renamed"
    at = steps.index(("name", f"{staging}/prepared.json"))
    before, after = steps[:at], steps[at + 1:]
    assert before[0] == ("sync", STAGING_DIR), "the staging's name is durable first"
    assert {("sync", f"{staging}/part-0.parquet"), ("sync", f"{staging}/keys-0.npy")} <= set(before)
    assert after == [("sync", staging)], "one sync of the staging makes the manifest's and its files' names durable"

    steps.clear()
    sink.commit(sink.mark_acking(prepared))
    claims = [i for i, (what, p) in enumerate(steps) if what == "name" and p.startswith("_cg_log/")]
    keys_dir = next(p for what, p in steps if what == "name" and p.startswith("_cg_keys/"))
    assert steps.index(("sync", "_cg_keys")) < steps.index(("name", keys_dir)) < claims[-1]
    assert ("sync", os.path.dirname(keys_dir)) in steps[:claims[-1]]
    assert not [p for what, p in steps if what == "sync" and p.startswith("_cg_keys/") and p.endswith(".npy")], \
        "the committed keys are the staged file, linked"
    monkeypatch.undo()

    # 5 and 6 committed by then: the other write's keys are written anew, without them
    other = next(w for w in sink.recover("ORDERS", "g", "m2"))
    assert sink.commit(sink.mark_acking(other)).duplicates_skipped == 2
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 8)})
    record = next(r for r in sink._log.records if r["op"] == "commit" and r["gid"] == other.gid)
    assert npy_load((lake / record["streams"]["ORDERS"]["keys"]).read_bytes()).tolist() == [7]

CRASH_AFTER_PREPARE = """
import sys, os
sys.path.insert(0, {repo!r})
from tests.support.sink_rows import refs_for, rows
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
sink = ParquetLakeSink({lake!r})
p = sink.prepare(BatchId("ORDERS", "g", "m1", 3), rows(range(1, 501)), message_refs=refs_for(range(1, 501)))
sink.mark_acking(p)
if {mid_commit!r}:
    def die(record):  # the commit record is durable, the data file not yet published
        os._exit(9)
    sink.publish = die
    sink.commit(p)
os._exit(9)  # no cleanup, no atexit: a killed job
"""


def _run_crashing_child(lake: Path, mid_commit: bool) -> None:
    code = CRASH_AFTER_PREPARE.format(repo=str(REPO), lake=str(lake), mid_commit=mid_commit)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr


def test_crash_after_prepare_then_recover_and_commit(lake):
    _run_crashing_child(lake, mid_commit=False)
    assert_exactly(lake, set())
    sink = ParquetLakeSink(lake)
    pending = sink.recover("ORDERS", "g", "m1")
    assert len(pending) == 1 and pending[0].batch_id.batch_seq == 3 and pending[0].acking
    assert pending[0].message_refs == refs_for(range(1, 501))
    assert sink.commit(pending[0]) == CommitResult(500, 0)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 501)})
    assert sink.recover("ORDERS", "g", "m1") == []


def test_crash_between_commit_record_and_publish_rolls_forward(lake):
    _run_crashing_child(lake, mid_commit=True)
    # committed per the log (read_committed serves the staged file), not yet in data/
    assert read_committed(lake).num_rows == 500
    assert plain_read(lake).num_rows == 0
    sink = ParquetLakeSink(lake)
    assert sink.recover("ORDERS", "g", "m1") == []  # nothing pending: it is committed
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 501)})
    assert not list((lake / STAGING_DIR).iterdir())


def test_crash_during_prepare_leaves_nothing_to_recover(lake):
    sink = ParquetLakeSink(lake)
    half = lake / STAGING_DIR / "cg%3AORDERS%3Ag%3Am1%3A4%3A0123abcd"
    half.mkdir()
    (half / "part-0.parquet").write_bytes(b"partial")
    assert sink.recover("ORDERS", "g", "m1") == []
    assert not half.exists()


class _StallingSink(ParquetLakeSink):
    """Runs ``during`` (another instance's recovery) after the data file, before the manifest:
    this instance stalled mid-prepare (e.g. SIGSTOP) while another took over the member."""

    during = None

    def write_file(self, table, path):
        super().write_file(table, path)
        if self.during is not None:
            self.during()


def test_recovery_during_a_stalled_prepare_stops_the_stalled_writer(lake):
    zombie, recoverer = _StallingSink(lake), ParquetLakeSink(lake)
    zombie.during = lambda: recoverer.recover("ORDERS", "g", "m1")  # finds it half-prepared
    with pytest.raises(PreparedWriteLost, match="removed while preparing"):
        zombie.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 6)), message_refs=refs_for(range(1, 6)))
    assert not list((lake / STAGING_DIR).iterdir())
    assert_exactly(lake, set())


def test_half_prepared_write_finished_after_recovery_cannot_be_acked(lake):
    """Recovery's removal of the staging loses a race with the stalled writer, which goes on to
    write its manifest: the logged abort still refuses ``acking``, so nothing is acked."""
    zombie, recoverer = _StallingSink(lake, fsync=False), ParquetLakeSink(lake)
    batch = BatchId("ORDERS", "g", "m1", 1)
    staging = lake / STAGING_DIR / batch.gid.replace(":", "%3A")

    def recover_then_writer_recreates_dir():
        assert recoverer.recover("ORDERS", "g", "m1") == []
        staging.mkdir()  # as if rmtree lost a race with the writer's next file

    zombie.during = recover_then_writer_recreates_dir
    p = zombie.prepare(batch, rows(range(1, 6)), message_refs=refs_for(range(1, 6)))
    with pytest.raises(PreparedWriteLost, match="aborted"):
        zombie.mark_acking(p)
    assert recoverer.recover("ORDERS", "g", "m1") == []
    assert not staging.exists()
    assert_exactly(lake, set())


def test_recovery_keeps_a_half_prepared_write_that_is_acking_by_now(lake):
    """The writer finished its manifest and claimed ``acking`` after recovery listed it as
    half-prepared: the abort loses and recovery reports it (acking) to be committed."""
    zombie, recoverer = ParquetLakeSink(lake), ParquetLakeSink(lake)
    p = zombie.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 6)), message_refs=refs_for(range(1, 6)))
    manifest = Path(p.token) / "prepared.json"
    saved = manifest.read_bytes()
    manifest.unlink()  # what recovery sees: no manifest yet
    real_abort = recoverer._abort_gid

    def writer_wins_first(gid, **kw):
        manifest.write_bytes(saved)
        zombie.mark_acking(p)
        return real_abort(gid, **kw)

    recoverer._abort_gid = writer_wins_first
    (found,) = recoverer.recover("ORDERS", "g", "m1")
    assert found.acking is True
    assert recoverer.commit(found) == CommitResult(5, 0)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 6)})


# -- concurrency --------------------------------------------------------------------------------


def _overlapping_batches(worker: int, batches: int) -> list[list[int]]:
    # every worker covers 1..batches*50 in windows that overlap the other workers' windows
    return [list(range(1 + i * 50 - worker * 7, 1 + i * 50 + 60)) for i in range(batches)]


@pytest.mark.parametrize("shared", [False, True], ids=["own-instances", "shared-instance"])
def test_concurrent_committers_in_threads(lake, shared):
    workers, batches = 4, 12
    shared_sink = ParquetLakeSink(lake, fsync=False)
    written = []
    errors = []
    barrier = threading.Barrier(workers)

    def work(w: int) -> None:
        try:
            sink = shared_sink if shared else ParquetLakeSink(lake, fsync=False)
            barrier.wait()
            for i, seqs in enumerate(_overlapping_batches(w, batches)):
                seqs = [s for s in seqs if s > 0]
                p = sink.prepare(BatchId("ORDERS", "g", f"m{w}", i), rows(seqs), message_refs=refs_for(seqs))
                written.append(sink.commit(p).rows_written)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected = {
        ("ORDERS", s) for w in range(workers) for b in _overlapping_batches(w, batches) for s in b if s > 0
    }
    assert sum(written) == len(expected)
    assert_exactly(lake, expected)


def _process_worker(lake: str, worker: int, batches: int, start, out) -> None:
    sink = ParquetLakeSink(lake, fsync=False, checkpoint_interval=5)
    start.wait()
    total = 0
    for i, seqs in enumerate(_overlapping_batches(worker, batches)):
        seqs = [s for s in seqs if s > 0]
        p = sink.prepare(BatchId("ORDERS", "g", f"p{worker}", i), rows(seqs), message_refs=refs_for(seqs))
        total += sink.commit(p).rows_written
    out.put(total)


def test_concurrent_committers_in_two_processes(lake):
    ParquetLakeSink(lake)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2, timeout=60), ctx.Queue()  # both start committing together
    batches = 40
    procs = [ctx.Process(target=_process_worker, args=(str(lake), w, batches, start, out)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    written = out.get(timeout=5) + out.get(timeout=5)
    expected = {("ORDERS", s) for w in (0, 1) for b in _overlapping_batches(w, batches) for s in b if s > 0}
    assert written == len(expected)
    assert_exactly(lake, expected)
    assert list((lake / "_cg_log").glob("*.checkpoint.json"))


def test_checkpoint_is_used_and_dedupe_still_works(lake):
    sink = ParquetLakeSink(lake, checkpoint_interval=3)
    for i in range(10):
        seqs = range(1 + i * 10, 11 + i * 10)
        sink.commit(sink.prepare(BatchId("ORDERS", "g", "m1", i), rows(seqs), message_refs=refs_for(seqs)))
    assert sorted(p.name for p in (lake / "_cg_log").glob("*.checkpoint.json"))[-1].startswith("0" * 19 + "9")
    # a fresh instance loads checkpoint 9 + record 10; remove the early records to prove it
    for pos in range(1, 10):
        (lake / "_cg_log" / f"{pos:020d}.json").unlink()
    fresh = ParquetLakeSink(lake)
    p = fresh.prepare(
        BatchId("ORDERS", "g", "m1", 99), rows(range(1, 121)), message_refs=refs_for(range(1, 121))
    )
    assert fresh.commit(p) == CommitResult(20, 100)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 121)})


def test_plain_reader_never_sees_staged_or_aborted_rows(lake):
    sink = ParquetLakeSink(lake)
    committed = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    sink.commit(committed)
    sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(11, 21)), message_refs=refs_for(range(11, 21)))
    aborted = sink.prepare(
        BatchId("ORDERS", "g", "m1", 3), rows(range(21, 31)), message_refs=refs_for(range(21, 31))
    )
    sink.abort(aborted)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 11)})
    assert pq.read_table(lake, columns=["origin_seq"]).num_rows == 10
    assert all(not name.startswith("_") for name in os.listdir(lake / "data"))


def test_core_sinks_import_neither_airflow_nor_psycopg2():
    code = (
        "import sys; import airflow_provider_cg.core.landing.sinks, airflow_provider_cg.core.landing.rows; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('airflow', 'psycopg2')]; "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- recovery's abort vs a zombie's mark_acking: exactly one wins --------------------------------


def test_mark_acking_first_then_abort_unless_acking_commits(lake):
    two_phase.mark_acking_first_then_abort_unless_acking(ParquetLakeSink(lake), ParquetLakeSink(lake))
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 6)})


def test_abort_unless_acking_first_then_mark_acking_is_lost(lake):
    two_phase.abort_unless_acking_first_then_mark_acking(ParquetLakeSink(lake), ParquetLakeSink(lake))
    assert_exactly(lake, set())


def test_recover_reports_acking_from_the_log(lake):
    sink = ParquetLakeSink(lake)
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    sink.mark_acking(p)
    (found,) = ParquetLakeSink(lake).recover("ORDERS", "g", "m1")
    assert found.acking is True


def test_race_mark_acking_vs_abort_unless_acking(lake):
    wins = two_phase.race_mark_acking_vs_abort_unless_acking(
        lambda: ParquetLakeSink(lake),
        lambda: keys(read_committed(lake, columns=["origin_stream", "origin_seq"])),
    )
    assert wins["acking"] + wins["abort"] == 50
    assert_exactly(lake, set(keys(read_committed(lake, columns=["origin_stream", "origin_seq"]))))


def test_fence_stops_a_zombie_and_recovery_finishes_its_writes(lake):
    two_phase.fence_stops_a_zombie_and_recovery_finishes_its_writes(ParquetLakeSink(lake), ParquetLakeSink(lake))
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 10)})


def test_new_owner_of_a_partition_finishes_a_dropped_members_orphan(lake):
    two_phase.new_owner_of_a_partition_finishes_a_dropped_members_orphan(ParquetLakeSink(lake), ParquetLakeSink(lake))
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 6)})


def test_race_mark_acking_vs_fence(lake):
    wins = two_phase.race_mark_acking_vs_fence(
        lambda: ParquetLakeSink(lake),
        lambda: keys(read_committed(lake, columns=["origin_stream", "origin_seq"])),
    )
    assert wins["acking"] + wins["fence"] == 30


def test_fence_records_survive_a_checkpoint(lake):
    """A sink opened after a checkpoint still knows the latest owner of each partition."""
    first = ParquetLakeSink(lake, checkpoint_interval=2)
    first.fence("ORDERS", "g", Fence("a", (0, 1)))
    first.fence("ORDERS", "g", Fence("b", (1,)))  # position 2: checkpoint
    p = first.prepare(BatchId("ORDERS", "g", "m1", 1), rows([1]), message_refs=refs_for([1]), fence=Fence("a", (0, 1)))
    with pytest.raises(FencedOut):
        ParquetLakeSink(lake).mark_acking(p)
    q = first.prepare(BatchId("ORDERS", "g", "m1", 2), rows([2]), message_refs=refs_for([2]), fence=Fence("b", (1,)))
    assert ParquetLakeSink(lake).mark_acking(q).acking


# -- writers of the same inputs (live members, backfills, replays) --------------------------------


def test_second_writer_of_marked_inputs_is_refused(lake):
    two_phase.second_writer_of_marked_inputs_is_refused(ParquetLakeSink(lake), ParquetLakeSink(lake))
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 10)})


def test_writers_of_the_same_inputs_race(lake):
    out = two_phase.writers_of_the_same_inputs_race(
        lambda: ParquetLakeSink(lake),
        lambda: [s for _, s in keys(read_committed(lake, columns=["origin_stream", "origin_seq"]))])
    assert out["refused"] > 0  # the race was met, not avoided


def test_a_rows_write_never_commits_inputs_a_marked_transformed_write_holds(lake):
    """A write of rows (no transformation) sharing inputs with a transformed write marked
    before it: its mark commits the other first, and its commit drops the shared rows."""
    a = two_phase._transformed(ParquetLakeSink(lake), "bf-1-2", 1, range(1, 5))
    sink = ParquetLakeSink(lake)
    b = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(3, 8)), message_refs=refs_for(range(3, 8)))
    ParquetLakeSink(lake).mark_acking(a)
    sink.mark_acking(b)
    assert sink.state(a) is WriteState.COMMITTED
    assert sink.commit(b) == CommitResult(3, 2)
    assert_exactly(lake, {("ORDERS", s) for s in range(1, 8)})


def test_target_file_size_splits_a_large_batch_in_row_order(lake):
    sink = ParquetLakeSink(lake, target_file_size=1 << 20)
    seqs = list(range(1, 2501))
    blobs = pa.array([os.urandom(1000) for _ in seqs])  # incompressible: ~2.5 MB of Parquet
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(seqs, extra=lambda s: {"blob": blobs}),
                     message_refs=refs_for(seqs))
    assert sink.commit(sink.mark_acking(p)) == CommitResult(2500, 0)
    files = sorted((lake / "data").glob("*.parquet"))
    assert len(files) == 3 and max(f.stat().st_size for f in files) <= 1.1 * (1 << 20)
    assert [s for f in files for s in pq.read_table(f, columns=["origin_seq"]).column(0).to_pylist()] == seqs
    assert_exactly(lake, {("ORDERS", s) for s in seqs})


def test_mark_acking_ends_with_an_error_when_another_writes_keys_stay_gone(lake, monkeypatch):
    """A write marked acking whose keys vanish (the table's directory removed under its writers)
    made a second writer sharing its inputs re-read the log forever, holding its pin: a
    follower was found spinning so for 49 minutes. It now ends with a SinkError (exit 2)."""
    from urllib.parse import unquote

    from airflow_provider_cg.core.landing.sinks.lake import lake_sink as lake_module
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError

    monkeypatch.setattr(lake_module, "VANISHED_RETRIES", 5)
    first, second = ParquetLakeSink(lake), ParquetLakeSink(lake)
    a = first.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11)))
    first.mark_acking(a)
    b = second.prepare(BatchId("ORDERS", "g", "m2", 1), rows(range(5, 16)), message_refs=refs_for(range(5, 16)))
    gone = [p for p in (lake / STAGING_DIR).rglob("keys-*.npy") if ":m1:" in unquote(str(p))]
    assert gone, sorted((lake / STAGING_DIR).rglob("*"))  # the first write's keys, only theirs
    for p in gone:
        p.unlink()
    with pytest.raises(SinkError, match="has no keys"):
        second.mark_acking(b)
