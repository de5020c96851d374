"""Two-phase sink scenarios shared by the Parquet and PostgreSQL sink tests: a recovering
instance's ``abort_unless_acking`` against a stalled instance's ``mark_acking``, in either
order and racing; and fencing: a new owner of partitions stops the old owner's acking and
finishes its writes (a dropped member's orphans included). Each returns after checking the
protocol; the caller checks its sink's rows."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import (
    CommitResult,
    Fence,
    FencedOut,
    PreparedWriteLost,
    WriteState,
)
from tests.support.sink_rows import refs_for, rows


def _together(*fns) -> None:
    """Run ``fns`` in threads and wait for them (they line up on their own barrier)."""
    threads = [threading.Thread(target=fn) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def _prepare_and_recover(zombie, recoverer, seqs=range(1, 6), batch_seq=1):
    p = zombie.prepare(BatchId("ORDERS", "g", "m1", batch_seq), rows(seqs), message_refs=refs_for(seqs))
    (found,) = recoverer.recover("ORDERS", "g", "m1")
    assert found.acking is False  # recovery read acking=False ...
    return p, found


def mark_acking_first_then_abort_unless_acking(zombie, recoverer) -> None:
    """The zombie marks acking after recovery listed its write: the abort must lose and the
    write end committed (5 rows, once)."""
    p, found = _prepare_and_recover(zombie, recoverer)
    assert zombie.mark_acking(p).acking is True  # ... then the zombie marked (and would ack)
    assert recoverer.abort_unless_acking(found) is WriteState.PREPARED  # not rolled back
    assert recoverer.state(found) is WriteState.PREPARED
    assert recoverer.commit(found) == CommitResult(5, 0)
    assert zombie.commit(p) == CommitResult(5, 0)
    assert recoverer.recover("ORDERS", "g", "m1") == []


def abort_unless_acking_first_then_mark_acking(zombie, recoverer) -> None:
    """Recovery aborts first: the zombie can neither mark acking nor commit."""
    p, found = _prepare_and_recover(zombie, recoverer)
    assert recoverer.abort_unless_acking(found) is WriteState.ABORTED
    with pytest.raises(PreparedWriteLost):
        zombie.mark_acking(p)
    with pytest.raises(PreparedWriteLost):
        zombie.commit(p)
    assert recoverer.abort_unless_acking(found) is WriteState.ABORTED  # idempotent


def race_mark_acking_vs_abort_unless_acking(make_sink, landed, rounds=50):
    """Each round: a zombie marks acking while recovery aborts-unless-acking (and commits if
    acking won). Exactly one wins; an acked write always ends committed, an aborted one empty."""
    zombie, recoverer = make_sink(), make_sink()
    expected: set[tuple[str, int]] = set()
    wins = {"acking": 0, "abort": 0}
    for i in range(1, rounds + 1):
        seqs = range(i * 10, i * 10 + 3)
        p, found = _prepare_and_recover(zombie, recoverer, seqs, i)
        barrier = threading.Barrier(2)
        out: dict = {}

        def mark(p=p, out=out, barrier=barrier):
            barrier.wait()
            try:
                out["mark"] = zombie.mark_acking(p)
            except PreparedWriteLost as exc:
                out["mark"] = exc

        def recover(found=found, out=out, barrier=barrier):
            barrier.wait()
            out["abort"] = recoverer.abort_unless_acking(found)
            if out["abort"] is WriteState.PREPARED:
                recoverer.commit(found)

        _together(mark, recover)
        acked = not isinstance(out["mark"], Exception)
        assert acked == (out["abort"] is WriteState.PREPARED), f"round {i}: {out}"
        assert (not acked) == (out["abort"] is WriteState.ABORTED), f"round {i}: {out}"
        if acked:
            wins["acking"] += 1
            expected |= {("ORDERS", s) for s in seqs}
            assert recoverer.state(found) is WriteState.COMMITTED
            zombie.commit(out["mark"])  # the zombie's own commit is idempotent
        else:
            wins["abort"] += 1
            assert recoverer.state(found) is WriteState.ABORTED
            with pytest.raises(PreparedWriteLost):
                zombie.commit(p)
        assert recoverer.recover("ORDERS", "g", "m1") == []
        assert set(landed()) == expected, f"round {i}"
    return wins


# --- fencing -----------------------------------------------------------------------------------

def fence_stops_a_zombie_and_recovery_finishes_its_writes(zombie, successor) -> None:
    """A zombie instance of m1 holds two prepared writes of partitions {0, 1}: one already
    marked acking (its acks may have taken effect), one not. A successor fences {0, 1}: the
    zombie can no longer mark acking, and the successor's recovery commits the acking write
    and rolls back the other, before the successor lands newer rows."""
    old = Fence("m1/zombie", (0, 1))
    zombie.fence("ORDERS", "g", old)
    acked = zombie.mark_acking(zombie.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)),
                                              message_refs=refs_for(range(1, 4)), fence=old))
    unacked = zombie.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(4, 7)),
                             message_refs=refs_for(range(4, 7)), fence=old)
    new = Fence("m1/successor", (0, 1))
    successor.fence("ORDERS", "g", new)
    with pytest.raises(FencedOut):
        zombie.mark_acking(unacked)
    found = successor.recover("ORDERS", "g", "m1", new.partitions)
    assert [(w.gid, w.acking, w.fence) for w in found] == [(acked.gid, True, old), (unacked.gid, False, old)]
    assert successor.commit(found[0]) == CommitResult(3, 0)
    assert successor.abort_unless_acking(found[1]) is WriteState.ABORTED
    mine = successor.prepare(BatchId("ORDERS", "g", "m1", 3), rows(range(4, 10)),
                             message_refs=refs_for(range(4, 10)), fence=new)
    assert successor.commit(successor.mark_acking(mine)) == CommitResult(6, 0)
    assert zombie.commit(acked) == CommitResult(3, 0)  # the zombie's own late commit: a no-op
    assert zombie.abort(unacked) is WriteState.ABORTED
    assert successor.recover("ORDERS", "g", "m1", new.partitions) == []


def new_owner_of_a_partition_finishes_a_dropped_members_orphan(dropped, owner) -> None:
    """m2 held partitions {2, 3}, was killed after marking acking (acks taken effect), then
    dropped from the group. m1 gets partition 3: fencing it finds m2's orphan through the
    shared partition and commits it; a write of m2 on partitions m1 did not fence stays m2's."""
    m2 = Fence("m2/dead", (2, 3))
    dropped.fence("ORDERS", "g", m2)
    orphan = dropped.mark_acking(dropped.prepare(BatchId("ORDERS", "g", "m2", 1), rows(range(1, 6)),
                                                 message_refs=refs_for(range(1, 6)), fence=m2))
    other = Fence("m2/other", (5,))
    dropped.fence("ORDERS", "g", other)
    unrelated = dropped.prepare(BatchId("ORDERS", "g", "m2", 2), rows(range(20, 22)),
                                message_refs=refs_for(range(20, 22)), fence=other)
    assert owner.recover("ORDERS", "g", "m1") == []  # without fenced partitions: m1's own only
    m1 = Fence("m1/new", (0, 1, 3))
    owner.fence("ORDERS", "g", m1)
    (found,) = owner.recover("ORDERS", "g", "m1", m1.partitions)
    assert found.gid == orphan.gid and found.acking
    assert owner.commit(found) == CommitResult(5, 0)
    assert owner.recover("ORDERS", "g", "m1", m1.partitions) == []
    assert [w.gid for w in owner.recover("ORDERS", "g", "m2")] == [unrelated.gid]
    assert owner.recover("OTHER", "g", "m1", m1.partitions) == []  # another stream's group: untouched
    dropped.abort(unrelated)


