"""The two-phase sink contract used by the batch job.

Protocol per batch: ``prepare`` (the batch is durable in the sink's staging, invisible to
readers, and the later ``commit`` cannot fail for data reasons) -> ``mark_acking`` (durable
note that acks may now be sent) -> double-ack the messages in NATS -> ``commit``. ``abort``
only when certain that no ack took effect. At start a job calls ``recover(stream, group,
member)`` and finishes every write it returns: ``acking=False`` means no ack was ever sent,
so aborting is safe; ``acking=True`` means commit (or check the stored ``refs`` against
NATS). Because every sink dedupes by ``(origin_stream, origin_seq)`` against everything
committed, committing a recovered write is always safe (redelivered messages are dropped as
duplicates later); aborting only avoids landing rows that will come again anyway.

``commit`` and ``abort`` are idempotent and race-safe against each other: the first one to
take effect wins; ``commit`` after an abort raises ``PreparedWriteLost``, ``abort`` after a
commit returns ``WriteState.COMMITTED``.

Fencing. Per-key order across a takeover needs more than the pin: an instance that lost the
pin (stalled, stepped down, revoked) may wake up and ack and commit an old batch after its
successor landed newer rows of the same keys. So a new pin holder first calls ``fence``: it
records itself as the owner of its partitions (per stream and group) in the sink. A write
prepared with a ``Fence`` can be marked ``acking`` only while its owner still owns every one
of its partitions, decided atomically against later ``fence`` calls. After its ``fence``, the
successor's ``recover(..., partitions=...)`` finishes every write that touches its partitions,
whichever member wrote it (a dropped or remapped member's orphans included): writes already
marked acking are committed, the others rolled back. From then on no fenced-out instance can
start acking, so nothing it still holds can land after the successor's rows.

Spark. A batch computed by Spark (decoding, the user's transformation) reaches the sink as
a DataFrame: ``stage`` runs the Spark job that computes it and puts the result where
``prepare`` takes it from (the Parquet sink: files written by Spark tasks into the write's
staging directory; the default: an Arrow table in the driver, for sinks whose prepare runs
there, like PostgreSQL's prepared transaction); ``discard`` drops a staged result that will
not be prepared.
"""

from __future__ import annotations

import abc
import base64
import enum
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError
from airflow_provider_cg.core.landing.rows import KEY_COLUMNS, ROW_SCHEMA, BatchId
from airflow_provider_cg.core.landing.stream_life import Life, LifeChoice, OriginKeys, OriginMark

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

MessageRefs = Sequence[tuple[str, int]] | Mapping[str, Any]
"""(consumed stream, stream sequence) pairs, or ``{stream: array of sequences}`` (faster)."""


class SinkError(ConsumerGroupError):
    """A sink operation failed. Messages never contain credentials."""


class SchemaMismatch(SinkError, ConfigError):
    """A batch the table cannot take (a column of another type, a required column missing)."""

    def __init__(self, column: str, rule: str) -> None:
        ConfigError.__init__(self, f"column {column!r}", rule)


class PreparedWriteLost(SinkError):
    """``commit`` found the prepared write rolled back or gone: its rows are not in the sink."""


class FencedOut(PreparedWriteLost):
    """``mark_acking`` refused: another instance fenced one of the write's partitions since."""


class InputsTaken(SinkError):
    """A write of a transformation's output may not be acknowledged: another writer (a backfill,
    a replay, another instance) committed some of its input messages since it was computed.
    Nothing was acknowledged; the caller rolls the write back and computes the batch again
    without them (they are committed now). ``taken``: ``{origin_stream: sorted origin_seqs}``."""

    def __init__(self, message: str, taken: Mapping[str, np.ndarray] | None = None) -> None:
        super().__init__(message)
        self.taken = dict(taken or {})


class SinkLockTimeout(SinkError, TimeoutError):
    """A write waited longer than the lock timeout for rows held by another (prepared) write."""


