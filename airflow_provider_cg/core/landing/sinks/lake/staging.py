"""A lake sink's prepared writes: ``_cg_staging/<gid>/`` holds a write's data files (written
by the driver, or by Spark tasks: ``spark_staging.py``), its input keys (sorted ``origin_seq``
per origin stream, ``keys-<i>.npy``) and, written last, its manifest ``prepared.json`` (rows,
files, keys, message refs, fence, the origin mark). A staging without a manifest is half-prepared; recovery
tells them apart (``lake_sink.py``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import KEYS_DIR, fs_name, npy_bytes, npy_load
from airflow_provider_cg.core.landing.sinks.lake.spark_staging import StagedFiles
from airflow_provider_cg.core.landing.sinks.lake.storage import LocalStorage, Storage
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    Fence,
    PreparedWriteLost,
    SinkError,
    encode_refs,
)
from airflow_provider_cg.core.landing.stream_life import OriginMark

STAGING_DIR = "_cg_staging"
MANIFEST = "prepared.json"


class DataFiles(Protocol):
    """How a sink writes a batch's Parquet files (its compression, partitioning, file size)."""

    def splits_files(self) -> bool:
        """Whether a batch becomes several files (partitioned, or a file size target)."""

    def write_parts(self, table: pa.Table, staging: str, stem: str) -> list[tuple[str, int]]:
        """``table`` as files ``<stem>-<i>.parquet`` in ``staging``: (name, rows) of each."""

    def write_file(self, table: pa.Table, rel: str) -> None:
        """``table`` as the one file ``rel``."""


class StagingArea:
    """The prepared writes under one table's location."""

    def __init__(self, store: Storage) -> None:
        self.store = store
        store.ensure_dir(STAGING_DIR)

    def dir(self, gid: str) -> str:
        return f"{STAGING_DIR}/{fs_name(gid)}"

    def token(self, staging: str) -> str:
        """The prepared write's token: where its staging is (a path, or the object store's URI)."""
        store = self.store
        return str(store.path(staging)) if isinstance(store, LocalStorage) else store.uri(staging)

    def start(self, gid: str, *, staged_by_spark: bool) -> str:
        """The write's staging, new (or, for files Spark staged, still there)."""
        staging = self.dir(gid)
        if staged_by_spark:
            if not self.store.dir_exists(staging):
                raise PreparedWriteLost(f"staging of {gid} was removed while preparing")
            return staging
        try:
            self.store.start_dir(staging)
        except FileExistsError:
            raise SinkError(f"batch {gid} is already prepared") from None
        return staging

    @staticmethod
    def manifest(batch_id: BatchId, *, rows: int, dropped: int, refs: dict, fence: Fence | None,
                 transformed: bool, mark: OriginMark | None = None) -> dict[str, Any]:
        return {
            "v": 1,
            "gid": batch_id.gid,
            "batch": batch_id.to_dict(),
            "rows": rows,
            "dropped": dropped,
            "file": None,
            "files": [],
            "keys": {},
            "refs": encode_refs(refs),
            "fence": fence.to_dict() if fence else None,
            "transformed": transformed,
            "mark": mark.to_list() if mark else None,  # the origin's message this batch read last
            "prepared_at": datetime.now(UTC).isoformat(),
        }

    def write(self, staging: str, table: pa.Table | StagedFiles, keys: dict, manifest: dict,
              files: DataFiles) -> None:
        """The rows' files (unless Spark staged them), the keys, then the manifest
        (FileNotFoundError: a recovering instance removed the staging meanwhile). The files
        before the manifest are each durable when written; the manifest's write then makes
        their names durable with its own (``Storage.write_new``), so a manifest never
        outlives a file it names."""
        if isinstance(table, StagedFiles):
            for name, rows in table.files:
                if not self.store.exists(f"{staging}/{name}"):
                    raise FileNotFoundError(name)
                self.store.make_durable(f"{staging}/{name}")
                manifest["files"].append({"file": name, "rows": rows})
            for sub in sorted({name.rpartition("/")[0] for name, _ in table.files} - {""}):
                self.store.make_durable(f"{staging}/{sub}")  # the names Spark's tasks gave them
            failpoint("mid_prepare")
        elif table.num_rows and files.splits_files():
            manifest["files"] += [{"file": name, "rows": rows}
                                  for name, rows in files.write_parts(table, staging, "part-0")]
            failpoint("mid_prepare")
        elif table.num_rows:
            files.write_file(table, f"{staging}/part-0.parquet")
            failpoint("mid_prepare")
            manifest["file"] = "part-0.parquet"
        if manifest["file"] or manifest["files"] or manifest.get("transformed"):  # a transformation may drop every row
            for i, (stream, sorted_keys) in enumerate(keys.items()):
                name = f"keys-{i}.npy"
                self.store.write_new(f"{staging}/{name}", npy_bytes(sorted_keys))
                manifest["keys"][stream] = {"file": name, "min": int(sorted_keys[0]), "max": int(sorted_keys[-1])}
        if not self.store.dir_exists(staging):  # removed by a recovering instance meanwhile
            raise FileNotFoundError(staging)
        self.store.write(f"{staging}/{MANIFEST}", json.dumps(manifest, separators=(",", ":")).encode())

    def read_manifest(self, staging: str) -> dict:
        """The manifest (FileNotFoundError: not prepared, or gone)."""
        return json.loads(self.store.read(f"{staging}/{MANIFEST}"))

    def is_prepared(self, gid: str) -> bool:
        return self.store.exists(f"{self.dir(gid)}/{MANIFEST}")

    def load(self, gid: str) -> dict:
        """What commit needs of a prepared write: its files with their rows, its keys, counts."""
        staging = self.dir(gid)
        try:
            manifest = self.read_manifest(staging)
        except FileNotFoundError:
            raise PreparedWriteLost(f"no prepared write {gid} (no staging, no commit record)") from None
        key_files = {s: f"{staging}/{info['file']}" for s, info in manifest["keys"].items()}
        keys = {s: npy_load(self.store.read(path)) for s, path in key_files.items()}
        files = [(f"{staging}/{f['file']}", f["rows"]) for f in manifest.get("files") or ()]
        if manifest["file"]:
            files.append((f"{staging}/{manifest['file']}", manifest["rows"] - manifest["dropped"]))
        return {
            "files": files,
            "keys": keys,
            "key_files": key_files,  # the staged keys files, while ``keys`` are theirs
            "dups": manifest["dropped"],
            "rows": manifest["rows"] - manifest["dropped"],
            "transformed": bool(manifest.get("transformed")),
            "mark": manifest.get("mark"),
        }

    def inputs(self, gid: str) -> tuple[bool, dict[str, np.ndarray], dict]:
        """(transformed, input keys per origin stream, the acking record's ``streams``) of a
        prepared write (FileNotFoundError: gone)."""
        staging = self.dir(gid)
        manifest = self.read_manifest(staging)
        keys, streams = {}, {}
        for stream, info in manifest["keys"].items():
            path = f"{staging}/{info['file']}"
            keys[stream] = npy_load(self.store.read(path))
            streams[stream] = {"min": info["min"], "max": info["max"], "keys": path}
        return bool(manifest.get("transformed")), keys, streams

    def drop(self, gid: str) -> None:
        """The write's staging and the keys its commit record may have written."""
        self.store.delete_tree(self.dir(gid))
        self.store.delete_tree(f"{KEYS_DIR}/{fs_name(gid)}")
