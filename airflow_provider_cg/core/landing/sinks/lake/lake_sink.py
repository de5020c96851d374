"""The two-phase protocol of the lake sinks, kept in a commit log beside the table.

Every lake sink (the Parquet dataset, Delta Lake, Iceberg) keeps the protocol's state in the
same place, under the table's location, on local disk or in an S3-compatible bucket
(``storage.py``)::

    _cg_log/00000000000000000001.json           protocol log: one record per position
    _cg_log/00000000000000000100.checkpoint.json   every 100 positions (``protocol_log.py``)
    _cg_log/_last_checkpoint.json               the newest checkpoint's position
    _cg_keys/<gid>/<rand>-<i>.npy               sorted origin_seq per origin stream, per commit
    _cg_keys/_folded/<pos>-<i>.npy              runs of the folded commits' origin_seq, per stream
    _cg_staging/<gid>/part-0.parquet, keys-<i>.npy, prepared.json   prepared writes
    _cg_staging/<gid>/spark/part-*.parquet      a batch's files written by Spark tasks (``stage``)

Protocol. ``prepare`` writes the rows (minus in-batch duplicates and keys already committed),
the sorted keys and a ``prepared.json`` manifest with the message refs into the write's
staging; ``mark_acking`` claims an ``acking`` record; recovery's ``abort_unless_acking``
aborts only if no ``acking`` record precedes its ``abort`` record. ``fence`` claims a
``fence`` record (owner of some partitions of a group); ``mark_acking`` of a fenced write
claims its record only if the latest fence of each of its partitions, in the log before that
position, names the write's owner. ``commit`` re-reads the log, drops rows whose key is in an
earlier commit (only commits whose per-stream seq range overlaps are read), then claims the
next position with a ``commit`` record.

Writers of the same inputs. Live members, standbys, backfills and replays may all hold the same
input message in their batches. The ``acking`` record carries the write's input keys, and
``mark_acking`` first commits any other write marked acking but not yet finished that shares
an input (any instance may: a write marked acking is always committed), so from its mark on a
write is the only one that can still take its inputs. A write of a transformation's output
(one result for many inputs, not one row per input) whose inputs are then found committed is
refused (``InputsTaken``): its writer rolls it back, nothing acked, and computes the batch again
without them. A write of rows drops the rows of committed inputs at commit, as before. So no
input's effect is ever committed twice, transformed or not.

A claim is ``Storage.create``: an object written only if its name is free (``link`` on a local disk, a conditional put on an object store), so
exactly one writer wins each position and a record is never seen half-written; a loser
re-reads the new records, re-checks and retries. ``abort`` claims a position too, so the
first of commit/abort wins for good.

Publishing. The ``commit`` record decides; ``publish`` (per sink) then makes the batch
visible to readers -- the Parquet sink links files into ``data/``, Delta and Iceberg commit
one table transaction for every record ready, once per ``table_commit_interval`` for all
writers (``tables.py``). Any instance rolls a committed record forward (after a crash
between the record and the publish), so publishing is idempotent, and the table sinks
publish records in log order, each transaction carrying the last log position it publishes.

VACUUM, compaction, checkpoints and snapshot expiry of the table do not touch ``_cg_*``
objects (``_``-prefixed names are not data to any of them), so the committed keys that
exactly-once rests on survive them.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.rows import ROW_SCHEMA, BatchId
from airflow_provider_cg.core.landing.sinks.lake.committed_keys import CommittedKeys, without
from airflow_provider_cg.core.landing.sinks.lake.parquet_files import (
    SizedParquetFiles,
    data_file_options,
)
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import (
    KEYS_DIR,
    LOG_DIR,
    CommitLog,
    DatasetCorrupt,
    fs_name,
    last_commit_summary,
    npy_bytes,
    npy_load,
)
from airflow_provider_cg.core.landing.sinks.lake.spark_staging import StagedFiles, stage_frame
from airflow_provider_cg.core.landing.sinks.lake.staging import STAGING_DIR, StagingArea
from airflow_provider_cg.core.landing.sinks.lake.storage import Storage
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import (
    CommitResult,
    Fence,
    FencedOut,
    InputsTaken,
    LastCommit,
    MessageRefs,
    PreparedWrite,
    PreparedWriteLost,
    SchemaMismatch,
    SinkError,
    TwoPhaseSink,
    WriteState,
    conform_table,
    decode_refs,
    first_occurrence_mask,
    isin_sorted,
    keys_by_stream,
    normalize_refs,
    recovered_by,
    sorted_unique,
)
from airflow_provider_cg.core.landing.stream_life import (
    Life,
    LifeChoice,
    OriginKeys,
    OriginMark,
    origin_keys,
    to_record,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import Partitioning

STORED_SCHEMA = pa.schema(
    [f.with_type(pa.timestamp("us", tz="UTC")) if f.name == "timestamp" else f for f in ROW_SCHEMA]
)
"""``ROW_SCHEMA`` as stored in Parquet files (microsecond timestamps, readable by Spark)."""

log = logging.getLogger(__name__)


#: re-reads of the log when another write's keys are gone before mark_acking gives up
VANISHED_RETRIES = 200

class LakeSink(TwoPhaseSink):
    """Two-phase sink over a commit log beside the table; see the module docstring.

    Subclasses say where committed files go (``data_file_name``) and how a committed record
    becomes visible to readers (``publish``). Thread-safe; any number of processes may commit
    into the same table.
    """

    #: folder (relative to the location) of the published data files
    DATA_PREFIX = "data/"
    #: Parquet statistics for every column (table formats read them), or only the key columns
    ALL_STATISTICS = False
    #: the table's partitioning (``shared/table_partitioning.py``): each data file then holds one partition
    partitioning: Partitioning | None = None
    #: the log's checkpoints keep the folded commits' files (the Parquet dataset is read from them)
    KEEPS_FILES = False

    def __init__(self, store: Storage, *, compression: str = "snappy", checkpoint_interval: int = 100,
                 key_cache_size: int = 16, target_file_size: int | None = None) -> None:
        self.store = store
        self.compression = compression
        #: bytes a data file written here holds at most (a larger batch or partition is split)
        self.target_file_size = target_file_size
        self.checkpoint_interval = checkpoint_interval
        for sub in (LOG_DIR, KEYS_DIR, self.DATA_PREFIX.rstrip("/")):
            store.ensure_dir(sub)
        #: the prepared writes (``staging.py``)
        self.staged = StagingArea(store)
        self._log = CommitLog(store)
        self._lock = threading.RLock()
        self._keys = CommittedKeys(store, self._log, key_cache_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store.location!r})"

    # -- what subclasses provide --------------------------------------------------------------

    @abc.abstractmethod
    def publish(self, record: dict) -> None:
        """Make a committed record's files visible to readers (idempotent; any instance may
        call it for any committed record, e.g. after its committer died)."""

    def committed(self, record: dict) -> None:
        """After a commit record of this writer: publish it (a table sink may publish it later,
        with others, ``tables.py``)."""
        self.publish(record)

    def check_schema(self, schema: pa.Schema) -> None:  # noqa: B027 - no table schema by default
        """Refuse (``SchemaMismatch``) a batch the table cannot take, before any ack."""

    def storable(self, table: pa.Table) -> pa.Table:
        """The batch's rows as the table stores them (by default: as they are)."""
        return table

    # -- Spark writes the files -----------------------------------------------------------

    def stage(self, batch_id: BatchId, frame: DataFrame) -> StagedFiles:
        """Spark tasks write the batch's Parquet files straight into the write's staging, each
        at most ``target_file_size``; the driver only lists them (``spark_staging.py``)."""
        return stage_frame(self, batch_id, frame)

    def discard(self, staged: object) -> None:
        if isinstance(staged, StagedFiles):
            self.store.delete_tree(self.staging(staged.gid))

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

    def stream_life(self, stream: str, created: str, choice: LifeChoice | None = None,
                    like: Sequence[Life] = ()) -> OriginKeys:
        """From the log's ``life`` records; each new life is claimed as one."""
        with self._lock:
            while True:
                self._log.refresh()
                lives = self._log.lives.get(stream, ())
                new = to_record(stream, created, lives, choice, like)
                if not new:
                    return origin_keys(stream, created, lives)
                life = new[0]
                try:
                    self._claim({"v": 1, "op": "life", "stream": stream, "created": life.created, "key": life.key,
                                 "from_seq": life.from_seq, "anchor": life.anchor.to_list() if life.anchor else None})
                except FileExistsError:
                    continue  # another writer took the position (maybe recording this life): re-read

    def stream_lives(self, stream: str) -> list[Life]:
        with self._lock:
            self._log.refresh()
            return list(self._log.lives.get(stream, ()))

    def origin_mark(self, key: str) -> OriginMark | None:
        """From the log's commit records (and the fold)."""
        with self._lock:
            self._log.refresh()
            return self._log.marks.get(key)

    def _claim(self, record: dict) -> int:
        """Claim the next log position for ``record`` (FileExistsError: re-read and retry)."""
        pos = self._log.claim(record)
        self._checkpoint_due(pos)
        return pos

    def _checkpoint_due(self, pos: int) -> None:
        """Every ``checkpoint_interval`` positions: a checkpoint folding what may be folded
        (``protocol_log.py``), its commits rolled forward first; a checkpoint is only a
        shortcut, so one that fails is logged and landing goes on."""
        if not self.checkpoint_interval or pos % self.checkpoint_interval:
            return
        through = self._log.fold_point()
        try:
            folding = self._log.to_fold(through)
            if folding:
                self.roll_forward(folding)
            self._log.write_checkpoint(through, self._keys.load, keep_files=self.KEEPS_FILES)
        except (SinkError, OSError) as e:
            log.warning("cg lake sink: no checkpoint at log position %d (%s)", pos, str(e)[:200])

    def roll_forward(self, commits: list[dict]) -> None:
        """Publish committed records before they are folded (the fold forgets them gid by gid)."""
        for record in commits:
            self.publish(record)

    def _fenced_out(self, prepared: PreparedWrite) -> list[int]:
        """Partitions of the write's fence that the log says another owner fenced since."""
        f = prepared.fence
        if f is None:
            return []
        b = prepared.batch_id
        return [p for p in f.partitions if self._log.fences.get((b.stream, b.group, p)) != f.owner]

    def staging(self, gid: str) -> str:
        return self.staged.dir(gid)

    def prepare(self, batch_id: BatchId, table: pa.Table | StagedFiles, *, message_refs: MessageRefs,
                fence: Fence | None = None, input_keys: dict[str, np.ndarray] | None = None,
                origin_mark: OriginMark | None = None) -> PreparedWrite:
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
            rows_in = sum(n for _, n in table.files) if isinstance(table, StagedFiles) else table.num_rows
            keys = {s: sorted_unique(np.asarray(q, dtype=np.int64)) for s, q in (input_keys or {}).items() if len(q)}
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
                masks = self._keys.masks(keys, 0)
            if masks:
                table, keys = without(table, keys, masks)
        if not isinstance(table, StagedFiles) and table.num_rows:
            table = self.storable(table)
            self.check_schema(table.schema)
            if self.merge is not None and self.refusals(table):  # the pipeline takes them out first
                column = next(k for k in self.merge.keys if table.column(k).null_count)
                raise SchemaMismatch(column, "is a merge key, and this batch has rows without it")
        staging = self.staged.start(batch_id.gid, staged_by_spark=staged)
        dropped = 0 if isinstance(table, StagedFiles) else rows_in - table.num_rows
        manifest = self.staged.manifest(batch_id, rows=rows_in, dropped=dropped, refs=refs, fence=fence,
                                        transformed=transformed, mark=origin_mark)
        try:
            self.staged.write(staging, table, keys, manifest, self)
        except FileNotFoundError:
            # A recovering instance of the member removed this half-prepared staging: this
            # instance stalled mid-prepare and is no longer the pin holder.
            raise PreparedWriteLost(f"staging of {batch_id.gid} was removed while preparing") from None
        return PreparedWrite(batch_id=batch_id, rows=rows_in, refs=refs, token=self.staged.token(staging), fence=fence)

    def splits_files(self) -> bool:
        return self.partitioning is not None or bool(self.target_file_size)

    def write_file(self, table: pa.Table, rel: str) -> None:
        self.store.write_new(rel, self._parquet_files(table.schema, None).files(table)[0][0])

    def _parquet_files(self, schema: pa.Schema, target: int | None) -> SizedParquetFiles:
        """The writer of this sink's data files (its compression, dictionaries and statistics)."""
        return SizedParquetFiles(schema, target, **data_file_options(schema, self.compression, self.ALL_STATISTICS))

    def write_parts(self, table: pa.Table, staging: str, stem: str) -> list[tuple[str, int]]:
        """``table`` as ``<stem>-<i>.parquet`` files in ``staging``: one, or one per partition of a
        partitioned table, each split in row order into files of at most ``target_file_size``
        (``parquet_files.py``). Returns (name, rows) of each, in the rows' order."""
        parts = self.partitioning.split(table) if self.partitioning is not None else [table]
        out: list[tuple[str, int]] = []
        for part in parts:
            for data, rows in self._parquet_files(part.schema, self.target_file_size).files(part):
                name = f"{stem}-{len(out):05d}.parquet"
                self.store.write_new(f"{staging}/{name}", data)
                self.wrote(f"{staging}/{name}", data, part)
                out.append((name, rows))
        return out

    def wrote(self, staged: str, data: bytes, rows: pa.Table) -> None:  # noqa: B027 - a table sink keeps footers
        """A data file this writer staged: ``data`` its bytes, ``rows`` the partition it holds."""

    def _read_parquet(self, rel: str) -> pa.Table:
        return pq.read_table(io.BytesIO(self.store.read(rel)))

    # -- commit ---------------------------------------------------------------------------------

    def commit(self, prepared: PreparedWrite) -> CommitResult:
        gid = prepared.gid
        staging = self.staging(gid)
        with self._lock:
            checked_pos = 0
            current: dict | None = None  # {"files": [(rel, rows)], "keys": {stream: array}, "dups": int}
            acking: bool | None = None  # known marked acking before the log was read again
            while True:
                self._log.refresh()
                record = self._log.commits.get(gid)
                if record is not None:
                    self.committed(record)
                    return CommitResult(record["rows_written"], record["duplicates_skipped"])
                if gid in self._log.aborts:
                    raise PreparedWriteLost(f"prepared write {gid} was aborted")
                try:
                    if current is None:
                        current = self.staged.load(gid)
                        if current["transformed"] and gid in self._log.acking_pos:
                            # no write shares its inputs after its acking mark (mark_acking)
                            checked_pos = self._log.acking_pos[gid]
                    current = self._drop_committed(current, staging, checked_pos)
                    checked_pos = self._log.pos
                    record = self._commit_record(prepared.batch_id, current, self._log.pos + 1)
                except (FileNotFoundError, PreparedWriteLost):
                    # its staging is gone: committed or aborted by another instance. A log read
                    # before a clean-up may miss that record: read it again, once
                    if acking is None:
                        acking = prepared.acking or gid in self._log.acking
                        self._log.reload_listed()
                        continue
                    if acking:
                        # marked acking, so never aborted: another instance committed it, and its
                        # record is folded (its rows are in the table, counted by that instance)
                        log.info("cg lake sink: write %s was committed by another instance", gid)
                        return CommitResult(0, 0)
                    raise PreparedWriteLost(f"prepared write {gid}: its staging is gone and no commit "
                                            "record names it") from None
                try:
                    pos = self._log.claim(record)
                except FileExistsError:
                    continue  # another writer took the position: re-read and re-check
                self.committed(self._log.commits[gid])
                self._checkpoint_due(pos)
                return CommitResult(record["rows_written"], record["duplicates_skipped"])

    def _drop_committed(self, current: dict, staging: str, after_pos: int) -> dict:
        masks = self._keys.masks(current["keys"], after_pos)
        if not masks:
            return current
        if current.get("transformed"):
            # Cannot happen between writers of this version (mark_acking refuses a write whose
            # inputs are taken, and orders writes sharing inputs); a writer of an older version
            # sharing the table could still do it. The output cannot be split per input, and
            # acks may have been sent: it is committed. Logged, not hidden.
            n = int(sum(m.sum() for m in masks.values()))
            log.error("cg lake sink: %d inputs of a transformed batch were committed meanwhile by "
                      "another writer that does not order its acks; their effect is in both batches", n)
            keys = {s: (k[~masks[s]] if s in masks else k) for s, k in current["keys"].items()}
            return {**current, "keys": {s: k for s, k in keys.items() if len(k)}, "key_files": {}}
        # a batch of rows (not transformed): one file, or one per partition of a partitioned table
        before = pa.concat_tables([self._read_parquet(f) for f, _ in current["files"]])
        table, keys = without(before, current["keys"], masks)
        files = [(f"{staging}/{name}", rows) for name, rows in
                 self.write_parts(table, staging, f"part-{secrets.token_hex(4)}")] if table.num_rows else []
        self.store.make_durable(staging)  # the new files' names, before a commit record names them
        dropped = before.num_rows - table.num_rows
        return {
            "files": files,
            "keys": keys,
            "dups": current["dups"] + dropped,
            "rows": current["rows"] - dropped,
            "mark": current.get("mark"),
        }

    def data_file_name(self, batch_id: BatchId, tag: str, i: int, pos: int) -> str:
        """The ``i``-th file of a batch committed at log position ``pos``: names sort in log
        order, and a batch's in its input's order, so a reader that lists a table commit's files
        by name (a group commit holds several batches) or a table's files after its older
        snapshots expired sees them in the order they were committed. Recorded in the commit
        record, so a retried commit uses the names its first attempt chose."""
        return f"part-{pos:012d}-{batch_id.uid}-b{batch_id.batch_seq}-{tag}-{i:05d}.parquet"

    def _commit_record(self, batch_id: BatchId, current: dict, pos: int) -> dict:
        keys_dir = f"{KEYS_DIR}/{fs_name(batch_id.gid)}"
        self.store.ensure_dir(keys_dir)
        tag = secrets.token_hex(4)
        streams = {}
        staged_keys = current.get("key_files") or {}
        for i, (stream, keys) in enumerate(current["keys"].items()):
            key_path = f"{keys_dir}/{tag}-{i}.npy"
            if stream in staged_keys:  # as prepared (nothing dropped since): a link, not a new file
                self.store.copy(staged_keys[stream], key_path)
            else:
                self.store.write(key_path, npy_bytes(keys))
            streams[stream] = {"min": int(keys[0]), "max": int(keys[-1]), "count": len(keys), "keys": key_path}
        files = [{"path": self.DATA_PREFIX + self.data_file_name(batch_id, tag, i, pos), "staged": staged_file,
                  "rows": rows} for i, (staged_file, rows) in enumerate(current["files"])]
        return {
            "v": 1,
            "op": "commit",
            "gid": batch_id.gid,
            "batch": batch_id.to_dict(),
            "rows_written": current["rows"],
            "duplicates_skipped": current["dups"],
            "files": files,
            "streams": streams,
            "mark": current.get("mark"),
            "committed_at": datetime.now(UTC).isoformat(),
        }

    def copy_files(self, record: dict) -> bool:
        """Copy (link) a committed record's staged files to their published names; True if
        any was copied now. A file gone from staging must be published already."""
        copied = False
        for f in record["files"]:
            if self.store.exists(f["path"]):
                continue
            try:
                self.store.copy(f["staged"], f["path"])
                copied = True
            except FileNotFoundError:
                if not self.store.exists(f["path"]):
                    raise DatasetCorrupt(f"committed file {f['path']} is missing (gid {record['gid']})") from None
        return copied

    def mark_acking(self, prepared: PreparedWrite) -> PreparedWrite:
        """Claim an ``acking`` log record. The log orders it against an ``abort`` record of
        ``abort_unless_acking``, against ``fence`` records and against other writes' ``acking``
        records: a claim only succeeds at the position after the last record the claimer has
        read, so whichever is claimed first wins. A write sharing an input with another one
        marked before it commits that one first, then is refused (``InputsTaken``) if it holds
        a transformation's output (see the module docstring)."""
        gid = prepared.gid
        with self._lock:
            inputs: tuple[bool, dict[str, np.ndarray], dict] | None = None
            helped: set[str] = set()
            checked = 0  # commits up to this log position hold none of the inputs (transformed)
            vanished = 0  # reads of another write's keys that found them gone, in a row
            while True:
                self._log.refresh()
                if gid in self._log.aborts:
                    raise PreparedWriteLost(f"prepared write {gid} was aborted")
                if gid in self._log.commits or gid in self._log.acking:
                    return dataclasses.replace(prepared, acking=True)
                if inputs is None:
                    try:
                        inputs = self.staged.inputs(gid)
                    except FileNotFoundError:
                        raise PreparedWriteLost(f"prepared write {gid} is gone") from None
                lost = self._fenced_out(prepared)
                if lost:
                    raise FencedOut(f"prepared write {gid}: partitions {lost} were fenced by another instance")
                transformed, keys, streams = inputs
                try:
                    other = self._finish_sharing(gid, keys)
                except FileNotFoundError:
                    # that write finished meanwhile: re-read. A write whose keys stay gone while
                    # the log still has it in flight (the table's directory deleted under the
                    # writer) ends the run (exit 2), rather than holding the pin in this loop.
                    vanished += 1
                    if vanished > VANISHED_RETRIES:
                        raise SinkError(f"prepared write {gid}: a write marked acking before it has no keys "
                                        f"under {self.store.uri()} after {VANISHED_RETRIES} reads (was the table's "
                                        "directory removed?)") from None
                    time.sleep(min(0.005 * vanished, 0.1))
                    continue
                if other is not None:
                    if other in helped and other in self._log.in_flight:
                        raise DatasetCorrupt(f"write {other} is marked acking but cannot be committed "
                                             "(its staging is gone)")
                    helped.add(other)
                    continue  # committed another writer's write of some of these inputs: re-read
                if transformed:
                    masks = self._keys.masks(keys, checked)  # only commits not checked yet: a retry reads few
                    checked = self._log.pos
                    if masks:
                        taken = {st: keys[st][m] for st, m in masks.items()}
                        n = sum(len(t) for t in taken.values())
                        raise InputsTaken(f"prepared write {gid}: {n} of its inputs were committed by another "
                                          "writer since it was computed", taken)
                record = {"v": 1, "op": "acking", "gid": gid, "batch": prepared.batch_id.to_dict(),
                          "streams": streams}
                try:
                    self._claim(record)
                except FileExistsError:
                    continue  # another writer took the position: re-read (maybe an abort or a fence)
                return dataclasses.replace(prepared, acking=True)

    def _finish_sharing(self, gid: str, keys: dict[str, np.ndarray]) -> str | None:
        """Commit the first write marked acking and not finished that shares an input with
        ``keys`` (it is committed in any case; committing it now orders it before ``gid``).
        Returns its gid, None if there is none."""
        for other, record in list(self._log.in_flight.items()):
            if other == gid:
                continue
            for stream, info in record["streams"].items():
                mine = keys.get(stream)
                if mine is None or not len(mine) or info["max"] < mine[0] or info["min"] > mine[-1]:
                    continue
                if not isin_sorted(mine, npy_load(self.store.read(info["keys"]))).any():
                    continue
                log.info("cg lake sink: committing write %s, marked acking, before %s (they share inputs)",
                         other, gid)
                try:
                    self.commit(PreparedWrite(BatchId(**record["batch"]), 0, {}, acking=True))
                except PreparedWriteLost:
                    self._log.refresh()  # rolled back by its writer (no ack was sent): its inputs are free
                return other
        return None

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
                    self.publish(self._log.commits[gid])
                    return WriteState.COMMITTED
                if gid not in self._log.aborts:
                    if unless_acking and gid in self._log.acking:
                        return WriteState.PREPARED  # mark_acking won: the caller commits
                    try:
                        self._claim({"v": 1, "op": "abort", "gid": gid})
                    except FileExistsError:
                        continue
                self.staged.drop(gid)
                return WriteState.ABORTED

    def state(self, prepared: PreparedWrite) -> WriteState:
        gid = prepared.gid
        with self._lock:
            self._log.refresh()
            if gid in self._log.commits:
                return WriteState.COMMITTED
            if gid in self._log.aborts:
                return WriteState.ABORTED
        if self.staged.is_prepared(gid):
            return WriteState.PREPARED
        return WriteState.ABORTED

    def recover(self, stream: str, group: str, member: str, partitions: Iterable[int] = (),
                partition_count: int | None = None) -> list[PreparedWrite]:
        """Prepared writes this caller must finish (see ``recovered_by``). Also rolls forward
        every committed-but-unpublished write (of any member), deletes aborted staging and this
        member's half-prepared staging (another member's finishes its manifest, or is fenced)."""
        own = fs_name(BatchId.member_prefix(stream, group, member))
        same_group = fs_name(BatchId.group_prefix(stream, group))
        fenced = frozenset(int(p) for p in partitions)
        found: list[tuple[str, PreparedWrite]] = []
        with self._lock:
            self._log.refresh()
            for name in self.store.list(STAGING_DIR):
                gid = unquote(name)
                path = f"{STAGING_DIR}/{name}"
                if gid in self._log.commits:
                    self.publish(self._log.commits[gid])
                elif gid in self._log.aborts:
                    self.store.delete_tree(path)
                elif name.startswith(same_group):
                    try:
                        manifest = self.staged.read_manifest(path)
                    except FileNotFoundError:
                        if not name.startswith(own):
                            continue
                        # Half-prepared: its writer died or stalled before the manifest. Log
                        # an abort first, so a stalled writer that finishes its manifest later
                        # cannot claim ``acking`` (and the abort loses if it already has).
                        if self._abort_gid(gid, unless_acking=True) is not WriteState.PREPARED:
                            log.info("cg lake sink: half-prepared write %s rolled back (no manifest)", gid)
                            continue
                        manifest = self.staged.read_manifest(path)
                    batch = BatchId(**manifest["batch"])
                    fence = Fence.from_dict(manifest.get("fence"))
                    if not recovered_by(batch, fence, stream, group, member, fenced, partition_count):
                        continue
                    found.append((manifest.get("prepared_at", ""), PreparedWrite(
                        batch,
                        manifest["rows"],
                        decode_refs(manifest["refs"]),
                        token=self.staged.token(path),
                        acking=gid in self._log.acking,
                        fence=fence,
                    )))
        # oldest first: a partition's earlier writes land before its later ones
        return [w for _, w in sorted(found, key=lambda t: (t[0], t[1].batch_id.batch_seq))]

    def last_commits(self, stream: str, group: str) -> dict[str, LastCommit]:
        """From the protocol log's commit records, newest first."""
        out: dict[str, LastCommit] = {}
        with self._lock:
            self._log.refresh()
            records = [last_commit_summary(r) for r in reversed(self._log.records) if r["op"] == "commit"]
            records += list(self._log.folded_last.values())  # members whose last commit is folded
        for r in records:
            batch = r["batch"]
            if batch.get("stream") != stream or batch.get("group") != group:
                continue
            member = batch.get("member") or ""
            if member not in out:
                out[member] = LastCommit(member, r["gid"], r["committed_at"], r["rows_written"],
                                         {s: {"first_seq": i["min"], "last_seq": i["max"], "messages": i["count"]}
                                          for s, i in r["streams"].items()})
        return out

    def committed_keys_exist(self, origin_stream: str, seqs: Iterable[int]) -> np.ndarray:
        values = np.asarray(list(seqs) if not isinstance(seqs, np.ndarray) else seqs, dtype=np.int64)
        uniq = sorted_unique(values)
        with self._lock:
            self._log.refresh()
            mask = self._keys.masks({origin_stream: uniq}, 0).get(origin_stream)
        if mask is None:
            return np.zeros(len(values), dtype=bool)
        return isin_sorted(values, uniq[mask])