class WriteState(enum.StrEnum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class CommitResult:
    """Rows that landed and rows dropped as duplicates (in-batch or already committed)."""

    rows_written: int
    duplicates_skipped: int


@dataclass(frozen=True)
class Fence:
    """Who may ack writes of some partitions of a group: ``owner`` is one job instance's id
    (unique per run), ``partitions`` the member's partitions it fenced, numbered among
    ``partition_count`` (the group's ``max_members`` then; a resize renumbers them)."""

    owner: str
    partitions: tuple[int, ...]
    partition_count: int | None = None

    def __post_init__(self) -> None:
        if not self.owner:
            raise SinkError("fence: owner must be a non-empty string")
        object.__setattr__(self, "partitions", tuple(sorted({int(p) for p in self.partitions})))

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"owner": self.owner, "partitions": list(self.partitions)}
        if self.partition_count is not None:
            out["partition_count"] = self.partition_count
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Fence | None:
        return cls(data["owner"], tuple(data["partitions"]), data.get("partition_count")) if data else None


@dataclass(frozen=True)
class LastCommit:
    """A member's latest committed batch, as its sink recorded it: what ``cg lag`` shows."""

    member: str
    batch_id: str
    committed_at: str  # ISO 8601, UTC
    rows_written: int
    origin: dict  # origin stream -> {"first_seq", "last_seq", "messages"}


def origin_ranges(keys: Mapping[str, np.ndarray]) -> dict:
    """``{stream: {"first_seq", "last_seq", "messages"}}`` of sorted unique origin sequences."""
    return {s: {"first_seq": int(q[0]), "last_seq": int(q[-1]), "messages": int(len(q))}
            for s, q in keys.items() if len(q)}


@dataclass(frozen=True, eq=False)
class PreparedWrite:
    """A durable, uncommitted write. ``refs`` maps consumed stream -> sorted unique sequences."""

    batch_id: BatchId
    rows: int
    refs: Mapping[str, np.ndarray] = field(repr=False)
    token: str = ""  # sink-specific handle (staging directory, gid)
    acking: bool = False  # mark_acking() was (or may have been) recorded: acks may have been sent
    fence: Fence | None = None  # the fence it was prepared under (None: not fenced, e.g. a backfill)

    @property
    def gid(self) -> str:
        return self.batch_id.gid

    @property
    def message_refs(self) -> list[tuple[str, int]]:
        """The refs as (stream, seq) pairs (built on demand; use ``refs`` for large batches)."""
        return [(s, int(q)) for s, seqs in self.refs.items() for q in seqs]

    def iter_ref_ranges(self) -> Iterator[tuple[str, int, int]]:
        """(stream, first, last) for each run of consecutive sequences."""
        for stream, seqs in self.refs.items():
            for first, last in seq_ranges(seqs):
                yield stream, first, last


