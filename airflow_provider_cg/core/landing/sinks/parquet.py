"""A Parquet lake whose committed content is an append-only commit log.

Layout of a dataset directory ``root``::

    data/part-<uid>-b<batch>-<rand>.parquet     committed files (read this directory)
    _cg_log/00000000000000000001.json           commit log: one record per position
    _cg_log/00000000000000000100.checkpoint.json   every 100 positions: all records so far
    _cg_keys/<gid>/<rand>-<i>.npy               sorted origin_seq per origin stream, per commit
    _cg_staging/<gid>/part-0.parquet, keys-<i>.npy, prepared.json, acking   prepared writes
    _cg_staging/<gid>/spark/part-*.parquet      a batch's files written by Spark tasks (``stage``)
    _cg_tmp/                                    temp files (same filesystem, for atomic links)

Protocol. ``prepare`` writes the rows (minus in-batch duplicates and keys already
committed), the sorted keys and a ``prepared.json`` manifest with the message refs into
``_cg_staging/<gid>/`` and fsyncs them; ``mark_acking`` claims an ``acking`` log record
(older versions wrote an ``acking`` file, still honoured by ``recover``), and recovery's
``abort_unless_acking`` aborts only if no ``acking`` record precedes its ``abort`` record.
``fence`` claims a ``fence`` record (owner of some partitions of a group); ``mark_acking`` of
a fenced write claims its ``acking`` record only if the latest fence of each of its
partitions, in the log before that position, names the write's owner.
``commit`` re-reads the log, drops rows whose key is in an earlier commit (only commits whose
per-stream seq range overlaps are looked at; the staged file is rewritten if any row goes),
then claims the next log position by hard-linking a complete record file to
``_cg_log/<pos>.json`` -- ``link`` fails if the name exists, so exactly one writer wins each
position, and a record is never seen half-written. A loser re-reads the new records, re-checks
duplicates against them and retries. ``abort`` claims a position with an abort record, so the
first of commit/abort wins for good. Only after its record is durable is a data file
hard-linked into ``data/`` (publish), then the staging directory is removed.

Guarantees. The log is the source of truth; ``read_committed(root)`` returns exactly the
committed rows. A plain reader of ``root/data`` (``pyarrow.parquet.read_table``,
``spark.read.parquet``) never sees staged, aborted or duplicate rows, because a file enters
``data/`` only after its commit record exists and files there are never changed. It can
miss a committed file for the moment between the record and the link, or until ``recover()``
(any member's) rolls it forward if the committer died in that window. Files written with an
extra column (e.g. ``value``) and files without it coexist: read with
``spark.read.option("mergeSchema", "true")``; ``read_committed`` unifies schemas itself.
pyarrow skips ``_``-prefixed directories, so ``pq.read_table(root)`` is safe too (Spark
needs ``root/data``).
A batch computed by Spark (``stage``) is written by Spark tasks into its staging directory,
so on a cluster the dataset must be mounted at the same path on the driver and every
executor. Requires a POSIX filesystem with atomic ``link``/``rename`` (local disk, NFSv3+);
not an object store. Log records and key files are never compacted (checkpoints keep opening a
dataset fast); a commit reads only the key files of commits whose seq range overlaps its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.failpoints import failpoint
from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, BatchId
from airflow_provider_cg.core.landing.sinks.base import (
    CommitResult,
    Fence,
    FencedOut,
    MessageRefs,
    PreparedWrite,
    PreparedWriteLost,
    SinkError,
    TwoPhaseSink,
    WriteState,
    conform_table,
    decode_refs,
    encode_refs,
    first_occurrence_mask,
    isin_sorted,
    keys_by_stream,
    normalize_refs,
    recovered_by,
    sorted_unique,
)

DATA_DIR = "data"
LOG_DIR = "_cg_log"
KEYS_DIR = "_cg_keys"
STAGING_DIR = "_cg_staging"
TMP_DIR = "_cg_tmp"
MANIFEST = "prepared.json"
SPARK_DIR = "spark"  # inside a write's staging directory: the files Spark tasks wrote
CHECKPOINT_SUFFIX = ".checkpoint.json"
_DICT_COLUMNS = ["origin_stream", "subject", "key", "group", "member", "headers"]
_STATS_COLUMNS = [
    "origin_stream",
    "origin_seq",
    "subject",
    "partition",
    "key",
    "timestamp",
    "group",
    "member",
]

STORED_SCHEMA = pa.schema(
    [f.with_type(pa.timestamp("us", tz="UTC")) if f.name == "timestamp" else f for f in ROW_SCHEMA]
)
"""``ROW_SCHEMA`` as stored in Parquet files (microsecond timestamps, readable by Spark)."""


log = logging.getLogger(__name__)


class DatasetCorrupt(SinkError):
    """The commit log references a file that is neither published nor staged."""


def _fs_name(gid: str) -> str:
    return quote(gid, safe="")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pos_name(pos: int) -> str:
    return f"{pos:020d}.json"


@dataclass
class _StreamIndex:
    """Per origin stream: seq range and key file of each commit, for overlap queries."""

    mins: list[int] = field(default_factory=list)
    maxs: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, lo: int, hi: int, pos: int, keys: str) -> None:
        self.mins.append(lo)
        self.maxs.append(hi)
        self.positions.append(pos)
        self.keys.append(keys)
        self._arrays = None

    def overlapping(self, lo: int, hi: int, after_pos: int) -> list[str]:
        if self._arrays is None or len(self._arrays[0]) != len(self.mins):
            self._arrays = (np.asarray(self.mins), np.asarray(self.maxs), np.asarray(self.positions))
        mins, maxs, positions = self._arrays
        hit = (mins <= hi) & (maxs >= lo) & (positions > after_pos)
        return [self.keys[i] for i in np.nonzero(hit)[0]]


class _CommitLog:
    """Reads (incrementally) and appends the commit log of one dataset."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self.log_dir = root / LOG_DIR
        self.fsync = fsync
        self.pos = 0
        self.records: list[dict] = []
        self.commits: dict[str, dict] = {}
        self.aborts: set[str] = set()
        self.acking: set[str] = set()  # gids with an "acking" record before any abort record
        self.fences: dict[tuple[str, str, int], str] = {}  # (stream, group, partition) -> owner
        self.index: dict[str, _StreamIndex] = {}
        self._loaded = False

    def _apply(self, pos: int, record: dict) -> None:
        record["pos"] = pos
        self.pos = pos
        self.records.append(record)
        if record["op"] == "fence":
            for p in record["partitions"]:
                self.fences[(record["stream"], record["group"], p)] = record["owner"]
            return
        gid = record["gid"]
        if gid in self.commits or gid in self.aborts:
            return  # cannot happen with the claim protocol; first record wins
        if record["op"] == "commit":
            self.commits[gid] = record
            for stream, info in record.get("streams", {}).items():
                self.index.setdefault(stream, _StreamIndex()).add(info["min"], info["max"], pos, info["keys"])
        elif record["op"] == "abort":
            self.aborts.add(gid)
        elif record["op"] == "acking":
            self.acking.add(gid)

    def _load_checkpoint(self) -> None:
        try:
            names = os.listdir(self.log_dir)
        except FileNotFoundError:
            return
        checkpoints = sorted(n for n in names if n.endswith(CHECKPOINT_SUFFIX))
        for name in reversed(checkpoints):
            try:
                data = json.loads((self.log_dir / name).read_bytes())
            except (OSError, ValueError):
                continue
            for record in data["records"]:
                self._apply(record.pop("pos"), record)
            return

    def refresh(self) -> None:
        """Read records after the last one seen (positions are contiguous)."""
        if not self._loaded:
            self._loaded = True
            self._load_checkpoint()
        while True:
            path = self.log_dir / _pos_name(self.pos + 1)
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                return
            try:
                record = json.loads(raw)
            except ValueError as exc:
                raise DatasetCorrupt(f"commit log record {path.name} is not valid JSON: {exc}") from None
            self._apply(self.pos + 1, record)

    def claim(self, record: dict, tmp_dir: Path) -> int:
        """Write ``record`` at the next position; raises FileExistsError when another writer won."""
        pos = self.pos + 1
        tmp = tmp_dir / f"log-{secrets.token_hex(8)}.json"
        body = json.dumps(record, separators=(",", ":")).encode()
        with open(tmp, "wb") as fh:
            fh.write(body)
            if self.fsync:
                os.fsync(fh.fileno())
        try:
            os.link(tmp, self.log_dir / _pos_name(pos))
        finally:
            tmp.unlink()
        if self.fsync:
            _fsync_dir(self.log_dir)
        self._apply(pos, dict(record))
        return pos

    def write_checkpoint(self, tmp_dir: Path) -> None:
        tmp = tmp_dir / f"ckpt-{secrets.token_hex(8)}.json"
        tmp.write_text(json.dumps({"pos": self.pos, "records": self.records}, separators=(",", ":")))
        os.replace(tmp, self.log_dir / f"{self.pos:020d}{CHECKPOINT_SUFFIX}")

    def committed_files(self) -> list[dict]:
        return [f for r in self.records if r["op"] == "commit" for f in r["files"]]


