"""Two-phase sinks: prepare durably, ack in NATS, then commit; deduplicated by origin key.

One subpackage per family (``lake``: the Parquet dataset and what Delta and Iceberg share of it;
``delta``; ``iceberg``; ``postgres``), each with its declaration, writer and what reads it;
``shared`` beneath them all; above them the registry, the options, opening, routing and
maintenance. The names below are imported on first use, so that what asks only the registry
(the contract in Airflow's scheduler, ``cg``) loads no table library.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    **dict.fromkeys(("CommitResult", "Fence", "FencedOut", "InputsTaken", "PreparedWrite", "PreparedWriteLost",
                     "SinkError", "SinkLockTimeout", "TwoPhaseSink", "WriteState"), "shared.two_phase_sink"),
    "DatasetCorrupt": "lake.lake_sink",
    "ParquetLakeSink": "lake.writer",
    **dict.fromkeys(("committed_files", "read_committed"), "lake.reader"),
    "PostgresSink": "postgres.writer",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