class TwoPhaseSink(abc.ABC):
    """Prepare / commit / abort / recover, deduplicating by ``(origin_stream, origin_seq)``."""

    #: the upsert rule (``merging.MergeSpec``), if the sink merges by key
    merge: Any = None
    #: where the table's files are, when its catalog decides it (Iceberg): lineage names a table
    #: by its location (the summary's ``table_location``); None where the options say it
    table_location: str | None = None

    def route_location(self, route: str) -> str | None:
        """``table_location`` of a route's table (a routed sink's; others have one table)."""
        return self.table_location

    def refusals(self, table: pa.Table) -> dict[int, str]:
        """Rows of a batch this sink cannot take, whatever else is in the table (a record without
        its merge key): row index -> why. The pipeline takes their messages out of the batch
        before ``prepare`` (``pipeline/processing.py``)."""
        return self.merge.refusals(table) if self.merge is not None else {}

    def refusal_column(self, columns: list[str]) -> Column | None:
        """``refusals`` as a Spark column (why, or null) over a DataFrame with ``columns``; None
        when the sink refuses no row."""
        return self.merge.refusal_column(columns) if self.merge is not None else None

    @abc.abstractmethod
    def fence(self, stream: str, group: str, fence: Fence) -> None:
        """Make ``fence.owner`` the only instance that may mark writes of ``fence.partitions``
        of this group ``acking`` from now on (ordered against every ``mark_acking``)."""

    @abc.abstractmethod
    def prepare(self, batch_id: BatchId, table: pa.Table, *, message_refs: MessageRefs,
                fence: Fence | None = None, input_keys: dict[str, np.ndarray] | None = None,
                origin_mark: OriginMark | None = None) -> PreparedWrite:
        """Make the batch durable but invisible; store ``message_refs`` (and ``fence``) with it
        for recovery, and ``origin_mark`` (the origin's last message the batch read, as the
        origin stored it) so that the commit records it.

        ``input_keys`` (``{origin_stream: origin_seqs}``): the rows are a transformation's
        output, not one row per message; exactly-once is kept per input message instead: the
        sink records these keys as committed with the batch (and does not deduplicate rows).
        The caller drops inputs already committed (``committed_keys_exist``) beforehand; a sink
        that decides at prepare which writer gets an input (PostgreSQL) raises ``InputsTaken``
        here when another write committed one meanwhile."""

    def stage(self, batch_id: BatchId, frame: DataFrame) -> Any:
        """Compute a Spark DataFrame (a Spark action) into what ``prepare`` takes as rows.
        Default: an Arrow table in the driver."""
        return frame.toArrow()

    def discard(self, staged: Any) -> None:  # noqa: B027 - nothing to drop by default
        """Drop a ``stage`` result that will not be prepared (its batch failed)."""

    @abc.abstractmethod
    def mark_acking(self, prepared: PreparedWrite) -> PreparedWrite:
        """Durably record that acks are about to be sent (call before the first ack).

        Returns the write with ``acking=True``; raises ``PreparedWriteLost`` if it was aborted,
        ``FencedOut`` if the write has a fence whose owner no longer owns all its partitions,
        ``InputsTaken`` if it holds a transformation's output and another write committed one
        of its inputs. Exactly one of two writes sharing an input is ever acked: once a write is
        marked, no other write of the same inputs is marked or committed before it commits."""

    @abc.abstractmethod
    def commit(self, prepared: PreparedWrite) -> CommitResult:
        """Make the prepared rows visible, minus duplicates. Idempotent."""

    @abc.abstractmethod
    def abort(self, prepared: PreparedWrite) -> WriteState:
        """Discard the prepared rows (``ABORTED``), or report ``COMMITTED`` if commit won. Idempotent."""

    @abc.abstractmethod
    def abort_unless_acking(self, prepared: PreparedWrite) -> WriteState:
        """Recovery's abort, decided atomically against ``mark_acking``: exactly one wins.

        ``ABORTED`` (or ``COMMITTED`` if commit won) as ``abort``; ``PREPARED`` when a
        ``mark_acking`` was recorded first: the write was not touched and the caller must commit
        it (acks may have been sent). Once this returned ``ABORTED``, ``mark_acking`` raises
        ``PreparedWriteLost``; once ``mark_acking`` returned, this never aborts."""

    @abc.abstractmethod
    def recover(self, stream: str, group: str, member: str, partitions: Iterable[int] = (),
                partition_count: int | None = None) -> list[PreparedWrite]:
        """Writes that are prepared and neither committed nor aborted, oldest first: this
        member's, any member's of the group whose fence shares one of ``partitions``, and (given
        ``partition_count``) any whose fence numbered partitions among another count."""

    @abc.abstractmethod
    def state(self, prepared: PreparedWrite) -> WriteState:
        """Where a prepared write stands now."""

    def last_commits(self, stream: str, group: str) -> dict[str, LastCommit]:
        """Per member of the group: its latest committed batch ({} where the sink keeps no record)."""
        return {}

    @abc.abstractmethod
    def stream_life(self, stream: str, created: str, choice: LifeChoice | None = None,
                    like: Sequence[Life] = ()) -> OriginKeys:
        """The keys the messages of origin ``stream`` created at ``created`` land under (their
        rows' ``origin_stream``, by sequence), recording the lives the sink did not hold
        (``stream_life.to_record``: raises ``StreamLifeChanged`` for an unknown life without
        ``choice``; a checked ``went-back`` choice records the life after the rollback; ``like``:
        the lives a sink holding none of the stream takes). Atomic against other writers
        recording a life of the same stream."""

    @abc.abstractmethod
    def stream_lives(self, stream: str) -> list[Life]:
        """The lives of origin ``stream`` the sink holds, oldest first (read only)."""

    @abc.abstractmethod
    def origin_mark(self, key: str) -> OriginMark | None:
        """The highest mark a committed write recorded under origin ``key`` (``prepare``'s
        ``origin_mark``): what ``protocol/origin_guard.py`` checks the origin still holds."""

    @abc.abstractmethod
    def committed_keys_exist(self, origin_stream: str, seqs: Iterable[int]) -> np.ndarray:
        """Boolean mask: which ``seqs`` of ``origin_stream`` are already committed."""

    def flush(self) -> None:  # noqa: B027 - most sinks publish at commit
        """Return once every write this instance committed is visible to readers (a table sink's
        group commit may publish later than the commit, ``tables.py``); the end of a run calls it."""

    def set_table_commit_interval(self, seconds: float) -> None:  # noqa: B027 - only table sinks group commits
        """Publish committed writes together at most once per ``seconds`` (``tables.py``)."""

    def publish_counts(self) -> dict[str, int]:
        """What this instance's table commits did (``tables.PublishCounts``); empty for a sink
        whose commit is its publish."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (no-op by default)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# helpers shared by the sinks


def conform_table(table: pa.Table) -> pa.Table:
    """Cast the ``ROW_SCHEMA`` columns to their types (adding absent nullable ones as nulls),
    keep extra columns after them, and reject null keys."""
    if not isinstance(table, pa.Table):
        raise SinkError(f"expected a pyarrow.Table, got {type(table).__name__}")
    for name in KEY_COLUMNS:
        if table.schema.get_field_index(name) < 0:
            raise SinkError(f"table has no {name!r} column")
    columns, fields = [], []
    for f in ROW_SCHEMA:
        idx = table.schema.get_field_index(f.name)
        if idx < 0:
            col = pa.nulls(table.num_rows, f.type)
        else:
            col = table.column(idx)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SinkError(f"column {f.name!r}: cannot cast {col.type} to {f.type}: {exc}") from None
        if not f.nullable and col.null_count:
            raise SinkError(f"column {f.name!r} has {col.null_count} null values")
        columns.append(col)
        fields.append(f)
    for f in table.schema:
        if ROW_SCHEMA.get_field_index(f.name) < 0:
            columns.append(table.column(f.name))
            fields.append(f)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def keys_by_stream(table: pa.Table) -> dict[str, np.ndarray]:
    """``{origin_stream: origin_seq array}`` in row order (no copy for a single stream)."""
    streams = table.column("origin_stream")
    seqs = table.column("origin_seq")
    uniq = pc.unique(streams).to_pylist()
    if len(uniq) == 1:
        return {uniq[0]: seqs.to_numpy()}
    out = {}
    for s in uniq:
        out[s] = seqs.filter(pc.equal(streams, s)).to_numpy()
    return out


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted unique values (``np.unique`` is much slower on numpy 2.4 for int64)."""
    srt = np.sort(np.asarray(values, dtype=np.int64))
    if len(srt) < 2:
        return srt
    keep = np.empty(len(srt), dtype=bool)
    keep[0] = True
    np.not_equal(srt[1:], srt[:-1], out=keep[1:])
    return srt if keep.all() else srt[keep]


