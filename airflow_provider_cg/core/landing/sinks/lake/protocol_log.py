"""The lake sinks' protocol log (``_cg_log/``): records, checkpoints, folding and clean-up.

One record per position, each claimed with ``Storage.create`` (exactly one writer wins a
position). Every ``checkpoint_interval`` positions a writer writes a checkpoint and points
``_cg_log/_last_checkpoint.json`` at it, so opening a table reads the pointer, one checkpoint
and the records after it: no listing, whatever the table's age.

Folding keeps a checkpoint small. Records older than the last ``KEEP_RECORDS`` positions are
folded into a summary: the keys every folded commit took, merged into runs of consecutive
origin sequences per stream (``_cg_keys/_folded/``: a stream landed whole is one run), the
latest fence of each partition, every stream life, the highest origin mark of each life's key
(``stream_life.py``), every aborted write, the last commit of each member and, for the Parquet dataset, its published files (in a file of their own, which only
its readers read). A record is folded only once it can
no longer matter gid by gid: its commit is published (the folding writer rolls it forward
first) and no write marked ``acking`` at or before it is unfinished. A write can only be
committed after its ``acking`` mark, and aborted writes are all kept, so a stalled writer that
reloads a folded log still finds its write aborted, or committed (its staging is gone), or
neither (its ``acking`` claim decides, as before).

Clean-up (``clean_protocol_log``, run by ``cg maintain``) deletes what folding made redundant
once it is older than a retention: records before the fold point (oldest first), older
checkpoints and the folded commits' key files. A writer that stalled past the retention and
claims a position that clean-up freed is caught by the claim itself: a claim holds only if the
record before it exists and the pointer is below it; otherwise the writer removes its record,
reloads the log and retries.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import quote

import numpy as np

from airflow_provider_cg.core.landing.sinks.lake.storage import Storage
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SinkError
from airflow_provider_cg.core.landing.stream_life import Life, OriginMark

if TYPE_CHECKING:
    from collections.abc import Callable

LOG_DIR = "_cg_log"
KEYS_DIR = "_cg_keys"
FOLDED_DIR = f"{KEYS_DIR}/_folded"
CHECKPOINT_SUFFIX = ".checkpoint.json"
POINTER = f"{LOG_DIR}/_last_checkpoint.json"
FILE_LIST_SUFFIX = "-files.json"
#: records a checkpoint keeps whole; older ones are folded
KEEP_RECORDS = 1000


class DatasetCorrupt(SinkError):
    """The commit log references a file that is neither published nor staged."""


@functools.lru_cache(maxsize=4096)
def fs_name(gid: str) -> str:
    """A gid as one path segment (cached: a batch names its gid's folders several times)."""
    return quote(gid, safe="")


def pos_name(pos: int) -> str:
    return f"{pos:020d}.json"


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


#: the header ``np.save`` writes for a plain array: ``{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }``
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), 'shape': \(([\d, ]*)\), \}")


def npy_load(data: bytes) -> np.ndarray:
    """An array ``npy_bytes`` wrote. Its header is read here, not by ``np.load``: numpy parses it
    with ``ast.literal_eval``, and on Python 3.11 the AST constructor keeps its recursion counter
    per interpreter, not per thread, so two threads of one process reading keys at once (writers
    committing side by side) failed now and then with ``SystemError: AST constructor recursion
    depth mismatch`` (CPython gh-106905). Any other header goes to ``np.load``."""
    if data[:6] == b"\x93NUMPY" and len(data) >= 10:
        size = 2 if data[6] == 1 else 4
        start = 8 + size
        end = start + int.from_bytes(data[8:start], "little")
        m = _NPY_HEADER.match(data, start, end)
        if m is not None:
            shape = tuple(int(x) for x in m[3].split(b",") if x.strip())
            dtype = np.dtype(m[1].decode())
            arr = np.frombuffer(data, dtype, count=math.prod(shape), offset=end)
            return arr.reshape(shape, order="F" if m[2] == b"True" else "C").copy()
    return np.load(io.BytesIO(data), allow_pickle=False)


# -- runs of consecutive sequences ------------------------------------------------------------

def to_runs(sorted_unique: np.ndarray) -> np.ndarray:
    """``[[starts], [ends]]`` (inclusive) of the runs of consecutive values."""
    if not len(sorted_unique):
        return np.zeros((2, 0), dtype=np.int64)
    breaks = np.nonzero(np.diff(sorted_unique) != 1)[0]
    starts = np.concatenate([sorted_unique[:1], sorted_unique[breaks + 1]])
    ends = np.concatenate([sorted_unique[breaks], sorted_unique[-1:]])
    return np.stack([starts, ends]).astype(np.int64)