def race_mark_acking_vs_fence(make_sink, landed, rounds=30):
    """Each round: the old owner marks acking while a new owner fences and recovers. Either
    the mark wins (and recovery commits the write) or the fence does (mark_acking raises
    FencedOut, or PreparedWriteLost once recovery rolled the write back); never both."""
    zombie, successor = make_sink(), make_sink()
    expected: set[tuple[str, int]] = set()
    wins = {"acking": 0, "fence": 0}
    for i in range(1, rounds + 1):
        seqs = range(i * 10, i * 10 + 3)
        old, new = Fence(f"old-{i}", (0, 1)), Fence(f"new-{i}", (1, 2))
        zombie.fence("ORDERS", "g", old)
        p = zombie.prepare(BatchId("ORDERS", "g", "m1", i), rows(seqs), message_refs=refs_for(seqs), fence=old)
        barrier = threading.Barrier(2)
        out: dict = {}

        def mark(p=p, out=out, barrier=barrier):
            barrier.wait()
            try:
                out["mark"] = zombie.mark_acking(p)
            except PreparedWriteLost as exc:  # FencedOut, or already rolled back by the recovery
                out["mark"] = exc

        def take_over(new=new, out=out, barrier=barrier):
            barrier.wait()
            successor.fence("ORDERS", "g", new)
            (found,) = successor.recover("ORDERS", "g", "m9", new.partitions)
            out["acking"] = found.acking
            if found.acking or successor.abort_unless_acking(found) is WriteState.PREPARED:
                successor.commit(found)
                out["committed"] = True

        _together(mark, take_over)
        acked = not isinstance(out["mark"], Exception)
        assert acked == bool(out.get("committed")), f"round {i}: {out}"
        if acked:
            wins["acking"] += 1
            expected |= {("ORDERS", s) for s in seqs}
        else:
            wins["fence"] += 1
            assert successor.state(p) is WriteState.ABORTED
        assert set(landed()) == expected, f"round {i}"
    return wins


