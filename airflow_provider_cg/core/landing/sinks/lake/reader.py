"""Reading a Parquet dataset as its commit log says: exactly the committed rows, whole batches
only (a plain reader of ``data/`` can see part of a batch while it is being published)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.sinks.lake.lake_sink import STORED_SCHEMA, DatasetCorrupt
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import CommitLog
from airflow_provider_cg.core.landing.sinks.lake.storage import LocalStorage

__all__ = ["committed_files", "read_committed"]


def committed_files(path: str | os.PathLike) -> list[Path]:
    """Committed data files of a dataset, in commit order (published path, else staged path)."""
    root = Path(path)
    log = CommitLog(LocalStorage(root, create=False))
    log.refresh()
    out = []
    for f in log.committed_files():
        for rel in (f["path"], f["staged"]):
            if (root / rel).exists():
                out.append(root / rel)
                break
        else:
            raise DatasetCorrupt(f"committed file {f['path']} is missing")
    return out


def read_committed(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """Exactly the committed rows of a dataset, trusting only its commit log.

    Schemas of the files are unified (a column absent from some files reads as null)."""
    files = committed_files(path)
    if not files:
        schema = STORED_SCHEMA
        table = schema.empty_table()
        return table.select(columns) if columns else table
    schema = pa.unify_schemas([pq.read_schema(f) for f in files])
    import pyarrow.dataset as ds  # here: pyarrow.dataset imports pandas, which a member job never needs

    dataset = ds.dataset([str(f) for f in files], schema=schema, format="parquet")
    return dataset.to_table(columns=columns)