@dataclass(frozen=True)
class StagedFiles:
    """A batch's output written by Spark tasks into its staging directory (``stage``)."""

    gid: str
    #: (path relative to the staging directory, rows) of each non-empty part file
    files: tuple[tuple[str, int], ...]


class ParquetLakeSink(TwoPhaseSink):
    """Two-phase sink into a Parquet dataset directory; see the module docstring.

    Thread-safe; any number of processes may commit into the same directory.
    ``fsync=False`` skips fsync calls (tests only: a power loss could lose prepared writes).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        compression: str = "snappy",
        fsync: bool = True,
        checkpoint_interval: int = 100,
        key_cache_size: int = 16,
    ) -> None:
        self.root = Path(path)
        self.compression = compression
        self.fsync = fsync
        self.checkpoint_interval = checkpoint_interval
        for sub in (DATA_DIR, LOG_DIR, KEYS_DIR, STAGING_DIR, TMP_DIR):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._log = _CommitLog(self.root, fsync=fsync)
        self._lock = threading.RLock()
        self._key_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._key_cache_size = key_cache_size

    def __repr__(self) -> str:
        return f"ParquetLakeSink({str(self.root)!r})"

    @property
    def data_path(self) -> Path:
        """The directory plain readers read."""
        return self.root / DATA_DIR

    # -- prepare --------------------------------------------------------------------------------

    def fence(self, stream: str, group: str, fence: Fence) -> None:
        record = {"v": 1, "op": "fence", "stream": stream, "group": group, **fence.to_dict()}
        with self._lock:
            while True:
                self._log.refresh()
                try:
                    self._claim(record)
                    return
                except FileExistsError:
                    continue  # another writer took the position: try the next one

    def _claim(self, record: dict) -> int:
        """Claim the next log position for ``record`` (FileExistsError: re-read and retry)."""
        pos = self._log.claim(record, self.root / TMP_DIR)
        if self.checkpoint_interval and pos % self.checkpoint_interval == 0:
            self._log.write_checkpoint(self.root / TMP_DIR)
        return pos

    def _fenced_out(self, prepared: PreparedWrite) -> list[int]:
        """Partitions of the write's fence that the log says another owner fenced since."""
        f = prepared.fence
        if f is None:
            return []
        b = prepared.batch_id
        return [p for p in f.partitions if self._log.fences.get((b.stream, b.group, p)) != f.owner]

    def stage(self, batch_id: BatchId, frame) -> StagedFiles:
        """Spark tasks write the DataFrame ``frame`` into the write's staging directory (the
        driver writes only the manifest and keys in ``prepare``)."""
        staging = self.root / STAGING_DIR / _fs_name(batch_id.gid)
        try:
            staging.mkdir()
        except FileExistsError:
            raise SinkError(f"batch {batch_id.gid} is already prepared") from None
        out = staging / SPARK_DIR
        try:
            # a plain file: path (Hadoop's Path escapes it itself; a URI's %-escapes would be doubled)
            frame.write.option("compression", self.compression).parquet("file://" + os.path.abspath(out))
        except Exception:
            if not staging.exists():  # a recovering instance removed it: we are no longer the holder
                raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while Spark wrote it") from None
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if not (out / "_SUCCESS").exists():  # Spark wrote somewhere else: never commit an empty batch for it
            shutil.rmtree(staging, ignore_errors=True)
            raise SinkError(f"Spark's output for {batch_id.gid} is not in {out} (is the lake on a filesystem "
                            "mounted at the same path on the driver and the executors?)")
        files = []
        for f in sorted(out.glob("part-*.parquet")):
            rows = pq.read_metadata(f).num_rows
            if rows:
                files.append((f"{SPARK_DIR}/{f.name}", rows))
        return StagedFiles(batch_id.gid, tuple(files))

    def discard(self, staged) -> None:
        if isinstance(staged, StagedFiles):
            shutil.rmtree(self.root / STAGING_DIR / _fs_name(staged.gid), ignore_errors=True)

    def prepare(self, batch_id: BatchId, table: pa.Table | StagedFiles, *, message_refs: MessageRefs,
                fence: Fence | None = None, input_keys: dict[str, np.ndarray] | None = None) -> PreparedWrite:
        refs = normalize_refs(message_refs)
        transformed = input_keys is not None
        staged = isinstance(table, StagedFiles)
        if staged and (not transformed or table.gid != batch_id.gid):
            raise SinkError("files staged by Spark are prepared with their batch's input keys")
        if transformed:
            # a transformation's output (any columns, any number of rows per message): the
            # batch's input keys are what is recorded as committed
            if not staged and not isinstance(table, pa.Table):
                raise SinkError(f"expected a pyarrow.Table, got {type(table).__name__}")
            rows_in = sum(n for _, n in table.files) if staged else table.num_rows
            keys = {s: sorted_unique(np.asarray(q, dtype=np.int64)) for s, q in input_keys.items() if len(q)}
        else:
            table = conform_table(table)
            rows_in = table.num_rows
            keep = first_occurrence_mask(table)
            if keep is not None:
                table = table.filter(pa.array(keep))
            keys = {s: np.sort(q) for s, q in keys_by_stream(table).items()}
            # drop rows committed already (redeliveries) now, so commit rarely has to rewrite
            with self._lock:
                self._log.refresh()
                masks = self._dup_masks(keys, 0)
            if masks:
                table, keys = _without(table, keys, masks)
        staging = self.root / STAGING_DIR / _fs_name(batch_id.gid)
        if staged:
            if not staging.is_dir():
                raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while preparing")
        else:
            try:
                staging.mkdir()
            except FileExistsError:
                raise SinkError(f"batch {batch_id.gid} is already prepared") from None
        manifest = {
            "v": 1,
            "gid": batch_id.gid,
            "batch": batch_id.to_dict(),
            "rows": rows_in,
            "dropped": 0 if staged else rows_in - table.num_rows,
            "file": None,
            "files": [],
            "keys": {},
            "refs": encode_refs(refs),
            "fence": fence.to_dict() if fence else None,
            "transformed": transformed,
            "prepared_at": datetime.now(UTC).isoformat(),
        }
        try:
            self._write_staging(staging, table, keys, manifest)
        except FileNotFoundError:
            # A recovering instance of the member removed this half-prepared staging: this
            # instance stalled mid-prepare and is no longer the pin holder.
            raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while preparing") from None
        return PreparedWrite(batch_id=batch_id, rows=rows_in, refs=refs, token=str(staging), fence=fence)

    def _write_staging(self, staging: Path, table: pa.Table | StagedFiles, keys: dict, manifest: dict) -> None:
        written: list[Path] = []
        if isinstance(table, StagedFiles):
            for name, rows in table.files:
                if not (staging / name).exists():
                    raise FileNotFoundError(name)
                written.append(staging / name)
                manifest["files"].append({"file": name, "rows": rows})
            failpoint("mid_prepare")
        elif table.num_rows:
            data_file = staging / "part-0.parquet"
            self._write_parquet(table, data_file)
            written.append(data_file)
            failpoint("mid_prepare")
            manifest["file"] = data_file.name
        if manifest["file"] or manifest["files"] or manifest.get("transformed"):  # a transformation may drop every row
            for i, (stream, sorted_keys) in enumerate(keys.items()):
                key_file = staging / f"keys-{i}.npy"
                np.save(key_file, sorted_keys, allow_pickle=False)
                written.append(key_file)
                manifest["keys"][stream] = {
                    "file": key_file.name,
                    "min": int(sorted_keys[0]),
                    "max": int(sorted_keys[-1]),
                }
        tmp = staging / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, separators=(",", ":")))
        written.append(tmp)
        if self.fsync:
            for path in written:
                _fsync_file(path)
        os.replace(tmp, staging / MANIFEST)
        if self.fsync:
            _fsync_dir(staging)
            _fsync_dir(staging.parent)

    def _write_parquet(self, table: pa.Table, path: Path) -> None:
        names = set(table.column_names)
        pq.write_table(
            table,
            path,
            compression=self.compression,
            use_dictionary=[c for c in _DICT_COLUMNS if c in names],
            write_statistics=[c for c in _STATS_COLUMNS if c in names],
            coerce_timestamps="us",
            allow_truncated_timestamps=True,
        )

    # -- commit ---------------------------------------------------------------------------------

    def commit(self, prepared: PreparedWrite) -> CommitResult:
        gid = prepared.gid
        fs = _fs_name(gid)
        staging = self.root / STAGING_DIR / fs
        with self._lock:
            checked_pos = 0
            current: dict | None = None  # {"file": Path | None, "keys": {stream: array}, "dups": int}
            while True:
                self._log.refresh()
                record = self._log.commits.get(gid)
                if record is not None:
                    self._publish(record)
                    return CommitResult(record["rows_written"], record["duplicates_skipped"])
                if gid in self._log.aborts:
                    raise PreparedWriteLost(f"prepared write {gid} was aborted")
                try:
                    if current is None:
                        current = self._load_staged(staging, gid)
                    current = self._drop_committed(current, staging, checked_pos)
                    checked_pos = self._log.pos
                    record = self._commit_record(prepared.batch_id, current, staging, fs)
                except FileNotFoundError:
                    self._log.refresh()
                    if gid in self._log.commits or gid in self._log.aborts:
                        continue
                    raise PreparedWriteLost(f"staging of {gid} vanished while committing") from None
                try:
                    pos = self._log.claim(record, self.root / TMP_DIR)
                except FileExistsError:
                    continue  # another writer took the position: re-read and re-check
                self._publish(record)
                if self.checkpoint_interval and pos % self.checkpoint_interval == 0:
                    self._log.write_checkpoint(self.root / TMP_DIR)
                return CommitResult(record["rows_written"], record["duplicates_skipped"])

    def _load_staged(self, staging: Path, gid: str) -> dict:
        try:
            manifest = json.loads((staging / MANIFEST).read_bytes())
        except FileNotFoundError:
            raise PreparedWriteLost(f"no prepared write {gid} (no staging, no commit record)") from None
        keys = {s: np.load(staging / info["file"]) for s, info in manifest["keys"].items()}
        files = [(staging / f["file"], f["rows"]) for f in manifest.get("files") or ()]
        if manifest["file"]:
            files.append((staging / manifest["file"], manifest["rows"] - manifest["dropped"]))
        return {
            "files": files,
            "keys": keys,
            "dups": manifest["dropped"],
            "rows": manifest["rows"] - manifest["dropped"],
            "transformed": bool(manifest.get("transformed")),
        }

    def _dup_masks(self, keys: dict[str, np.ndarray], after_pos: int) -> dict[str, np.ndarray]:
        """For each stream with duplicates: mask over its sorted keys of those already committed."""
        out = {}
        for stream, seqs in keys.items():
            index = self._log.index.get(stream)
            if index is None or len(seqs) == 0:
                continue
            mask = None
            for key_path in index.overlapping(int(seqs[0]), int(seqs[-1]), after_pos):
                committed = self._load_keys(key_path)
                lo = int(np.searchsorted(seqs, committed[0], side="left"))
                hi = int(np.searchsorted(seqs, committed[-1], side="right"))
                if lo >= hi:
                    continue
                part = isin_sorted(seqs[lo:hi], committed)
                if part.any():
                    if mask is None:
                        mask = np.zeros(len(seqs), dtype=bool)
                    mask[lo:hi] |= part
            if mask is not None:
                out[stream] = mask
        return out

    def _drop_committed(self, current: dict, staging: Path, after_pos: int) -> dict:
        masks = self._dup_masks(current["keys"], after_pos)
        if not masks:
            return current
        if current.get("transformed"):
            # Another writer committed some of these inputs since this batch was prepared (a
            # concurrent backfill of the same window): the output cannot be split per input;
            # it is committed, and those inputs' effect lands twice. Logged, not hidden.
            n = int(sum(m.sum() for m in masks.values()))
            log.warning("cg parquet sink: %d inputs of a transformed batch were committed meanwhile by "
                        "another writer; their effect is in both batches", n)
            keys = {s: (k[~masks[s]] if s in masks else k) for s, k in current["keys"].items()}
            return {**current, "keys": {s: k for s, k in keys.items() if len(k)}}
        (staged_file, _), = current["files"]  # a batch of rows (not transformed) is one file
        before = pq.read_table(staged_file)
        table, keys = _without(before, current["keys"], masks)
        new_file = None
        if table.num_rows:
            new_file = staging / f"part-{secrets.token_hex(4)}.parquet"
            self._write_parquet(table, new_file)
            if self.fsync:
                _fsync_file(new_file)
        dropped = before.num_rows - table.num_rows
        return {
            "files": [(new_file, table.num_rows)] if new_file else [],
            "keys": keys,
            "dups": current["dups"] + dropped,
            "rows": current["rows"] - dropped,
        }

    def _commit_record(self, batch_id: BatchId, current: dict, staging: Path, fs: str) -> dict:
        keys_dir = self.root / KEYS_DIR / fs
        keys_dir.mkdir(exist_ok=True)
        tag = secrets.token_hex(4)
        streams = {}
        for i, (stream, keys) in enumerate(current["keys"].items()):
            key_path = keys_dir / f"{tag}-{i}.npy"
            np.save(key_path, keys, allow_pickle=False)
            if self.fsync:
                _fsync_file(key_path)
            streams[stream] = {
                "min": int(keys[0]),
                "max": int(keys[-1]),
                "count": len(keys),
                "keys": str(key_path.relative_to(self.root)),
            }
        if self.fsync:
            _fsync_dir(keys_dir)
        files = []
        for i, (staged_file, rows) in enumerate(current["files"]):
            name = f"part-{batch_id.uid}-b{batch_id.batch_seq}-{tag}{f'-{i}' if i else ''}.parquet"
            files.append({"path": f"{DATA_DIR}/{name}", "staged": str(Path(staged_file).relative_to(self.root)),
                          "rows": rows})
        return {
            "v": 1,
            "op": "commit",
            "gid": batch_id.gid,
            "batch": batch_id.to_dict(),
            "rows_written": current["rows"],
            "duplicates_skipped": current["dups"],
            "files": files,
            "streams": streams,
            "committed_at": datetime.now(UTC).isoformat(),
        }

    def _load_keys(self, rel: str) -> np.ndarray:
        arr = self._key_cache.get(rel)
        if arr is None:
            arr = np.load(self.root / rel)
            self._key_cache[rel] = arr
            while len(self._key_cache) > self._key_cache_size:
                self._key_cache.popitem(last=False)
        else:
            self._key_cache.move_to_end(rel)
        return arr

    def _publish(self, record: dict) -> None:
        """Roll a committed record forward: link its files into data/, drop its staging."""
        linked = False
        for f in record["files"]:
            target = self.root / f["path"]
            if target.exists():
                continue
            try:
                os.link(self.root / f["staged"], target)
                linked = True
            except FileExistsError:
                pass
            except FileNotFoundError:
                if not target.exists():
                    raise DatasetCorrupt(
                        f"committed file {f['path']} is missing (gid {record['gid']})"
                    ) from None
        if linked and self.fsync:
            _fsync_dir(self.root / DATA_DIR)
        shutil.rmtree(self.root / STAGING_DIR / _fs_name(record["gid"]), ignore_errors=True)

    def mark_acking(self, prepared: PreparedWrite) -> PreparedWrite:
        """Claim an ``acking`` log record. The log orders it against an ``abort`` record of
        ``abort_unless_acking`` and against ``fence`` records: a claim only succeeds at the
        position after the last record the claimer has read, so whichever is claimed first
        wins."""
        gid = prepared.gid
        with self._lock:
            while True:
                self._log.refresh()
                if gid in self._log.aborts:
                    raise PreparedWriteLost(f"prepared write {gid} was aborted")
                if gid in self._log.commits or gid in self._log.acking:
                    return dataclasses.replace(prepared, acking=True)
                if not (self.root / STAGING_DIR / _fs_name(gid) / MANIFEST).exists():
                    raise PreparedWriteLost(f"prepared write {gid} is gone")
                lost = self._fenced_out(prepared)
                if lost:
                    raise FencedOut(f"prepared write {gid}: partitions {lost} were fenced by another instance")
                try:
                    self._claim({"v": 1, "op": "acking", "gid": gid})
                except FileExistsError:
                    continue  # another writer took the position: re-read (maybe an abort or a fence)
                return dataclasses.replace(prepared, acking=True)

    # -- abort / state / recover ----------------------------------------------------------------

    def abort(self, prepared: PreparedWrite) -> WriteState:
        return self._abort_gid(prepared.gid, unless_acking=False)

    def abort_unless_acking(self, prepared: PreparedWrite) -> WriteState:
        return self._abort_gid(prepared.gid, unless_acking=True)

    def _abort_gid(self, gid: str, *, unless_acking: bool) -> WriteState:
        with self._lock:
            while True:
                self._log.refresh()
                if gid in self._log.commits:
                    self._publish(self._log.commits[gid])
                    return WriteState.COMMITTED
                if gid not in self._log.aborts:
                    if unless_acking and gid in self._log.acking:
                        return WriteState.PREPARED  # mark_acking won: the caller commits
                    if not self._claim_abort(gid):
                        continue
                self._drop_staging(gid)
                return WriteState.ABORTED

    def _claim_abort(self, gid: str) -> bool:
        """Claim an ``abort`` log record; False if another writer took the position (re-read)."""
        try:
            self._claim({"v": 1, "op": "abort", "gid": gid})
        except FileExistsError:
            return False
        return True

    def _drop_staging(self, gid: str) -> None:
        shutil.rmtree(self.root / STAGING_DIR / _fs_name(gid), ignore_errors=True)
        shutil.rmtree(self.root / KEYS_DIR / _fs_name(gid), ignore_errors=True)

    def state(self, prepared: PreparedWrite) -> WriteState:
        gid = prepared.gid
        with self._lock:
            self._log.refresh()
            if gid in self._log.commits:
                return WriteState.COMMITTED
            if gid in self._log.aborts:
                return WriteState.ABORTED
        if (self.root / STAGING_DIR / _fs_name(gid) / MANIFEST).exists():
            return WriteState.PREPARED
        return WriteState.ABORTED

    def recover(self, stream: str, group: str, member: str, partitions: Iterable[int] = ()) -> list[PreparedWrite]:
        """Prepared writes this caller must finish (see ``recovered_by``). Also rolls forward
        every committed-but-unpublished write (of any member), deletes aborted staging and this
        member's half-prepared staging (another member's finishes its manifest, or is fenced)."""
        own = _fs_name(BatchId.member_prefix(stream, group, member))
        same_group = _fs_name(BatchId.group_prefix(stream, group))
        fenced = frozenset(int(p) for p in partitions)
        found: list[tuple[str, PreparedWrite]] = []
        with self._lock:
            self._log.refresh()
            for name in sorted(os.listdir(self.root / STAGING_DIR)):
                gid = unquote(name)
                path = self.root / STAGING_DIR / name
                if gid in self._log.commits:
                    self._publish(self._log.commits[gid])
                elif gid in self._log.aborts:
                    shutil.rmtree(path, ignore_errors=True)
                elif name.startswith(same_group):
                    try:
                        manifest = json.loads((path / MANIFEST).read_bytes())
                    except FileNotFoundError:
                        if not name.startswith(own):
                            continue
                        # Half-prepared: its writer died or stalled before the manifest. Log
                        # an abort first, so a stalled writer that finishes its manifest later
                        # cannot claim ``acking`` (and the abort loses if it already has).
                        if self._abort_gid(gid, unless_acking=True) is not WriteState.PREPARED:
                            continue
                        manifest = json.loads((path / MANIFEST).read_bytes())
                    batch = BatchId(**manifest["batch"])
                    fence = Fence.from_dict(manifest.get("fence"))
                    if not recovered_by(batch, fence, stream, group, member, fenced):
                        continue
                    found.append((manifest.get("prepared_at", ""), PreparedWrite(
                        batch,
                        manifest["rows"],
                        decode_refs(manifest["refs"]),
                        token=str(path),
                        acking=gid in self._log.acking,
                        fence=fence,
                    )))
            self._clean_tmp()
        # oldest first: a partition's earlier writes land before its later ones
        return [w for _, w in sorted(found, key=lambda t: (t[0], t[1].batch_id.batch_seq))]

    def _clean_tmp(self, max_age_s: float = 3600.0) -> None:
        cutoff = time.time() - max_age_s
        for entry in os.scandir(self.root / TMP_DIR):
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def committed_keys_exist(self, origin_stream: str, seqs: Iterable[int]) -> np.ndarray:
        values = np.asarray(list(seqs) if not isinstance(seqs, np.ndarray) else seqs, dtype=np.int64)
        uniq = sorted_unique(values)
        with self._lock:
            self._log.refresh()
            mask = self._dup_masks({origin_stream: uniq}, 0).get(origin_stream)
        if mask is None:
            return np.zeros(len(values), dtype=bool)
        return isin_sorted(values, uniq[mask])


def _without(
    table: pa.Table, keys: dict[str, np.ndarray], masks: dict[str, np.ndarray]
) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Drop the rows whose key is masked in ``masks`` (per stream, over its sorted ``keys``)."""
    streams = table.column("origin_stream")
    seqs = table.column("origin_seq").to_numpy()
    single = len(keys) == 1
    drop = np.zeros(table.num_rows, dtype=bool)
    for stream, mask in masks.items():
        hit = isin_sorted(seqs, keys[stream][mask])
        if not single:
            hit &= pc.equal(streams, stream).to_numpy(zero_copy_only=False)
        drop |= hit
    left = {}
    for stream, sorted_keys in keys.items():
        rest = sorted_keys[~masks[stream]] if stream in masks else sorted_keys
        if len(rest):
            left[stream] = rest
    return table.filter(pa.array(~drop)), left


def committed_files(path: str | os.PathLike) -> list[Path]:
    """Committed data files of a dataset, in commit order (published path, else staged path)."""
    root = Path(path)
    log = _CommitLog(root)
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
    dataset = ds.dataset([str(f) for f in files], schema=schema, format="parquet")
    return dataset.to_table(columns=columns)
