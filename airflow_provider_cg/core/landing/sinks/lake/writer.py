"""A Parquet dataset directory: the lake protocol (``lake_sink.py``) publishing into ``data/``.

Layout of a dataset directory ``root``: the protocol's ``_cg_*`` folders (``lake_sink.py``) and::

    data/part-<uid>-b<batch>-<rand>-<i>.parquet committed files (read this directory)

Publishing hard-links a committed record's staged files into ``data/``, then drops the
staging. The commit log is the source of truth: ``read_committed(root)`` returns exactly the
committed rows. A plain reader of ``root/data`` (``pyarrow.parquet.read_table``,
``spark.read.parquet``) never sees staged, aborted or duplicate rows, because a file enters
``data/`` only after its commit record exists and files there are never changed; but it is
not transactional: a batch staged by Spark as several files is linked one file at a time, so
a plain reader can see part of a batch for a moment (or until ``recover()`` rolls it forward
if the committer died in between). Readers that need whole batches only use
``read_committed``, or the Delta and Iceberg sinks, whose readers see whole batches only.
Files written with an extra column and files without it coexist: read with
``spark.read.option("mergeSchema", "true")``; ``read_committed`` unifies schemas itself.
pyarrow skips ``_``-prefixed directories, so ``pq.read_table(root)`` is safe too.

A batch computed by Spark (``LakeSink.stage``) is written by Spark tasks into its staging
directory, in files of at most ``target_file_size``, so on a cluster the dataset must be
mounted at the same path on the driver and every executor. Requires a POSIX filesystem with atomic ``link`` (local disk, NFSv3+), not an object
store (use the Delta or Iceberg sink there).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_provider_cg.core.landing.sinks.lake.lake_sink import LakeSink
from airflow_provider_cg.core.landing.sinks.lake.storage import LocalStorage

DATA_DIR = "data"

__all__ = ["DATA_DIR", "ParquetLakeSink"]


class ParquetLakeSink(LakeSink):
    """Two-phase sink into a Parquet dataset directory; see the module docstring.

    ``fsync=False`` skips fsync calls (tests only: a power loss could lose prepared writes).
    """

    DATA_PREFIX = DATA_DIR + "/"
    KEEPS_FILES = True

    def __init__(self, path: str | os.PathLike, *, compression: str = "snappy", fsync: bool = True,
                 checkpoint_interval: int = 100, key_cache_size: int = 16,
                 target_file_size: int | None = None) -> None:
        store = LocalStorage(path, fsync=fsync)
        store.ensure_dir(DATA_DIR)
        super().__init__(store, compression=compression, checkpoint_interval=checkpoint_interval,
                         key_cache_size=key_cache_size, target_file_size=target_file_size)
        self.root = store.root
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"ParquetLakeSink({str(self.root)!r})"

    @property
    def data_path(self) -> Path:
        """The directory plain readers read."""
        return self.root / DATA_DIR

    def publish(self, record: dict) -> None:
        """Link a committed record's files into data/, then drop its staging."""
        self.copy_files(record)
        self.store.delete_tree(self.staging(record["gid"]))
