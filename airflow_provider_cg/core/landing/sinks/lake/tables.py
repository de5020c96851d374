"""What the Delta and Iceberg sinks share: schema rules, file statistics, where a table lives.

Schemas evolve as users change their transformations: a column the table lacks is added
(nullable); a column whose type differs from the table's, or a required column the batch
lacks, is refused with ``SchemaMismatch`` naming the column -- in ``prepare``, before any
message is acknowledged (the job exits 1: retrying cannot help).
"""

from __future__ import annotations

import abc
import io
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cg.core.landing.sinks.lake.lake_sink import DatasetCorrupt, LakeSink
from airflow_provider_cg.core.landing.sinks.lake.parquet_files import utc_schema
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import SchemaMismatch, SinkError

__all__ = ["APP_ID", "DataFile", "PublishCounts", "TableState", "SchemaMismatch", "TableConflict", "TableSink", "file_stats", "new_columns",
           "stats_json", "utc_schema"]

log = logging.getLogger(__name__)

APP_ID = "airflow-provider-cg"
"""The Delta app-transaction id (and Iceberg property prefix) that records log positions."""


def _norm(t: pa.DataType) -> str:
    """A type as the table formats see it (string/large/view kinds and timestamp units alike)."""
    if pa.types.is_dictionary(t):
        return _norm(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or t == pa.binary_view():
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{_norm(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_norm(f.type)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<{_norm(t.key_type)},{_norm(t.item_type)}>"
    return str(t)


def new_columns(table: pa.Schema, batch: pa.Schema) -> list[pa.Field]:
    """The batch's columns the table lacks (to add, nullable); ``SchemaMismatch`` for a column
    whose type differs or a required table column the batch lacks."""
    added = []
    for f in batch:
        idx = table.get_field_index(f.name)
        if idx < 0:
            added.append(f.with_nullable(True))
            continue
        want = table.field(idx)
        if _norm(want.type) != _norm(f.type):
            raise SchemaMismatch(f.name, f"is {_norm(f.type)} in this batch but {_norm(want.type)} in the table "
                                         "(changing a column's type is not an additive change)")
    for f in table:
        if not f.nullable and batch.get_field_index(f.name) < 0:
            raise SchemaMismatch(f.name, "is required by the table but missing from this batch")
    return added


def file_stats(data: bytes | None = None, *, metadata: pq.FileMetaData | None = None) -> tuple[int, dict]:
    """(rows, Delta-style stats) of a Parquet file: numRecords, and min/max/nullCount of its
    top-level integer and string columns (what readers skip files by, e.g. origin_seq)."""
    if metadata is None and data is None:
        raise ValueError("file_stats needs the file's bytes or its metadata")
    md = metadata if metadata is not None else pq.read_metadata(io.BytesIO(data or b""))
    schema = md.schema.to_arrow_schema()
    leaves = {md.schema.column(i).path: i for i in range(len(md.schema))}
    mins, maxs, nulls = {}, {}, {}
    for f in schema:
        if f.name not in leaves or not (pa.types.is_integer(f.type) or pa.types.is_string(f.type)
                                        or pa.types.is_large_string(f.type)):
            continue
        col = leaves[f.name]
        lo: Any = None
        hi: Any = None
        n_null = 0
        ok = True
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(col).statistics
            if st is None or not st.has_min_max:
                if md.row_group(rg).num_rows:
                    ok = False
                n_null += st.null_count if st is not None and st.has_null_count else 0
                continue
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
            n_null += st.null_count if st.has_null_count else 0
        if ok and lo is not None:
            if isinstance(lo, bytes):
                lo, hi = lo.decode("utf-8", "replace"), hi.decode("utf-8", "replace")
            if isinstance(lo, str) and (len(lo) > 32 or len(hi) > 32):
                continue  # long strings: no bounds (a truncated max would be wrong)
            mins[f.name], maxs[f.name] = lo, hi
        nulls[f.name] = n_null
    stats = {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return md.num_rows, stats


def stats_json(stats: dict) -> str:
    return json.dumps(stats, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class DataFile:
    """A committed record's data file as a table commit adds it."""

    path: str
    size: int
    stats: dict  # Delta-style statistics (``file_stats``)
    metadata: pq.FileMetaData
    partition: list | None  # the partition values of its rows (``Partitioning.first_values``)


@dataclass(frozen=True)
class TableState:
    """What one load of the table says: the log position it holds, its schema (None: no table
    yet), and the loaded handle a commit builds on (one load per publish)."""

    position: int
    schema: pa.Schema | None
    handle: Any = None


@dataclass
class PublishCounts:
    """What this process's publishing did: table commits, the records they published (its own
    and other writers'), and commits that lost a race to another writer (each retried after
    re-reading the table). Numbers only: they go into the summary and the progress line."""

    commits: int = 0
    records: int = 0
    conflicts: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"table_commits": self.commits, "records_published": self.records, "table_conflicts": self.conflicts}


#: claims of the table's commit slots (``TableSink.publish_due``), one object per slot won,
#: naming the host and process that publishes it
PUBLISH_DIR = "_cg_publish"
#: the newest log position a publisher published, written after its table commit (a hint:
#: never ahead of the table, so a writer that reads it past its records needs no table load)
PUBLISHED_HINT = f"{PUBLISH_DIR}/_published.json"
#: slot claims kept (older ones are removed by the winners)
SLOTS_KEPT = 16


class TableSink(LakeSink):
    """A lake sink whose publish is one table transaction (Delta, Iceberg) for every record
    the log holds ready, from every writer, in log order; the transaction records the highest
    position it publishes, so the table's recorded position says exactly which records it holds.

    Group commit. With a ``table_commit_interval`` (the job option of that name) a commit
    record is not published by its writer at once: wall-clock time is cut into slots of that
    length and the first writer to claim a slot (``Storage.create`` of ``_cg_publish/<slot>``:
    exactly one wins) publishes everything ready then, whoever committed it. A writer whose
    records are still unpublished when the next slot starts tries that one, from a timer
    thread (a follower with nothing new still sees its last records published), and ``flush``
    at the end of a run waits until its records are in the table. So a table gets at most
    about one commit per interval whatever the number of writers; conflicts happen only when
    a slot's winner races a recovery's or a maintenance commit, and are counted.

    Subclasses load the table once per publish (``load_state``) and commit a run of records'
    files (``commit_files``) or merged rows (``merge_rows``) so that the position and the data
    land together -- or raise ``TableConflict`` when another writer committed first."""

    ALL_STATISTICS = True
    #: seconds between the table's commits (0: every commit publishes at once)
    table_commit_interval: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.published = PublishCounts()
        self._own = 0  # the highest log position this process committed
        self._slot_tried = -1
        #: staged file -> its footer, partition values and size, as this writer wrote it
        self._written: dict[str, tuple[pq.FileMetaData, list | None, int]] = {}
        self._timer: threading.Thread | None = None
        self._wake = threading.Condition(threading.Lock())
        self._closing = False
        self._state: tuple[float, TableState] | None = None  # (monotonic time, the last load)
        self._claimant = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        self.store.ensure_dir(PUBLISH_DIR)

    @abc.abstractmethod
    def load_state(self) -> TableState:
        """The table as it stands now (one load)."""

    def merge_rows(self, records: list[dict], latest: pa.Table, state: TableState) -> bool:
        """One table transaction that merges ``latest`` (``MergeSpec.latest`` of ``records``'
        rows) by key and records the last record's position (``TableConflict`` when another
        writer committed first); False when the table, read again, holds the last record
        already (another publisher's commit): nothing committed."""
        raise SinkError(f"{type(self).__name__} has no merge")

    @abc.abstractmethod
    def commit_files(self, records: list[dict], files: list[DataFile], schema: pa.Schema, state: TableState) -> bool:
        """One table transaction: add ``files`` (of ``records``, in log order), record the last
        record's position, add ``schema``'s new columns; create the table from ``schema`` (and
        the partitioning) if there is none. False as ``merge_rows``."""

    @staticmethod
    def as_loaded(position: int, state: TableState, last: int) -> bool:
        """Whether a commit of the records through log position ``last``, planned on ``state``,
        may go ahead on the table as read again just before it (holding ``position``): False
        when another publisher committed them all meanwhile; ``TableConflict`` when it committed
        some (a table that did not exist when ``state`` was loaded, created and published by
        another writer since), which this commit would publish a second time."""
        if position >= last:
            return False
        if position != state.position:
            raise TableConflict(f"the table moved from log position {state.position} to {position} since it was read")
        return True

    def published_through(self) -> int:
        """The highest log position the table holds (0 if none or no table yet)."""
        return self._loaded().position

    def table_schema(self) -> pa.Schema | None:
        """The table's current schema (None if there is no table yet)."""
        return self._loaded().schema

    def _loaded(self, max_age: float = 0.0) -> TableState:
        """``load_state``, or the last load if younger than ``max_age`` seconds."""
        now = time.monotonic()
        if self._state is None or now - self._state[0] > max_age or self._state[1].schema is None:
            self._state = (now, self.load_state())
        return self._state[1]

    def publish_counts(self) -> dict[str, int]:
        return self.published.to_dict()

    def set_table_commit_interval(self, seconds: float) -> None:
        self.table_commit_interval = max(0.0, float(seconds))

    # -- schema ---------------------------------------------------------------------------

    def storable(self, table: pa.Table) -> pa.Table:
        target = utc_schema(table.schema)
        return table if target == table.schema else table.cast(target)

    def check_schema(self, schema: pa.Schema) -> None:
        if self.partitioning is not None:
            self.partitioning.check_schema(utc_schema(schema))
        if self.merge is not None:
            self.merge.check_schema(schema)
        # the table as loaded within the last second (a follower prepares several batches a
        # second, and an Iceberg load reads the catalog and the metadata file)
        current = self._loaded(max_age=1.0).schema
        if current is not None:
            new_columns(current, schema)

    # -- what the writer knows of its files -----------------------------------------------

    def wrote(self, staged: str, data: bytes, rows: pa.Table) -> None:
        """Keep a staged file's footer (parsed from the bytes just written) and partition for
        its publish: a writer that publishes its own files reads none of them again."""
        if len(self._written) > 4096:
            self._written.clear()  # a writer that never publishes (others always win): bounded
        values = self.partitioning.first_values(rows) if self.partitioning is not None and rows.num_rows else None
        self._written[staged] = (pq.read_metadata(pa.BufferReader(data)), values, len(data))

    def _footer(self, path: str) -> tuple[pq.FileMetaData, list | None]:
        """Another writer's file's footer and partition values (one open; ``None``: unpartitioned)."""
        f = pq.ParquetFile(self.store.filesystem().open_input_file(self.store.file_path(path)))
        values = None
        if self.partitioning is not None:
            first = f.read_row_group(0, columns=self.partitioning.columns).slice(0, 1)
            values = self.partitioning.first_values(first)
        return f.metadata, values

    def _data_files(self, record: dict) -> list[DataFile]:
        """A committed record's files as a table commit adds them (copied to their published
        names first), from what this writer kept, else from their footers."""
        self.copy_files(record)
        out = []
        for f in record["files"]:
            known = self._written.pop(f["staged"], None)
            if known is not None:
                md, values, size = known
            else:
                (md, values), size = self._footer(f["path"]), self.store.size(f["path"])
            _, stats = file_stats(metadata=md)
            out.append(DataFile(f["path"], size, stats, md, values))
        return out

    # -- publish: group commit in log order -----------------------------------------------

    def _ready(self, position: int) -> list[dict]:
        """The committed records after ``position`` that have files, in log order."""
        return sorted((r for r in self._log.commits.values() if r["pos"] > position and r["files"]),
                      key=lambda r: r["pos"])

    def publish(self, record: dict) -> None:
        """Publish ``record`` and every record ready before it (and after: one transaction takes
        all that are ready), now, whatever the interval (recovery, roll-forward)."""
        with self._lock:
            self._publish_ready()
            self.store.delete_tree(self.staging(record["gid"]))  # a record without files has nothing to show

    def _publish_ready(self) -> bool:
        """One table commit of every ready record; True if the table now holds them (this
        writer's commit, counted, or another publisher's found on reading the table again).
        Retries after a lost race (counted), re-reading the table; gives up after too many."""
        for _ in range(1000):
            self._log.refresh()
            state = self._loaded()
            pending = self._ready(state.position)
            if not pending:
                return False
            try:
                if self.merge is not None:
                    rows = pa.concat_tables([self._staged_rows(r, state) for r in pending], promote_options="default")
                    committed = self.merge_rows(pending, self.merge.latest(rows), state)
                else:
                    files = [f for r in pending for f in self._data_files(r)]
                    schema = pa.unify_schemas([f.metadata.schema.to_arrow_schema() for f in files])
                    committed = self.commit_files(pending, files, schema, state)
            except TableConflict as e:
                self._state = None
                self.published.conflicts += 1
                log.info("cg table commit lost a race, re-reading the table (%s)", str(e)[:200])
                continue
            self._state = None  # the table changed (this commit, or another publisher's)
            if committed:
                self.published.commits += 1
                self.published.records += len(pending)
            else:  # another publisher's commit holds them: a race lost, not a commit of this writer's
                self.published.conflicts += 1
            for r in pending:
                self.store.delete_tree(self.staging(r["gid"]))
            self._hint(pending[-1]["pos"])
            return True
        raise SinkError(f"could not publish log position {self._log.pos}: too many concurrent commits")

    def committed(self, record: dict) -> None:
        """After this writer's commit record: publish now (no interval), or in the current
        slot if this writer wins it, else later (the timer, ``flush``)."""
        self._own = max(self._own, record["pos"])
        if self.table_commit_interval <= 0:
            self.publish(record)
            return
        self._publish_in_slot()
        self._start_timer()

    def publish_due(self) -> bool:
        """Publish every ready record if this writer wins the current slot (``True``)."""
        with self._lock:
            return self._publish_in_slot()

    def _publish_in_slot(self) -> bool:
        slot = int(time.time() // self.table_commit_interval)
        if slot <= self._slot_tried:
            return False
        self._slot_tried = slot
        try:  # who publishes this slot, for an operator (and a test) to see
            self.store.create(f"{PUBLISH_DIR}/{slot:020d}", self._claimant)
        except FileExistsError:
            return False  # another writer publishes this slot
        if slot % SLOTS_KEPT == 0:
            self._prune_slots(slot)
        return self._publish_ready()

    def _prune_slots(self, slot: int) -> None:
        try:
            for name in self.store.list(PUBLISH_DIR):
                if name.isdigit() and int(name) < slot - SLOTS_KEPT:
                    self.store.delete_tree(f"{PUBLISH_DIR}/{name}")
        except OSError:
            pass  # a claim left behind costs nothing; the next pruning removes it

    def _hint(self, pos: int) -> None:
        try:
            self.store.write(PUBLISHED_HINT, json.dumps({"pos": pos}).encode())
        except OSError:
            pass  # a hint: readers fall back on the table

    def _hinted(self) -> int:
        try:
            return int(json.loads(self.store.read(PUBLISHED_HINT))["pos"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def unpublished(self) -> bool:
        """Whether a record this process committed is not in the table yet (the hint first: it
        is never ahead of the table; then the table)."""
        with self._lock:
            if not self._own or self._hinted() >= self._own:
                return False
            self._log.refresh()
            return any(r["pos"] <= self._own for r in self._ready(self._loaded().position))

    def flush(self) -> None:
        """Wait until every record this process committed is in the table, publishing in a
        slot it wins (at the end of a run: its batches are then readable)."""
        if self.table_commit_interval <= 0:
            with self._lock:
                if self.unpublished():
                    self._publish_ready()
            return
        while self.unpublished():
            if self.publish_due():
                continue
            time.sleep(max(0.01, self.table_commit_interval - time.time() % self.table_commit_interval))

    def _start_timer(self) -> None:
        with self._wake:
            if self._timer is not None or self._closing:
                self._wake.notify()
                return
            self._timer = threading.Thread(target=self._timer_loop, name=f"cg-publish-{self.store.location}",
                                           daemon=True)
            self._timer.start()

    def _timer_loop(self) -> None:
        """Each slot while this process has unpublished records: try to publish them."""
        while True:
            with self._wake:
                if self._closing:
                    return
                self._wake.wait(max(0.005, self.table_commit_interval - time.time() % self.table_commit_interval))
                if self._closing:
                    return
            try:  # the hint alone (no table load): a writer that loses the slot reads nothing more
                if self._own and self._hinted() < self._own:
                    self.publish_due()
            except Exception as e:  # noqa: BLE001 - the next commit or flush publishes (and raises)
                log.warning("cg table publish in the background failed (%s): the next commit retries",
                            str(e)[:200])

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        if self._timer is not None:
            self._timer.join(timeout=5)
        super().close()

    def roll_forward(self, commits: list[dict]) -> None:
        self.publish(commits[-1])  # publishes every record before it, in log order

    def _staged_rows(self, record: dict, state: TableState) -> pa.Table:
        """A committed record's rows, read from its staging (a merge publishes them, not the
        files). Staging is removed once its record is in the table: gone, it was published by
        another writer since ``state`` was read (a race lost: ``TableConflict``, the table is
        read again), unless the table still does not hold it."""
        tables = []
        for f in record["files"]:
            try:
                tables.append(self._read_parquet(f["staged"]))
            except FileNotFoundError:
                if self.load_state().position >= record["pos"]:
                    raise TableConflict(f"the staged rows of {record['gid']} were published by another writer "
                                        f"since the table was read at log position {state.position}") from None
                raise DatasetCorrupt(f"staged rows of {record['gid']} are missing before its merge was "
                                     "published") from None
        return pa.concat_tables(tables, promote_options="default")


class TableConflict(SinkError):
    """Another writer committed to the table first; re-read and try again."""
