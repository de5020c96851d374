"""The two-phase lander (core/landing/protocol/two_phase.py) over a real Parquet lake on local disk:
the steps in order, the rule for ending a batch, fencing, and the one recovery that live
batches and backfills share."""

from __future__ import annotations

import asyncio

import numpy as np

from airflow_provider_cg.core.landing.contract import Summary
from airflow_provider_cg.core.landing.pipeline.processing import ProcessedBatch
from airflow_provider_cg.core.landing.protocol.two_phase import TwoPhaseLander, recover_writes
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import Fence, ParquetLakeSink, read_committed
from tests.support.sink_rows import rows


def committed_seqs(lake) -> list[int]:
    return sorted(read_committed(lake, columns=["origin_seq"]).column("origin_seq").to_pylist())


def land(lander, seqs, batch_seq, ack=None):
    table = rows(seqs)
    refs = {"ORDERS-g": np.asarray(list(seqs), np.int64)}
    return asyncio.run(lander.land(BatchId("ORDERS", "g", "m1", batch_seq), ProcessedBatch(table, {}), table, refs,
                                   ack, len(table), 10 * len(table)))


def test_a_batch_lands_once_and_is_counted(tmp_path):
    lake = tmp_path / "lake"
    s = Summary("ORDERS", "g", "m1")
    lander = TwoPhaseLander(ParquetLakeSink(lake), s, "ORDERS", "g", "m1")
    calls = []

    async def ack() -> int:
        calls.append("ack")
        assert committed_seqs(lake) == []  # acks go out between mark acking and commit
        return 2  # two acks stayed unconfirmed: committed all the same

    assert land(lander, range(1, 11), 1, ack) is True
    assert calls == ["ack"] and committed_seqs(lake) == list(range(1, 11))
    assert (s.batches, s.rows_written, s.messages_read, s.unconfirmed_acks) == (1, 10, 10, 2)
    assert sum(p["messages"] for p in s.partitions.values()) == 10
    assert land(lander, range(5, 15), 2) is True  # a backfill's batch: no ack step; dedupe by origin key
    assert committed_seqs(lake) == list(range(1, 15)) and s.duplicates_skipped == 6


def test_a_newer_pin_holder_fences_the_old_one_out_before_any_ack(tmp_path):
    lake = tmp_path / "lake"
    old = TwoPhaseLander(ParquetLakeSink(lake), Summary("ORDERS", "g", "m1"), "ORDERS", "g", "m1")
    new = TwoPhaseLander(ParquetLakeSink(lake), Summary("ORDERS", "g", "m1"), "ORDERS", "g", "m1")
    asyncio.run(old.take_over("m1/old", (0, 1, 2, 3)))
    asyncio.run(new.take_over("m1/new", (0, 1, 2, 3)))
    acked = []

    async def ack() -> int:
        acked.append(1)
        return 0

    assert land(old, range(1, 6), 1, ack) is False
    assert old.taken_over and not acked and committed_seqs(lake) == []  # rolled back, nothing acked
    assert land(new, range(1, 6), 1, ack) is True and committed_seqs(lake) == [1, 2, 3, 4, 5]


def test_recovery_commits_what_may_have_been_acked_and_rolls_back_the_rest(tmp_path):
    lake = tmp_path / "lake"
    sink = ParquetLakeSink(lake)
    quiet = sink.prepare(BatchId("ORDERS", "g", "m1", 1), rows(range(1, 4)), message_refs={"ORDERS-g": [1, 2, 3]})
    marked = sink.prepare(BatchId("ORDERS", "g", "m1", 2), rows(range(4, 7)), message_refs={"ORDERS-g": [4, 5, 6]})
    sink.mark_acking(marked)
    other = sink.prepare(BatchId("ORDERS", "g", "m2", 3), rows(range(7, 9)), message_refs={"ORDERS-g": [7, 8]},
                         fence=Fence("m2/a", (0, 3)))
    s = Summary("ORDERS", "g", "m1")
    done = recover_writes(ParquetLakeSink(lake), "ORDERS", "g", "m1", s)
    assert [w.batch_id.batch_seq for w in done] == [2]
    assert committed_seqs(lake) == [4, 5, 6]
    assert (s.recovered_committed, s.recovered_aborted, s.rows_written) == (1, 1, 3)
    assert quiet.batch_id.gid not in {w.batch_id.gid for w in sink.recover("ORDERS", "g", "m1")}
    # a dropped member's orphan is finished by whoever fences one of its partitions
    lander = TwoPhaseLander(ParquetLakeSink(lake), Summary("ORDERS", "g", "m1"), "ORDERS", "g", "m1")
    asyncio.run(lander.take_over("m1/x", (0, 3)))
    assert other.batch_id.gid not in {w.batch_id.gid for w in sink.recover("ORDERS", "g", "m2", (0, 1, 2, 3))}
    assert committed_seqs(lake) == [4, 5, 6]  # never marked acking: rolled back, its messages come again


