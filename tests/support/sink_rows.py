"""Test rows for the sink tests: ``ROW_SCHEMA`` tables with values derived from the sequences."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.landing.rows import headers_to_json


def rows(seqs, stream="ORDERS", member="m1", extra=None) -> pa.Table:
    seqs = np.asarray(list(seqs), dtype=np.int64)
    n = len(seqs)
    cols = {
        "origin_stream": pa.array([stream] * n),
        "origin_seq": pa.array(seqs),
        "subject": pa.array([f"orders.{s % 3}" for s in seqs]),
        "partition": pa.array((seqs % 4).astype(np.int32)),
        "key": pa.array([str(s % 3) for s in seqs]),
        "payload": pa.array([f"payload-{s}".encode() for s in seqs], pa.binary()),
        "payload_text": pa.array([f"payload-{s}" for s in seqs]),
        "headers": pa.array([headers_to_json({"Nats-Msg-Id": str(s)}) for s in seqs]),
        "timestamp": pa.array(seqs * 1_000_000_123, pa.timestamp("ns", tz="UTC")),
        "delivery_count": pa.array(np.ones(n, dtype=np.int32)),
        "group": pa.array(["g"] * n),
        "member": pa.array([member] * n),
    }
    if extra:
        cols.update(extra(seqs))
    return pa.table(cols)


def refs_for(seqs, stream="ORDERS-g"):
    """Message refs ``(consumed stream, seq)`` for ``seqs``."""
    return [(stream, int(s)) for s in seqs]