def _first_of_each(keys: np.ndarray) -> np.ndarray | None:
    order = np.argsort(keys, kind="stable")
    srt = keys[order]
    dup = srt[1:] == srt[:-1]
    if not dup.any():
        return None
    mask = np.ones(len(keys), dtype=bool)
    mask[order[1:][dup]] = False  # a stable sort puts the first occurrence first
    return mask


def first_occurrence_mask(table: pa.Table) -> np.ndarray | None:
    """Mask keeping the first row of each ``(origin_stream, origin_seq)``; None if no duplicates."""
    if table.num_rows < 2:
        return None
    streams = table.column("origin_stream")
    seqs = table.column("origin_seq").to_numpy()
    if pc.count_distinct(streams).as_py() == 1:
        srt = np.sort(seqs)
        if not (srt[1:] == srt[:-1]).any():
            return None
        return _first_of_each(seqs)
    mask = np.ones(len(seqs), dtype=bool)
    found = False
    for stream in pc.unique(streams).to_pylist():
        rows = np.nonzero(pc.equal(streams, stream).to_numpy(zero_copy_only=False))[0]
        sub = _first_of_each(seqs[rows])
        if sub is not None:
            mask[rows[~sub]] = False
            found = True
    return mask if found else None


def normalize_refs(message_refs: MessageRefs) -> dict[str, np.ndarray]:
    """Refs as ``{stream: sorted unique int64 array}``."""
    out: dict[str, np.ndarray] = {}
    if isinstance(message_refs, Mapping):
        items = message_refs.items()
    else:
        grouped: dict[str, list[int]] = {}
        refs = list(message_refs)
        if refs:
            streams, seqs = zip(*refs, strict=True)
            if len(set(streams)) == 1:
                grouped[streams[0]] = list(seqs)
            else:
                for s, q in refs:
                    grouped.setdefault(s, []).append(q)
        items = grouped.items()
    for stream, seqs in items:
        if not isinstance(stream, str) or not stream:
            raise SinkError("message_refs: stream names must be non-empty strings")
        arr = sorted_unique(np.asarray(seqs, dtype=np.int64))
        if len(arr) and arr[0] < 1:
            raise SinkError("message_refs: stream sequences start at 1")
        out[stream] = arr
    return out


