"""Two-phase sinks: prepare durably, ack in NATS, then commit; deduplicated by origin key.

``PostgresSink`` imports psycopg2 only when used.
"""

from airflow_provider_cg.core.landing.sinks.base import (
    CommitResult,
    Fence,
    FencedOut,
    InputsTaken,
    PreparedWrite,
    PreparedWriteLost,
    SinkError,
    SinkLockTimeout,
    TwoPhaseSink,
    WriteState,
)
from airflow_provider_cg.core.landing.sinks.parquet import (
    DatasetCorrupt,
    ParquetLakeSink,
    committed_files,
    read_committed,
)
from airflow_provider_cg.core.landing.sinks.postgres import PostgresSink

__all__ = [
    "CommitResult",
    "DatasetCorrupt",
    "Fence",
    "FencedOut",
    "InputsTaken",
    "ParquetLakeSink",
    "PostgresSink",
    "PreparedWrite",
    "PreparedWriteLost",
    "SinkError",
    "SinkLockTimeout",
    "TwoPhaseSink",
    "WriteState",
    "committed_files",
    "read_committed",
]
