"""The protocol log's checkpoints, folding and clean-up (``protocol_log.py``) on the Parquet
dataset: a log opened after folding and clean-up decides every batch as the whole log did
(duplicates, aborts, fences, last commits, the dataset's files), and a writer that stalled
across a clean-up cannot claim a freed position."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import (
    CommitResult,
    Fence,
    FencedOut,
    ParquetLakeSink,
    PreparedWriteLost,
    WriteState,
    read_committed,
)
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import (
    FOLDED_DIR,
    KEYS_DIR,
    LOG_DIR,
    POINTER,
    clean_protocol_log,
    in_runs,
    merge_runs,
    to_runs,
)
from tests.support.sink_rows import refs_for, rows


def _land(sink, seqs, batch_seq, member="m1"):
    seqs = [s for s in seqs if s > 0]
    p = sink.prepare(BatchId("ORDERS", "g", member, batch_seq), rows(seqs, member=member),
                     message_refs=refs_for(seqs))
    return sink.commit(sink.mark_acking(p))


def _keys(root: Path) -> list[int]:
    return read_committed(root, columns=["origin_seq"]).column("origin_seq").to_pylist()


def _folding_sink(root: Path, **kw) -> ParquetLakeSink:
    sink = ParquetLakeSink(root, fsync=False, checkpoint_interval=6, **kw)
    sink._log.keep = 4  # fold all but the last 4 records at each checkpoint
    return sink


def test_runs_agree_with_sets():
    rng = random.Random(7)
    for _ in range(200):
        parts = [np.unique(np.array(rng.sample(range(1, 300), rng.randint(0, 40)), dtype=np.int64))
                 for _ in range(rng.randint(1, 4))]
        runs = merge_runs(*(to_runs(p) for p in parts))
        want = set().union(*(set(p.tolist()) for p in parts))
        probe = np.arange(0, 302, dtype=np.int64)
        assert set(probe[in_runs(probe, runs)].tolist()) == want
        assert runs.shape[1] == 0 or (np.diff(runs[0]) > 0).all() and (runs[0][1:] > runs[1][:-1] + 1).all()


def test_a_folded_log_decides_as_the_whole_log(tmp_path):
    root = tmp_path / "lake"
    a, b = _folding_sink(root), _folding_sink(root)
    landed = set()
    for i in range(20):  # two members with overlapping batches: many duplicates
        for w, sink in enumerate((a, b)):
            seqs = range(1 + i * 30 - w * 9, 1 + i * 30 + 35)
            _land(sink, seqs, i + 1, member=f"m{w}")
            landed |= {s for s in seqs if s > 0}
    # an aborted write and a fence, both before the fold point
    aborted = a.prepare(BatchId("ORDERS", "g", "m0", 99), rows([5000]), message_refs=refs_for([5000]))
    assert a.abort(aborted) == WriteState.ABORTED
    a.fence("ORDERS", "g", Fence("owner-1", (0, 1), 4))
    for i in range(20, 30):
        _land(a, range(1 + i * 30, 1 + i * 30 + 30), i + 1, member="m0")
        landed |= set(range(1 + i * 30, 1 + i * 30 + 30))

    pointed = json.loads((root / POINTER).read_text())["pos"]
    body = json.loads((root / LOG_DIR / f"{pointed:020d}.checkpoint.json").read_text())
    assert body["v"] == 2 and body["folded"]["pos"] > 40, body["folded"]["pos"]
    assert len(body["records"]) <= 4 + 6  # kept whole: at most keep + one interval
    assert list((root / FOLDED_DIR).glob("*.npy"))

    fresh = ParquetLakeSink(root, fsync=False)
    fresh._log.refresh()
    assert fresh._log.folded_pos == body["folded"]["pos"]
    # every earlier input is a duplicate; new ones land
    everything = sorted(landed)
    assert _land(fresh, [*everything, 9001, 9002], 500, member="m9") == CommitResult(2, len(everything))
    assert sorted(_keys(root)) == sorted([*landed, 9001, 9002])
    # the abort survives folding: the stalled write cannot be marked acking
    assert fresh.state(aborted) == WriteState.ABORTED
    with pytest.raises(PreparedWriteLost):
        fresh.mark_acking(aborted)
    # the fence survives folding
    stale = fresh.prepare(BatchId("ORDERS", "g", "m0", 600), rows([9100]), message_refs=refs_for([9100]),
                          fence=Fence("owner-0", (0,), 4))
    with pytest.raises(FencedOut):
        fresh.mark_acking(stale)
    # last commits of the members whose last batch was folded
    whole = ParquetLakeSink(root, fsync=False)
    assert set(whole.last_commits("ORDERS", "g")) == {"m0", "m1", "m9"}
    assert whole.last_commits("ORDERS", "g")["m1"] == a.last_commits("ORDERS", "g")["m1"]


def test_clean_up_deletes_what_was_folded_and_nothing_else(tmp_path):
    root = tmp_path / "lake"
    sink = _folding_sink(root)
    for i in range(40):
        _land(sink, range(1 + i * 10, 1 + i * 10 + 15), i + 1)
    records_before = len(list((root / LOG_DIR).glob("0*.json")))
    keys_before = len(list((root / KEYS_DIR).iterdir()))
    assert clean_protocol_log(sink.store, retention_hours=24).records == 0  # nothing is old enough yet
    done = clean_protocol_log(sink.store, retention_hours=0)
    assert done.records > 20 and done.key_dirs > 20 and done.checkpoints >= 1, done
    assert len(list((root / LOG_DIR).glob("0*.json"))) < records_before - 20
    assert len(list((root / KEYS_DIR).iterdir())) < keys_before - 20
    fresh = ParquetLakeSink(root, fsync=False)
    assert _land(fresh, range(1, 420), 900, member="m2") == CommitResult(14, 405)
    assert sorted(_keys(root)) == list(range(1, 420))


def test_a_writer_stalled_across_a_clean_up_cannot_claim_a_freed_position(tmp_path):
    root = tmp_path / "lake"
    stalled = ParquetLakeSink(root, fsync=False)
    stalled._log.refresh()  # it has read the (empty) log, then stalls
    busy = _folding_sink(root)
    for i in range(30):
        _land(busy, range(1 + i * 10, 1 + i * 10 + 12), i + 1)
    assert clean_protocol_log(busy.store, retention_hours=0).records > 10
    assert not (root / LOG_DIR / f"{1:020d}.json").exists()
    # its next batch holds inputs the busy writer landed: its claim of the freed position 1
    # is taken back, it reads the log again, and drops them
    assert _land(stalled, range(5, 40), 1, member="m0") == CommitResult(0, 35)
    assert not (root / LOG_DIR / f"{1:020d}.json").exists()
    assert _land(stalled, range(300, 330), 2, member="m0") == CommitResult(27, 3)
    assert sorted(_keys(root)) == list(range(1, 330))
    fresh = ParquetLakeSink(root, fsync=False)
    assert _land(fresh, range(1, 331), 3, member="m3") == CommitResult(1, 329)


def test_a_checkpoint_pointed_past_a_claim_before_its_check_keeps_the_claim(tmp_path):
    """Between one writer's claim and its check, another reads the record, claims the next
    position and points at a checkpoint there. The claim holds: taking it back left a hole
    that a reader which had not read it yet could not pass (a follower found spinning in
    ``mark_acking`` on a write whose end it could not see)."""
    root = tmp_path / "lake"
    b = ParquetLakeSink(root, fsync=False, checkpoint_interval=2)
    c = ParquetLakeSink(root, fsync=False, checkpoint_interval=2)
    reader = ParquetLakeSink(root, fsync=False)
    _land(b, range(1, 11), 1, member="m1")
    reader._log.refresh()
    original = b._log._claim_holds
    raced: list[int] = []

    def racing(pos):
        if not raced:
            raced.append(pos)
            _land(c, range(100, 110), 1, member="m2")  # reads b's record, checkpoints past it
            assert c._log.pointer() >= pos
        return original(pos)

    b._log._claim_holds = racing
    assert _land(b, range(11, 21), 2, member="m1") == CommitResult(10, 0)
    for pos in range(1, b._log.pos + 1):
        assert (root / LOG_DIR / f"{pos:020d}.json").exists(), f"hole at {pos}"
    reader._log.refresh()
    c._log.refresh()
    assert reader._log.pos == b._log.pos == c._log.pos
    assert set(reader._log.commits) == set(b._log.commits) == set(c._log.commits)
    assert not reader._log.in_flight and not c._log.in_flight
    assert sorted(_keys(root)) == [*range(1, 21), *range(100, 110)]


def test_a_writer_stalled_across_a_clean_up_cannot_claim_a_freed_position_past_the_first(tmp_path):
    root = tmp_path / "lake"
    busy = _folding_sink(root)
    for i in range(3):
        _land(busy, range(1 + i * 10, 1 + i * 10 + 12), i + 1)
    stalled = ParquetLakeSink(root, fsync=False)
    stalled._log.refresh()  # it has read a few records, then stalls
    assert stalled._log.pos > 1
    for i in range(3, 30):
        _land(busy, range(1 + i * 10, 1 + i * 10 + 12), i + 1)
    assert clean_protocol_log(busy.store, retention_hours=0).records > 10
    assert not (root / LOG_DIR / f"{stalled._log.pos + 1:020d}.json").exists()
    assert _land(stalled, range(5, 40), 1, member="m0") == CommitResult(0, 35)
    assert _land(stalled, range(300, 330), 2, member="m0") == CommitResult(27, 3)
    assert sorted(_keys(root)) == list(range(1, 330))


@pytest.mark.parametrize("arr", [np.arange(5, dtype=np.int64), np.zeros(0, np.int64),
                                 to_runs(np.array([1, 2, 3, 7, 8, 10], np.int64)),
                                 np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
                                 np.arange(3, dtype=">i4")], ids=["keys", "empty", "runs", "fortran", "big-endian"])
def test_keys_files_are_read_without_the_ast_module(arr, monkeypatch):
    """Writers committing side by side in one process read keys files at once; numpy's header
    parser (``ast.literal_eval``) is not thread-safe on Python 3.11, so ``npy_load`` must not use it."""
    import ast

    from airflow_provider_cg.core.landing.sinks.lake.protocol_log import npy_bytes, npy_load

    data = npy_bytes(arr)

    def refuse(*_a, **_k):
        raise AssertionError("ast.literal_eval used")

    monkeypatch.setattr(ast, "literal_eval", refuse)
    got = npy_load(data)
    assert got.dtype == arr.dtype and got.shape == arr.shape and np.array_equal(got, arr) and got.flags.writeable
