"""Two-phase sinks: prepare durably, ack in NATS, then commit; deduplicated by origin key.

Each sink is declared in ``kinds/`` and registered in ``registry.py``. The names below are
imported on first use, so that what asks only the registry (the contract in Airflow's
scheduler, ``cg``) loads no table library.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    **dict.fromkeys(("CommitResult", "Fence", "FencedOut", "InputsTaken", "PreparedWrite", "PreparedWriteLost",
                     "SinkError", "SinkLockTimeout", "TwoPhaseSink", "WriteState"), "base"),
    **dict.fromkeys(("DatasetCorrupt", "ParquetLakeSink", "committed_files", "read_committed"), "parquet"),
    "PostgresSink": "postgres",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
