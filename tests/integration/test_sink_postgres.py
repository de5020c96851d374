"""PostgresSink on a real PostgreSQL 15: PREPARE TRANSACTION protocol, dedupe, recovery from
pg_prepared_xacts, lock waits, and no password in errors."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pyarrow as pa
import pytest

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import (
    CommitResult,
    PostgresSink,
    PreparedWriteLost,
    SinkError,
    SinkLockTimeout,
    WriteState,
)
from tests.support import two_phase
from tests.support.sink_rows import refs_for, rows

pytestmark = [pytest.mark.postgres, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def query(params, sql, args=()):
    conn = psycopg2.connect(**params.conn_params())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def landed(params, table="cg_events") -> list[tuple[str, int]]:
    return [tuple(r) for r in query(params, f"SELECT origin_stream, origin_seq FROM {table} ORDER BY 1, 2")]


def prepared_gids(params) -> list[str]:
    return [
        r[0] for r in query(params, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
    ]


@pytest.fixture
def sink(postgres_db):
    s = PostgresSink(postgres_db.conn_params(), lock_timeout_s=10)
    yield s
    s.close()


def test_prepare_is_invisible_until_commit(sink, postgres_db):
    p = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101))
    )
    assert prepared_gids(postgres_db) == [p.gid]
    assert landed(postgres_db) == []
    assert sink.state(p) is WriteState.PREPARED
    assert sink.commit(p) == CommitResult(rows_written=100, duplicates_skipped=0)
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 101)]
    assert prepared_gids(postgres_db) == []
    assert sink.state(p) is WriteState.COMMITTED
    assert query(postgres_db, "SELECT count(*) FROM cg_prepared_writes") == [(0,)]


def test_values_round_trip(sink, postgres_db):
    t = rows([1, 2], extra=lambda s: {"value": pa.array([{"id": int(x), "tags": ["a", "b"]} for x in s])})
    t = t.set_column(5, "payload", pa.array([b"\x00\xffraw", None], pa.binary()))
    t = t.set_column(6, "payload_text", pa.array(["has\x00nul", "ok"]))
    sink.commit(sink.prepare(BatchId("ORDERS", "g", "m1", 1), t, message_refs=refs_for([1, 2])))
    got = query(
        postgres_db,
        "SELECT payload, payload_text, headers->>'Nats-Msg-Id', value->'tags', \"timestamp\", \"group\", "
        '"partition" FROM cg_events ORDER BY origin_seq',
    )
    assert bytes(got[0][0]) == b"\x00\xffraw" and got[1][0] is None
    assert got[0][1] is None and got[1][1] == "ok"  # NUL cannot live in text: NULL, bytes kept in payload
    assert got[0][2] == "1" and got[0][3] == ["a", "b"]
    assert got[0][4].timestamp() == pytest.approx(1.000000123, abs=1e-6)
    assert got[0][5] == "g" and got[0][6] == 1


def test_commit_is_idempotent_across_instances(sink, postgres_db):
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11)))
    first = sink.commit(p)
    assert sink.commit(p) == first
    with PostgresSink(postgres_db.dsn) as other:
        assert other.commit(p) == first
    assert len(landed(postgres_db)) == 10


def test_last_commits_name_each_members_latest_batch(sink, postgres_db):
    sink.commit(sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))))
    latest = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(11, 31)), message_refs=refs_for(range(11, 31)))
    sink.commit(latest)
    sink.commit(sink.prepare(BatchId("ORDERS", "g", "m2", 1), rows([40, 42], member="m2"),
                             message_refs=refs_for([40, 42])))
    other = sink.prepare(BatchId("ORDERS", "h", "m1", 1), rows([50]), message_refs=refs_for([50]))
    sink.commit(other)  # another group: not listed
    aborted = sink.prepare(BatchId("ORDERS", "g", "m1", 3), rows([60]), message_refs=refs_for([60]))
    sink.abort(aborted)  # never committed: not the last commit
    got = sink.last_commits("ORDERS", "g")
    assert set(got) == {"m1", "m2"}
    assert got["m1"].batch_id == latest.gid and got["m1"].rows_written == 20
    assert got["m1"].origin == {"ORDERS": {"first_seq": 11, "last_seq": 30, "messages": 20}}
    assert got["m2"].origin == {"ORDERS": {"first_seq": 40, "last_seq": 42, "messages": 2}}
    assert "T" in got["m1"].committed_at and got["m1"].committed_at <= got["m2"].committed_at  # m2 committed after


def test_abort_is_idempotent_and_final(sink, postgres_db):
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11)))
    assert sink.abort(p) is WriteState.ABORTED
    assert sink.abort(p) is WriteState.ABORTED
    assert sink.state(p) is WriteState.ABORTED
    with pytest.raises(PreparedWriteLost):
        sink.commit(p)
    assert landed(postgres_db) == [] and prepared_gids(postgres_db) == []
    assert query(postgres_db, "SELECT count(*) FROM cg_prepared_writes") == [(0,)]

    q = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(1, 11)), message_refs=refs_for(range(1, 11)))
    sink.commit(q)
    assert sink.abort(q) is WriteState.COMMITTED
    assert len(landed(postgres_db)) == 10


def test_duplicates_across_commits_and_within_a_batch_are_dropped(sink, postgres_db):
    sink.commit(
        sink.prepare(
            BatchId("ORDERS", "g", "m1", 1), rows(range(1, 101)), message_refs=refs_for(range(1, 101))
        )
    )
    seqs = [*range(50, 151), 60]
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(seqs), message_refs=refs_for(seqs))
    assert sink.commit(p) == CommitResult(rows_written=50, duplicates_skipped=52)
    sink.commit(
        sink.prepare(BatchId("ORDERS", "g", "m1", 3), rows([1, 2], stream="OTHER"), message_refs={"X": [1]})
    )
    got = landed(postgres_db)
    assert len(got) == len(set(got)) == 152
    assert sink.committed_keys_exist("ORDERS", [0, 1, 150, 151]).tolist() == [False, True, True, False]


def test_recover_from_pg_prepared_xacts_after_the_connection_is_gone(sink, postgres_db):
    mine = sink.prepare(
        BatchId("ORD:ERS", "g", "m1", 5), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    sink.prepare(BatchId("ORD:ERS", "g", "m10", 1), rows(range(11, 21)), message_refs=refs_for(range(11, 21)))
    sink.close()

    with PostgresSink(postgres_db.dsn) as fresh:
        found = fresh.recover("ORD:ERS", "g", "m1")
        assert [p.gid for p in found] == [mine.gid]
        assert found[0].rows == 10 and found[0].message_refs == refs_for(range(1, 11))
        assert fresh.state(found[0]) is WriteState.PREPARED
        assert fresh.commit(found[0]) == CommitResult(10, 0)
        assert fresh.recover("ORD:ERS", "g", "m1") == []
        assert [p.batch_id.member for p in fresh.recover("ORD:ERS", "g", "m10")] == ["m10"]


CRASH_AFTER_PREPARE = """
import os, sys
sys.path.insert(0, {repo!r})
from tests.integration.test_sink_postgres import rows, refs_for
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import PostgresSink
sink = PostgresSink(os.environ["CG_TEST_DSN"])
sink.prepare(BatchId("ORDERS", "g", "m1", 8), rows(range(1, 301)), message_refs=refs_for(range(1, 301)))
os._exit(9)  # killed before acking and committing
"""


def test_crash_after_prepare_then_recover_and_commit(postgres_db):
    env = {"CG_TEST_DSN": postgres_db.dsn, "PATH": "/usr/bin:/bin"}  # the DSN via env, not argv
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_PREPARE.format(repo=str(REPO))],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 9, proc.stderr
    assert landed(postgres_db) == []
    with PostgresSink(postgres_db.conn_params()) as sink:
        (pending,) = sink.recover("ORDERS", "g", "m1")
        assert pending.batch_id.batch_seq == 8 and not pending.acking  # died before acking
        assert list(pending.iter_ref_ranges()) == [("ORDERS-g", 1, 300)]
        assert sink.commit(pending) == CommitResult(300, 0)
    assert len(landed(postgres_db)) == 300


def test_recover_drops_refs_of_writes_that_never_prepared(sink, postgres_db):
    sink.ensure_tables()
    gid = BatchId("ORDERS", "g", "m1", 3).gid
    query(
        postgres_db,
        "INSERT INTO cg_prepared_writes (gid, target, stream, grp, member, batch_seq, rows, refs) "
        "VALUES (%s, 'public.cg_events', 'ORDERS', 'g', 'm1', 3, 1, '{}')",
        (gid,),
    )
    assert sink.recover("ORDERS", "g", "m1") == []
    assert query(postgres_db, "SELECT count(*) FROM cg_prepared_writes") == [(0,)]


def test_mark_acking_is_durable_and_drives_recovery(sink, postgres_db):
    quiet = sink.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    acking = sink.prepare(
        BatchId("ORDERS", "g", "m1", 2), rows(range(11, 21)), message_refs=refs_for(range(11, 21))
    )
    assert sink.mark_acking(acking).acking is True
    assert sink.mark_acking(acking).acking is True  # idempotent
    sink.close()
    with PostgresSink(postgres_db.dsn) as fresh:
        found = {p.batch_id.batch_seq: p for p in fresh.recover("ORDERS", "g", "m1")}
        assert found[1].acking is False and found[2].acking is True
        assert found[2].message_refs == refs_for(range(11, 21))
        assert fresh.abort(found[1]) is WriteState.ABORTED
        assert fresh.commit(found[2]) == CommitResult(10, 0)
        with pytest.raises(PreparedWriteLost):
            fresh.mark_acking(quiet)
        assert fresh.mark_acking(acking).acking is True  # already committed: fine
        assert fresh.recover("ORDERS", "g", "m1") == []
    assert query(postgres_db, "SELECT count(*) FROM cg_prepared_writes") == [(0,)]
    assert landed(postgres_db) == [("ORDERS", s) for s in range(11, 21)]


def test_prepared_write_without_refs_row_is_reported_acking(sink, postgres_db):
    p = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs=refs_for(range(1, 4)))
    query(postgres_db, "DELETE FROM cg_prepared_writes")  # e.g. removed by a racing recover
    (found,) = sink.recover("ORDERS", "g", "m1")
    assert found.gid == p.gid and found.acking is True and found.message_refs == []
    assert sink.commit(found) == CommitResult(3, 0)


def test_second_prepare_of_held_keys_times_out_clearly(postgres_db):
    holder = PostgresSink(postgres_db.conn_params())
    first = holder.prepare(
        BatchId("ORDERS", "g", "m1", 1), rows(range(1, 11)), message_refs=refs_for(range(1, 11))
    )
    waiter = PostgresSink(postgres_db.conn_params(), lock_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(SinkLockTimeout) as info:
        waiter.prepare(
            BatchId("ORDERS", "g", "m2", 1), rows(range(5, 16)), message_refs=refs_for(range(5, 16))
        )
    assert 0.9 < time.monotonic() - started < 8
    assert first.gid in str(info.value) and "recover()" in str(info.value)
    assert prepared_gids(postgres_db) == [first.gid]
    assert query(postgres_db, "SELECT gid FROM cg_prepared_writes") == [(first.gid,)]

    # a waiting prepare proceeds once the holder commits, and skips the held keys
    result = {}

    def wait_then_prepare():
        with PostgresSink(postgres_db.conn_params(), lock_timeout_s=30) as s:
            p = s.prepare(
                BatchId("ORDERS", "g", "m2", 2), rows(range(5, 16)), message_refs=refs_for(range(5, 16))
            )
            result["commit"] = s.commit(p)

    t = threading.Thread(target=wait_then_prepare)
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # blocked on the prepared rows
    holder.commit(first)
    t.join(30)
    assert result["commit"] == CommitResult(rows_written=5, duplicates_skipped=6)
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 16)]
    holder.close()
    waiter.close()


def test_concurrent_writers_in_threads(postgres_db):
    workers, batches = 4, 8
    written, errors = [], []
    barrier = threading.Barrier(workers)

    def work(w):
        try:
            with PostgresSink(postgres_db.conn_params()) as s:
                barrier.wait()
                for i in range(batches):
                    seqs = range(max(1, 1 + i * 40 - w * 7), 1 + i * 40 + 50)
                    p = s.prepare(BatchId("ORDERS", "g", f"m{w}", i), rows(seqs), message_refs=refs_for(seqs))
                    written.append(s.commit(p).rows_written)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    expected = {("ORDERS", s) for w in range(workers) for i in range(batches)
                for s in range(max(1, 1 + i * 40 - w * 7), 1 + i * 40 + 50)}  # fmt: skip
    got = landed(postgres_db)
    assert len(got) == len(set(got)) and set(got) == expected
    assert sum(written) == len(expected)
    assert prepared_gids(postgres_db) == []


def _process_worker(dsn, worker, batches, start, out):
    with PostgresSink(dsn) as s:
        start.wait()
        total = 0
        for i in range(batches):
            seqs = range(max(1, 1 + i * 40 - worker * 13), 1 + i * 40 + 50)
            p = s.prepare(BatchId("ORDERS", "g", f"p{worker}", i), rows(seqs), message_refs=refs_for(seqs))
            total += s.commit(p).rows_written
    out.put(total)


def test_concurrent_writers_in_two_processes(postgres_db):
    PostgresSink(postgres_db.dsn).ensure_tables()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(2, timeout=60), ctx.Queue()
    batches = 15
    procs = [
        ctx.Process(target=_process_worker, args=(postgres_db.dsn, w, batches, start, out)) for w in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    written = out.get(timeout=5) + out.get(timeout=5)
    expected = {("ORDERS", s) for w in (0, 1) for i in range(batches)
                for s in range(max(1, 1 + i * 40 - w * 13), 1 + i * 40 + 50)}  # fmt: skip
    got = landed(postgres_db)
    assert len(got) == len(set(got)) and set(got) == expected
    assert written == len(expected)


def test_no_password_in_errors(postgres_db):
    secret = "Wr0ng-Sekret-Pw"
    bad = PostgresSink(postgres_db.conn_params(password=secret))
    assert secret not in repr(bad)
    with pytest.raises(SinkError) as info:
        bad.recover("ORDERS", "g", "m1")
    text = "".join(traceback.format_exception(info.value))
    assert "password authentication failed" in text
    assert secret not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__

    dsn = postgres_db.dsn.replace(postgres_db.password, secret) + " bogus_option"
    with pytest.raises(SinkError) as info:
        PostgresSink(dsn).recover("ORDERS", "g", "m1")
    assert secret not in "".join(traceback.format_exception(info.value))
    uri = f"postgresql://{postgres_db.user}:{secret}@{postgres_db.host}:{postgres_db.port}/nodb?bogus=1"
    with pytest.raises(SinkError) as info:
        PostgresSink(uri).recover("ORDERS", "g", "m1")
    assert secret not in "".join(traceback.format_exception(info.value))
    assert postgres_db.password not in repr(PostgresSink(postgres_db.dsn))

    # whatever a driver message echoes, the password is masked
    for conn in (dsn, uri, {"host": "h", "password": secret}):
        err = PostgresSink(conn)._error(RuntimeError(f"cannot use {conn} / {secret}"), "connect")
        assert secret not in str(err) and "***" in str(err)


def test_target_without_unique_key_is_reported(postgres_db):
    query(postgres_db, "CREATE TABLE plain_events (origin_stream text, origin_seq bigint)")
    with PostgresSink(postgres_db.conn_params(), table="plain_events") as s:
        with pytest.raises(SinkError, match="ON CONFLICT"):
            s.prepare(BatchId("ORDERS", "g", "m1", 1), rows([1]), message_refs=refs_for([1]))
        assert prepared_gids(postgres_db) == []
        assert query(postgres_db, "SELECT count(*) FROM cg_prepared_writes") == [(0,)]


def test_headers_are_jsonb(sink, postgres_db):
    sink.commit(sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows([7]), message_refs=refs_for([7])))
    (typ,) = query(
        postgres_db, "SELECT data_type FROM information_schema.columns WHERE column_name = 'headers'"
    )
    assert typ == ("jsonb",)
    assert json.loads(json.dumps(query(postgres_db, "SELECT headers FROM cg_events")[0][0])) == {
        "Nats-Msg-Id": "7"
    }


# -- recovery's abort vs a zombie's mark_acking: exactly one wins --------------------------------


@contextmanager
def sink_pair(params, zombie_cls=None):
    """A stalled instance's sink and a recovering instance's sink on the same database."""
    with (zombie_cls or PostgresSink)(params.conn_params()) as zombie, PostgresSink(params.conn_params()) as recoverer:
        yield zombie, recoverer


def test_mark_acking_first_then_abort_unless_acking_commits(postgres_db):
    with sink_pair(postgres_db) as (zombie, recoverer):
        two_phase.mark_acking_first_then_abort_unless_acking(zombie, recoverer)
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 6)]


def test_abort_unless_acking_first_then_mark_acking_is_lost(postgres_db):
    with sink_pair(postgres_db) as (zombie, recoverer):
        two_phase.abort_unless_acking_first_then_mark_acking(zombie, recoverer)
    assert landed(postgres_db) == []
    assert prepared_gids(postgres_db) == []


def test_write_prepared_after_recovery_ran_is_lost_and_rolled_back_by_its_writer(postgres_db):
    """A writer stalls between storing its refs and PREPARE; another instance's recovery runs
    then (the write is not prepared yet: its refs row is an orphan and goes). The writer's
    mark_acking must fail, and its abort must release the prepared write and its row locks."""

    class Stalling(PostgresSink):
        during = None

        def _run(self, action, fn):
            out = super()._run(action, fn)
            if action == "store message refs" and self.during is not None:
                self.during()
            return out

    with sink_pair(postgres_db, Stalling) as (zombie, recoverer):
        zombie.during = lambda: recoverer.recover("ORDERS", "g", "m1")
        p = zombie.prepare(
            BatchId("ORDERS", "g", "m1", 1), rows(range(1, 6)), message_refs=refs_for(range(1, 6))
        )
        assert prepared_gids(postgres_db) == [p.gid]
        with pytest.raises(PreparedWriteLost):
            zombie.mark_acking(p)
        assert zombie.abort(p) is WriteState.ABORTED
        assert prepared_gids(postgres_db) == []
        # the keys are free: the new pin holder's write of the same messages goes through
        q = recoverer.prepare(
            BatchId("ORDERS", "g", "m1", 2), rows(range(1, 6)), message_refs=refs_for(range(1, 6))
        )
        recoverer.commit(recoverer.mark_acking(q))
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 6)]


def test_race_mark_acking_vs_abort_unless_acking(postgres_db):
    sinks = []

    def make():
        sinks.append(PostgresSink(postgres_db.conn_params(), lock_timeout_s=10))
        return sinks[-1]

    try:
        wins = two_phase.race_mark_acking_vs_abort_unless_acking(make, lambda: landed(postgres_db))
    finally:
        for s in sinks:
            s.close()
    assert wins["acking"] + wins["abort"] == 50
    assert prepared_gids(postgres_db) == []


def test_fence_stops_a_zombie_and_recovery_finishes_its_writes(postgres_db):
    with sink_pair(postgres_db) as (zombie, successor):
        two_phase.fence_stops_a_zombie_and_recovery_finishes_its_writes(zombie, successor)
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 10)]
    assert prepared_gids(postgres_db) == []


def test_new_owner_of_a_partition_finishes_a_dropped_members_orphan(postgres_db):
    with sink_pair(postgres_db) as (dropped, owner):
        two_phase.new_owner_of_a_partition_finishes_a_dropped_members_orphan(dropped, owner)
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 6)]
    assert prepared_gids(postgres_db) == []


def test_race_mark_acking_vs_fence(postgres_db):
    sinks = []

    def make():
        sinks.append(PostgresSink(postgres_db.conn_params(), lock_timeout_s=10))
        return sinks[-1]

    try:
        wins = two_phase.race_mark_acking_vs_fence(make, lambda: landed(postgres_db))
    finally:
        for s in sinks:
            s.close()
    assert wins["acking"] + wins["fence"] == 30
    assert prepared_gids(postgres_db) == []


# -- writers of the same inputs (live members, backfills, replays) --------------------------------


def test_writer_of_inputs_another_write_holds_waits_and_is_refused(postgres_db):
    """PostgreSQL serializes writers of the same inputs: a prepare of inputs that another
    prepared write holds waits for it; once that one commits, the prepare is refused with
    exactly the shared inputs and leaves nothing prepared. Computed again without them, it lands
    the rest, each input's row once."""
    from airflow_provider_cg.core.landing.sinks import InputsTaken

    with PostgresSink(postgres_db.conn_params(), transformed=True) as first, \
            PostgresSink(postgres_db.conn_params(), transformed=True) as second:
        a = two_phase._transformed(first, "m1", 1, range(1, 7))
        first.mark_acking(a)
        outcome = {}

        def prepare_second():
            try:
                outcome["write"] = two_phase._transformed(second, "bf-1-2", 1, range(4, 10))
            except InputsTaken as exc:
                outcome["taken"] = exc.taken

        t = threading.Thread(target=prepare_second)
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "the second prepare did not wait for the first write"
        first.commit(a)
        t.join(30)
        assert [int(x) for x in outcome["taken"]["ORDERS"]] == [4, 5, 6]
        assert prepared_gids(postgres_db) == []
        fresh = [s for s, hit in zip(range(4, 10), second.committed_keys_exist("ORDERS", range(4, 10)), strict=True)
                 if not hit]
        c = two_phase._transformed(second, "bf-1-2", 2, fresh)
        second.commit(second.mark_acking(c))
    assert landed(postgres_db) == [("ORDERS", s) for s in range(1, 10)]


def test_writers_of_the_same_inputs_race(postgres_db):
    out = two_phase.writers_of_the_same_inputs_race(
        lambda: PostgresSink(postgres_db.conn_params(), transformed=True),
        lambda: [s for _, s in landed(postgres_db)], rounds=8)
    assert out["refused"] > 0
    assert prepared_gids(postgres_db) == []