def merge_runs(*runs: np.ndarray) -> np.ndarray:
    """One set of runs covering all of ``runs`` (touching or overlapping runs joined)."""
    both = np.concatenate([r for r in runs if r.shape[1]], axis=1) if any(r.shape[1] for r in runs) else None
    if both is None:
        return np.zeros((2, 0), dtype=np.int64)
    order = np.argsort(both[0], kind="stable")
    starts, ends = both[0][order], both[1][order]
    reach = np.maximum.accumulate(ends)
    new = np.concatenate([[True], starts[1:] > reach[:-1] + 1])
    idx = np.nonzero(new)[0]
    return np.stack([starts[idx], np.maximum.reduceat(ends, idx)]).astype(np.int64)


def in_runs(values: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """Mask over ``values``: inside one of ``runs``."""
    if not runs.shape[1] or not len(values):
        return np.zeros(len(values), dtype=bool)
    i = np.searchsorted(runs[0], values, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(values), dtype=bool)
    out[ok] = values[ok] <= runs[1][i[ok]]
    return out


def is_runs_file(path: str) -> bool:
    return path.startswith(FOLDED_DIR + "/")


@dataclass
class StreamIndex:
    """Per origin stream: seq range and key file of each commit, for overlap queries (the
    folded runs are one entry, at the fold position)."""

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


def _member_key(batch: dict) -> str:
    return "\x00".join((batch.get("stream", ""), batch.get("group", ""), batch.get("member") or ""))


def last_commit_summary(record: dict) -> dict:
    """What ``last_commits`` reports of a commit record (kept for folded ones)."""
    return {"gid": record["gid"], "committed_at": record.get("committed_at", ""),
            "rows_written": int(record.get("rows_written", 0)), "batch": record.get("batch") or {},
            "streams": {s: {"min": i["min"], "max": i["max"], "count": i["count"]}
                        for s, i in (record.get("streams") or {}).items()}}


class CommitLog:
    """Reads (incrementally) and appends the protocol log of one table."""

    def __init__(self, store: Storage, *, keep: int = KEEP_RECORDS) -> None:
        self.store = store
        self.keep = keep  # records a checkpoint keeps whole
        self._reset()

    def _reset(self) -> None:
        self.pos = 0
        self.records: list[dict] = []  # the records after the fold point
        self.commits: dict[str, dict] = {}
        self.aborts: set[str] = set()
        self.acking: set[str] = set()  # gids with an "acking" record before any abort record
        self.acking_pos: dict[str, int] = {}  # gid -> position of its acking record
        #: acking records (with their input keys) of writes neither committed nor aborted yet
        self.in_flight: dict[str, dict] = {}
        self.fences: dict[tuple[str, str, int], str] = {}  # (stream, group, partition) -> owner
        self.lives: dict[str, list[Life]] = {}  # origin stream -> its lives landed here, oldest first
        #: origin key -> the highest mark a commit recorded (``stream_life.OriginMark``)
        self.marks: dict[str, OriginMark] = {}
        self.index: dict[str, StreamIndex] = {}
        #: the fold: records at or before ``folded_pos`` are only summarized
        self.folded_pos = 0
        self.folded_keys: dict[str, dict] = {}  # stream -> {"path", "min", "max"} of its runs file
        self._folded_file_lists: list[str] = []  # read by the dataset's readers only (committed_files)
        self.folded_last: dict[str, dict] = {}  # stream\0group\0member -> last_commit_summary
        self._loaded = False

    def reload(self) -> None:
        """Forget what was read and read the log again from its newest checkpoint."""
        self._reset()
        self.refresh()

    def reload_listed(self) -> None:
        """``reload`` from the newest checkpoint listed, not the pointed one: a file of the
        checkpoint read was cleaned up (clean-up removes a checkpoint with its files, and the
        pointer can lag behind the newest checkpoint when two writers race on it)."""
        self._reset()
        self._loaded = True
        self._load_checkpoint(listed=True)
        self.refresh()

    # -- reading --------------------------------------------------------------------------

    def _apply(self, pos: int, record: dict) -> None:
        record["pos"] = pos
        self.pos = pos
        self.records.append(record)
        if record["op"] == "fence":
            for p in record["partitions"]:
                self.fences[(record["stream"], record["group"], p)] = record["owner"]
            return
        if record["op"] == "life":
            lives = self.lives.setdefault(record["stream"], [])
            life = Life(record["created"], record["key"], int(record.get("from_seq") or 1),
                        OriginMark.from_list(record.get("anchor")))
            if all((known.created, known.key) != (life.created, life.key) for known in lives):
                lives.append(life)
            return
        gid = record["gid"]
        if gid in self.commits or gid in self.aborts:
            return  # cannot happen with the claim protocol; first record wins
        if record["op"] in ("commit", "abort"):
            self.in_flight.pop(gid, None)
        if record["op"] == "commit":
            self.commits[gid] = record
            self._mark(OriginMark.from_list(record.get("mark")))
            for stream, info in record.get("streams", {}).items():
                self.index.setdefault(stream, StreamIndex()).add(info["min"], info["max"], pos, info["keys"])
        elif record["op"] == "abort":
            self.aborts.add(gid)
        elif record["op"] == "acking":
            self.acking.add(gid)
            self.acking_pos[gid] = pos
            if record.get("streams"):
                self.in_flight[gid] = record

    def _mark(self, mark: OriginMark | None) -> None:
        if mark is not None and (mark.key not in self.marks or mark.seq >= self.marks[mark.key].seq):
            self.marks[mark.key] = mark

    def pointer(self) -> int | None:
        """The position of the checkpoint ``_last_checkpoint.json`` names (None if none)."""
        pointed = self._read_pointer()
        return None if pointed is None else pointed[0]

    def _read_pointer(self) -> tuple[int, int | None] | None:
        """The pointer's checkpoint position and fold point (None: a pointer written before
        it carried the fold point)."""
        try:
            data = json.loads(self.store.read(POINTER))
            folded = data.get("folded")
            return int(data["pos"]), None if folded is None else int(folded)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # half-written by a crashed writer: the listing finds the checkpoint

    def _checkpoint_names(self) -> list[str]:
        return [n for n in self.store.list(LOG_DIR) if n.endswith(CHECKPOINT_SUFFIX)]

    def _load_checkpoint(self, *, listed: bool = False) -> None:
        pos = None if listed else self.pointer()
        if pos is not None:
            names = [checkpoint_name(pos)]
        else:  # a table written before the pointer existed, or a pointer lost: list them
            names = list(reversed(self._checkpoint_names()))
        for name in names:
            try:
                data = json.loads(self.store.read(f"{LOG_DIR}/{name}"))
            except (OSError, ValueError):
                continue
            self._load_body(data)
            return
        if pos is not None:  # the pointed checkpoint is unreadable: fall back on the listing
            for name in reversed(self._checkpoint_names()):
                try:
                    self._load_body(json.loads(self.store.read(f"{LOG_DIR}/{name}")))
                    return
                except (OSError, ValueError):
                    continue

    def _load_body(self, data: dict) -> None:
        folded = data.get("folded")
        if folded:
            self.folded_pos = self.pos = int(folded["pos"])
            self.folded_keys = folded["keys"]
            for stream, info in self.folded_keys.items():
                self.index.setdefault(stream, StreamIndex()).add(info["min"], info["max"], self.folded_pos,
                                                                 info["path"])
            self._folded_file_lists = folded.get("files") or []
            self.folded_last = folded["last"]
            self.aborts = set(folded["aborts"])
            self.fences = {(s, g, int(p)): o for s, g, p, o in folded["fences"]}
            self.lives = {s: [Life.from_list(life) for life in lives] for s, lives in folded["lives"].items()}
            for mark in folded.get("marks") or ():
                self._mark(OriginMark.from_list(mark))
        for record in data["records"]:
            self._apply(record.pop("pos"), record)

    def refresh(self) -> None:
        """Read records after the last one seen (positions are contiguous)."""
        if not self._loaded:
            self._loaded = True
            self._load_checkpoint()
        while True:
            name = pos_name(self.pos + 1)
            try:
                raw = self.store.read(f"{LOG_DIR}/{name}")
            except FileNotFoundError:
                return
            try:
                record = json.loads(raw)
            except ValueError as exc:
                raise DatasetCorrupt(f"commit log record {name} is not valid JSON: {exc}") from None
            self._apply(self.pos + 1, record)

    # -- writing --------------------------------------------------------------------------

    def claim(self, record: dict) -> int:
        """Write ``record`` at the next position; raises FileExistsError when another writer
        won it, or when the position was one clean-up freed (this log was read before it)."""
        pos = self.pos + 1
        name = f"{LOG_DIR}/{pos_name(pos)}"
        self.store.create(name, json.dumps(record, separators=(",", ":")).encode())
        if not self._claim_holds(pos):
            self.store.delete_tree(name)
            self.reload()
            raise FileExistsError(name)
        self._apply(pos, dict(record))
        return pos

    def _claim_holds(self, pos: int) -> bool:
        """Clean-up deletes records oldest first and only before a checkpoint's fold point,
        and points the pointer at that checkpoint or a later one: a freed position has no
        record before it, and is at or before the pointed checkpoint's fold point.

        Not the pointed checkpoint's own position: another writer may read this record,
        claim the next position and point at a checkpoint there before this check runs.
        Taking the claim back then left a hole in the log that readers which had not read
        the record could not pass, while those which had read it kept a record that was
        gone (a write marked acking that never finished, for them)."""
        if pos > 1 and not self.store.exists(f"{LOG_DIR}/{pos_name(pos - 1)}"):
            return False
        pointed = self._read_pointer()
        if pointed is None:
            return True
        at, folded = pointed
        if folded is None:  # a pointer written by an older version: its checkpoint says
            folded = self._checkpoint_fold(at)
        return folded < pos

    def _checkpoint_fold(self, pos: int) -> int:
        """The fold point of the checkpoint at ``pos`` (its position itself if unreadable,
        the older check's bound)."""
        try:
            body = json.loads(self.store.read(f"{LOG_DIR}/{checkpoint_name(pos)}"))
            folded = body.get("folded")
            return int(folded["pos"]) if folded else 0
        except (OSError, ValueError, KeyError, TypeError):
            return pos

    def fold_point(self) -> int:
        """The highest position that may be folded now: ``keep`` records stay whole, and no
        write marked acking at or before it is unfinished."""
        point = self.pos - self.keep
        unfinished = [p for g, p in self.acking_pos.items() if g not in self.commits and g not in self.aborts]
        if unfinished:
            point = min(point, min(unfinished) - 1)
        return max(point, self.folded_pos)

    def to_fold(self, through: int) -> list[dict]:
        """The commits between the fold point and ``through``, oldest first."""
        return [r for r in self.records if r["op"] == "commit" and self.folded_pos < r["pos"] <= through
                and self.commits.get(r["gid"]) is r]

    def write_checkpoint(self, through: int, load_keys: Callable[[str], np.ndarray], *,
                         keep_files: bool) -> None:
        """A checkpoint at the current position, folding records up to ``through`` (their
        commits published already); then the pointer, if it moves forward."""
        folded_keys = dict(self.folded_keys)
        new_keys: dict[str, list[np.ndarray]] = {}
        files: list[dict] = []
        last = dict(self.folded_last)
        folding = [r for r in self.records if r["pos"] <= through] if through > self.folded_pos else []
        for r in folding:
            if r["op"] != "commit" or self.commits.get(r["gid"]) is not r:
                continue  # an abort, a fence, ... or a record that lost to an earlier one
            for stream, info in (r.get("streams") or {}).items():
                new_keys.setdefault(stream, []).append(load_keys(info["keys"]))
            if keep_files:
                files.extend(r["files"])
            last[_member_key(r.get("batch") or {})] = last_commit_summary(r)
        # every stream's runs are written anew, named by this position: a checkpoint refers
        # only to its own runs, which clean-up removes with the checkpoint itself
        for i, stream in enumerate(sorted(set(new_keys) | set(folded_keys))):
            runs = [to_runs(np.unique(np.concatenate(new_keys[stream])))] if stream in new_keys else []
            old = folded_keys.get(stream)
            if old:
                runs.append(load_keys(old["path"]))
            merged = merge_runs(*runs)
            path = f"{FOLDED_DIR}/{self.pos:020d}-{i}.npy"
            self.store.ensure_dir(FOLDED_DIR)
            self.store.write(path, npy_bytes(merged))
            folded_keys[stream] = {"path": path, "min": int(merged[0][0]), "max": int(merged[1][-1])}
        point = max(through, self.folded_pos)
        file_lists = list(self._folded_file_lists)
        if keep_files and files:
            # the dataset's newly folded files, in a list of their own that only its readers
            # read; never cleaned up (they are the dataset)
            file_lists.append(f"{FOLDED_DIR}/{self.pos:020d}{FILE_LIST_SUFFIX}")
            self.store.ensure_dir(FOLDED_DIR)
            self.store.write(file_lists[-1], json.dumps(files, separators=(",", ":")).encode())
        folded = {"pos": point, "keys": folded_keys, "files": file_lists, "last": last,
                  "aborts": sorted(self.aborts), "written_at": datetime.now(UTC).isoformat(),
                  "fences": [[s, g, p, o] for (s, g, p), o in self.fences.items()],
                  "lives": {s: [life.to_list() for life in lives] for s, lives in self.lives.items()},
                  "marks": [m.to_list() for m in self.marks.values()]}
        tail = [r for r in self.records if r["pos"] > point]
        body = json.dumps({"v": 2, "pos": self.pos, "folded": folded, "records": tail},
                          separators=(",", ":")).encode()
        self.store.write(f"{LOG_DIR}/{checkpoint_name(self.pos)}", body)
        pointed = self.pointer()
        if pointed is None or pointed < self.pos:
            self.store.write(POINTER, json.dumps({"pos": self.pos, "folded": point}).encode())

    def committed_files(self) -> list[dict]:
        folded = [f for path in self._folded_file_lists for f in json.loads(self.store.read(path))]
        return [*folded, *(f for r in self.records if r["op"] == "commit" for f in r["files"])]


def checkpoint_name(pos: int) -> str:
    return f"{pos:020d}{CHECKPOINT_SUFFIX}"


@dataclass
class LogCleanup:
    """What one clean-up of a protocol log removed (numbers only)."""

    records: int = 0
    checkpoints: int = 0
    key_dirs: int = 0
    folded_files: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"records": self.records, "checkpoints": self.checkpoints, "key_dirs": self.key_dirs,
                "folded_files": self.folded_files}