def test_a_writer_whose_pin_moved_rolls_back_before_any_ack(tmp_path):
    """Another instance (orbit's, which our fences do not stop) was pinned meanwhile: the batch
    is rolled back with no ack sent, and the writer stops; with the pin still held it lands."""
    lake = tmp_path / "lake"
    s = Summary("ORDERS", "g", "m1")
    lander = TwoPhaseLander(ParquetLakeSink(lake), s, "ORDERS", "g", "m1")
    pinned = [True]
    asked, acked = [], []

    async def holds_pin() -> bool:
        asked.append(1)
        return pinned[0]

    async def ack() -> int:
        acked.append(1)
        return 0

    lander.holds_pin = holds_pin
    assert land(lander, range(1, 6), 1, ack) is True and len(asked) == len(acked) == 1
    pinned[0] = False
    assert land(lander, range(6, 11), 2, ack) is False
    assert len(asked) == 2 and len(acked) == 1 and lander.taken_over
    assert committed_seqs(lake) == list(range(1, 6)) and s.batches == 1
    assert lander.sink.recover("ORDERS", "g", "m1") == []  # rolled back, nothing left prepared
    assert land(lander, range(6, 11), 3) is True  # a backfill's batch asks nothing (no ack step)
    assert len(asked) == 2


def test_a_batch_whose_inputs_other_writers_keep_taking_lands_what_is_left(tmp_path):
    """A transformed batch over inputs 1-40, and another writer (a backfill beside a live
    member) committing 4 of them right before each of its acking marks, 8 times: more than
    ``MAX_RECOMPUTES`` recomputes, each taking inputs out. The batch is computed again each
    time and lands the 8 inputs no one took; nothing fails, every input lands once."""
    from airflow_provider_cg.core.landing.protocol.two_phase import MAX_RECOMPUTES

    lake = tmp_path / "lake"
    other = ParquetLakeSink(lake)
    chunks = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(8)]
    assert len(chunks) > MAX_RECOMPUTES

    def transformed(seqs):
        return rows(seqs), {"ORDERS": np.asarray(seqs, np.int64)}

    class Contended(ParquetLakeSink):
        def mark_acking(self, prepared):
            if chunks:  # the other writer's batch commits first
                table, keys = transformed(chunks.pop(0))
                p = other.prepare(BatchId("ORDERS", "g", "backfill", 100 + len(chunks)), table,
                                  message_refs={}, input_keys=keys)
                other.commit(other.mark_acking(p))
            return super().mark_acking(prepared)

    sink = Contended(lake)
    s = Summary("ORDERS", "g", "m1")
    lander = TwoPhaseLander(sink, s, "ORDERS", "g", "m1")
    seq = iter(range(2, 100))

    def recompute():
        left = [q for q in range(1, 41) if not sink.committed_keys_exist("ORDERS", [q])[0]]
        table, keys = transformed(left)
        return BatchId("ORDERS", "g", "m1", next(seq)), ProcessedBatch(table, {}, input_keys=keys)

    table, keys = transformed(list(range(1, 41)))
    refs = {"ORDERS-g": np.arange(1, 41, dtype=np.int64)}
    landed = asyncio.run(lander.land(BatchId("ORDERS", "g", "m1", 1), ProcessedBatch(table, {}, input_keys=keys),
                                     table, refs, None, 40, 400, recompute=recompute))
    assert landed is True and not chunks
    assert s.recomputed == 8
    assert committed_seqs(lake) == list(range(1, 41))  # each input's row once: 32 by the other, 8 here
