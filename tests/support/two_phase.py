"""Two-phase sink scenarios shared by the Parquet and PostgreSQL sink tests: a recovering
instance's ``abort_unless_acking`` against a stalled instance's ``mark_acking``, in either
order and racing. Each returns after checking the protocol; the caller checks its sink's rows."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_cg.core.rows import BatchId
from airflow_provider_cg.core.sinks import CommitResult, PreparedWriteLost, WriteState
from tests.support.sink_rows import refs_for, rows


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

        threads = [threading.Thread(target=mark), threading.Thread(target=recover)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
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