def clean_protocol_log(store: Storage, retention_hours: float) -> LogCleanup:
    """Delete the records, checkpoints and key files that the newest checkpoint written more
    than ``retention_hours`` ago has folded. Records go oldest first (the claim's check relies
    on it); the record at the fold point stays, so a claim after it still finds its
    predecessor. Safe beside writers: none of it is read by a log opened since that checkpoint."""
    out = LogCleanup()
    horizon = time.time() - retention_hours * 3600
    names = [n for n in store.list(LOG_DIR) if n.endswith(CHECKPOINT_SUFFIX)]
    chosen = None
    for name in reversed(names):
        try:
            body = json.loads(store.read(f"{LOG_DIR}/{name}"))
        except (OSError, ValueError):
            continue
        folded = body.get("folded")
        if not folded:
            break  # written before folding existed: nothing older is redundant
        written = datetime.fromisoformat(folded["written_at"]).timestamp()
        if written <= horizon:
            chosen = (name, body)
            break
    if chosen is None:
        return out
    name, body = chosen
    point = int(body["folded"]["pos"])
    pointed = CommitLog(store).pointer()
    if pointed is None or pointed < int(body["pos"]):  # never left on a checkpoint removed below
        store.write(POINTER, json.dumps({"pos": int(body["pos"]), "folded": point}).encode())
    keep = {info["path"] for info in body["folded"]["keys"].values()}
    pos = 1
    first = [n for n in store.list(LOG_DIR) if n.endswith(".json") and not n.endswith(CHECKPOINT_SUFFIX)
             and n[:20].isdigit()]
    if first:
        pos = int(first[0][:20])
    while pos < point:
        rel = f"{LOG_DIR}/{pos_name(pos)}"
        try:
            record = json.loads(store.read(rel))
        except FileNotFoundError:
            pos += 1
            continue
        except ValueError:
            record = {}
        if record.get("op") == "commit":
            store.delete_tree(f"{KEYS_DIR}/{fs_name(record['gid'])}")
            out.key_dirs += 1
        store.delete_tree(rel)
        out.records += 1
        pos += 1
    for older in names:
        if older < name:
            store.delete_tree(f"{LOG_DIR}/{older}")
            out.checkpoints += 1
    oldest_kept = min((p.rsplit("/", 1)[1][:20] for p in keep), default=None)
    if oldest_kept is not None:
        for f in store.list(FOLDED_DIR):
            if f[:20] < oldest_kept and not f.endswith(FILE_LIST_SUFFIX):
                store.delete_tree(f"{FOLDED_DIR}/{f}")
                out.folded_files += 1
    return out
