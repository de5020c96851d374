"""One writer of ``tests/unit/landing/test_protocol_log_chaos.py``: lands random overlapping
batches into a Parquet dataset whose log folds often (checkpoint every 4 positions, 3 records
kept), reporting each batch's inputs once its acking mark holds (from then on the batch must
land). Started as its own process so the test can SIGKILL and SIGSTOP it.

    python -m tests.support.log_chaos_worker ROOT MEMBER SEED REPORT"""

from __future__ import annotations

import random
import sys

from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks import ParquetLakeSink
from tests.support.sink_rows import refs_for, rows


def main(root: str, member: str, seed: int, report: str) -> None:
    rng = random.Random(seed)
    sink = ParquetLakeSink(root, fsync=False, checkpoint_interval=4)
    sink._log.keep = 3
    # a restarted writer first finishes what its last life marked acking, as a member job does
    for p in sink.recover("ORDERS", "g", member):
        if p.acking:
            sink.commit(p)
        else:
            sink.abort(p)
    with open(report, "a") as out:
        for b in range(10_000):
            first = rng.randint(1, 3_000)
            seqs = sorted(set(rng.sample(range(first, first + 80), rng.randint(5, 40))))
            p = sink.prepare(BatchId("ORDERS", "g", member, seed * 100_000 + b), rows(seqs, member=member),
                             message_refs=refs_for(seqs))
            p = sink.mark_acking(p)
            out.write(" ".join(map(str, seqs)) + "\n")
            out.flush()
            sink.commit(p)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