def seq_ranges(seqs: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive values of a sorted unique array as inclusive (first, last) pairs."""
    if len(seqs) == 0:
        return []
    breaks = np.nonzero(np.diff(seqs) != 1)[0]
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(seqs) - 1]))
    return [(int(seqs[a]), int(seqs[b])) for a, b in zip(starts, ends, strict=True)]


def encode_seqs(seqs: np.ndarray) -> str:
    """Sorted int64 sequences -> compact text (zlib of the deltas, base64)."""
    arr = np.asarray(seqs, dtype="<i8")
    deltas = np.diff(arr, prepend=np.int64(0)).astype("<i8")
    return base64.b64encode(zlib.compress(deltas.tobytes(), 1)).decode("ascii")


def decode_seqs(text: str) -> np.ndarray:
    deltas = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<i8")
    return np.cumsum(deltas, dtype=np.int64)


def encode_refs(refs: Mapping[str, np.ndarray]) -> dict[str, str]:
    return {stream: encode_seqs(seqs) for stream, seqs in refs.items()}


def decode_refs(encoded: Mapping[str, str]) -> dict[str, np.ndarray]:
    return {stream: decode_seqs(text) for stream, text in encoded.items()}


def isin_sorted(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Mask of ``values`` present in the sorted array ``sorted_keys``."""
    if len(sorted_keys) == 0 or len(values) == 0:
        return np.zeros(len(values), dtype=bool)
    idx = np.searchsorted(sorted_keys, values)
    idx[idx >= len(sorted_keys)] = len(sorted_keys) - 1
    return sorted_keys[idx] == values


def recovered_by(batch_id: BatchId, fence: Fence | None, stream: str, group: str, member: str,
                 partitions: frozenset[int], partition_count: int | None = None) -> bool:
    """Whether ``recover(stream, group, member, partitions, partition_count)`` must finish this
    write: it is the member's own, or its fence shares a partition the caller fenced (e.g. a
    dropped member's orphan, or a write of the partition's previous owner), or its fence
    numbered partitions among another count (a write from before a resize: any of its keys may
    be the caller's now)."""
    if batch_id.stream != stream or batch_id.group != group:
        return False
    if batch_id.member == member:
        return True
    if fence is None:
        return False
    if partition_count is not None and fence.partition_count not in (None, partition_count):
        return True
    return not partitions.isdisjoint(fence.partitions)