# -- writers of the same inputs: a transformation's output is committed for each input once --------


def _transformed(sink, member: str, batch_seq: int, seqs):
    """Prepare a transformation's output standing for ``seqs``: one row per input, so the
    landed rows show each input's effect (the sink does not dedupe them: it records inputs)."""
    import numpy as np

    fresh = np.asarray(sorted(seqs), dtype=np.int64)
    return sink.prepare(BatchId("ORDERS", "g", member, batch_seq), rows(fresh, member=member),
                        message_refs=refs_for(fresh), input_keys={"ORDERS": fresh})


def second_writer_of_marked_inputs_is_refused(first, second) -> None:
    """Two writers prepared transformed writes sharing inputs 4-6; the first is marked acking
    (its acks may be out). The second's mark finishes the first (commits it) and is refused
    with exactly the shared inputs; rolled back and computed again without them, it lands the
    rest."""
    from airflow_provider_cg.core.landing.sinks import InputsTaken

    a = _transformed(first, "m1", 1, range(1, 7))
    b = _transformed(second, "bf-1-2", 1, range(4, 10))
    first.mark_acking(a)
    with pytest.raises(InputsTaken) as taken:
        second.mark_acking(b)
    assert [int(x) for x in taken.value.taken["ORDERS"]] == [4, 5, 6]
    assert second.state(b) is WriteState.PREPARED  # refused, not rolled back: its writer does that
    assert first.state(a) is WriteState.COMMITTED  # the second's mark committed the first
    assert second.abort(b) is WriteState.ABORTED
    fresh = [s for s, hit in zip(range(4, 10), second.committed_keys_exist("ORDERS", range(4, 10)), strict=True)
             if not hit]
    assert fresh == [7, 8, 9]
    c = _transformed(second, "bf-1-2", 2, fresh)
    second.commit(second.mark_acking(c))
    assert first.commit(a).rows_written == 6  # idempotent for its own writer


def writers_of_the_same_inputs_race(make_sink, landed, writers=3, rounds=12, span=60, width=25, seed=7) -> dict:
    """``writers`` threads (a live member and backfills, each with its own sink instance) land
    random overlapping windows of inputs as transformations' outputs, each batch computed
    without the inputs committed when it starts and computed again when refused. Every input
    of every window lands once (``landed()``: the rows' origin sequences)."""
    import random

    import numpy as np

    from airflow_provider_cg.core.landing.sinks import InputsTaken

    rng = random.Random(seed)
    windows = [[(lo := rng.randint(1, span - width), lo + rng.randint(1, width)) for _ in range(rounds)]
               for _ in range(writers)]
    barrier = threading.Barrier(writers)
    errors, refused = [], []

    def work(w: int) -> None:
        member = "m1" if w == 0 else f"bf-{w}-{w + 1}"
        try:
            sink = make_sink()
            barrier.wait()
            seq = 0
            for lo, hi in windows[w]:
                window = np.arange(lo, hi + 1, dtype=np.int64)
                while True:
                    fresh = window[~sink.committed_keys_exist("ORDERS", window)]
                    if not len(fresh):
                        break
                    seq += 1
                    try:
                        p = _transformed(sink, member, seq, fresh)
                    except InputsTaken:  # a sink that decides at prepare (PostgreSQL)
                        refused.append(w)
                        continue
                    try:
                        p = sink.mark_acking(p)
                    except InputsTaken:
                        refused.append(w)
                        sink.abort(p)
                        continue
                    sink.commit(p)
                    break
            sink.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    _together(*[lambda w=w: work(w) for w in range(writers)])
    assert not errors, errors
    got = landed()
    want = sorted({s for ws in windows for lo, hi in ws for s in range(lo, hi + 1)})
    dups = sorted({s for s in got if got.count(s) > 1})
    assert not dups, f"inputs landed twice: {dups[:10]}"
    assert sorted(got) == want
    return {"refused": len(refused), "landed": len(got)}
