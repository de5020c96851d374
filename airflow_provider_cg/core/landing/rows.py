"""The row schema of landed messages and the identity of a batch.

``ROW_SCHEMA`` is what every sink accepts (extra columns, e.g. a struct ``value`` parsed from a
JSON payload, are allowed and kept). ``headers`` is a JSON object as text (``{"k": "v"}``;
a repeated header maps to a list of strings; null without headers): Parquet, Spark and
PostgreSQL (``jsonb``) all read it without a map type. Sinks store ``timestamp`` with
microsecond precision (Spark and PostgreSQL have no nanosecond timestamps).

``BatchId.gid`` names one prepared write everywhere: a PostgreSQL global transaction id,
a staging directory, a commit-log record. Format::

    cg:<stream>:<group>:<member>:<batch_seq>:<uid>

with ``%`` and ``:`` percent-escaped inside names and ``uid`` 8 random hex digits, so a
batch number reused after an abort still gets a new gid. PostgreSQL limits a gid to 199 bytes.
"""

from __future__ import annotations

import gc
import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.partitioning import subject_matches
from airflow_provider_cg.core.jetstream.direct_gets import DirectReadError
from airflow_provider_cg.core.jetstream.protocol import PulledMsg

ROW_SCHEMA = pa.schema(
    [
        pa.field("origin_stream", pa.string(), nullable=False),
        pa.field("origin_seq", pa.int64(), nullable=False),
        pa.field("subject", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("key", pa.string()),
        pa.field("payload", pa.binary()),
        pa.field("payload_text", pa.string()),
        pa.field("headers", pa.string()),
        pa.field("timestamp", pa.timestamp("ns", tz="UTC")),
        pa.field("delivery_count", pa.int32()),
        pa.field("group", pa.string()),
        pa.field("member", pa.string()),
    ]
)
"""Columns of a landed row, in order. ``(origin_stream, origin_seq)`` is the dedupe key."""

KEY_COLUMNS = ("origin_stream", "origin_seq")
GID_PREFIX = "cg"
GID_MAX_LEN = 199  # PostgreSQL GIDSIZE is 200 bytes including the terminator

_UID_RE = re.compile(r"^[0-9a-f]{8}$")


def headers_to_json(headers: Mapping[str, str | list[str]] | None) -> str | None:
    """Encode NATS headers for the ``headers`` column (null when empty)."""
    if not headers:
        return None
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _esc(value: str) -> str:
    return value.replace("%", "%25").replace(":", "%3A")


def _unesc(value: str) -> str:
    return value.replace("%3A", ":").replace("%3a", ":").replace("%25", "%")


@dataclass(frozen=True)
class BatchId:
    """One batch of one member: ``gid`` encodes it and ``BatchId.parse(gid)`` reads it back."""

    stream: str
    group: str
    member: str
    batch_seq: int
    uid: str = field(default_factory=lambda: secrets.token_hex(4))

    def __post_init__(self) -> None:
        for name in ("stream", "group", "member"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(name, "must be a non-empty string")
            if any(ord(c) < 0x20 or c == "'" for c in value):
                raise ConfigError(name, "must not contain control characters or quotes")
        if not isinstance(self.batch_seq, int) or self.batch_seq < 0:
            raise ConfigError("batch_seq", "must be an integer >= 0")
        if not _UID_RE.match(self.uid):
            raise ConfigError("uid", "must be 8 lowercase hex digits")
        if len(self.gid.encode()) > GID_MAX_LEN:
            raise ConfigError("gid", f"stream, group and member names too long (gid > {GID_MAX_LEN} bytes)")

    @property
    def gid(self) -> str:
        return f"{self.member_prefix(self.stream, self.group, self.member)}{self.batch_seq}:{self.uid}"

    @staticmethod
    def group_prefix(stream: str, group: str) -> str:
        """The gid prefix shared by every batch of every member of one group (ends with ``:``)."""
        return f"{GID_PREFIX}:{_esc(stream)}:{_esc(group)}:"

    @staticmethod
    def member_prefix(stream: str, group: str, member: str) -> str:
        """The gid prefix shared by every batch of one member (ends with ``:``)."""
        return f"{BatchId.group_prefix(stream, group)}{_esc(member)}:"

    @classmethod
    def parse(cls, gid: str) -> BatchId:
        """Read a gid back; raises ``ConfigError`` for anything this module did not write."""
        parts = gid.split(":")
        if len(parts) != 6 or parts[0] != GID_PREFIX or not parts[4].isdigit():
            raise ConfigError("gid", f"not a consumer-group batch id: {gid!r}")
        return cls(_unesc(parts[1]), _unesc(parts[2]), _unesc(parts[3]), int(parts[4]), parts[5])

    @staticmethod
    def is_gid(gid: str) -> bool:
        try:
            BatchId.parse(gid)
        except ConfigError:
            return False
        return True

    def to_dict(self) -> dict:
        return {
            "stream": self.stream,
            "group": self.group,
            "member": self.member,
            "batch_seq": self.batch_seq,
            "uid": self.uid,
        }


# --- building rows from pulled messages ---------------------------------------------------------

_SOURCE_KEY = b"\r\nNats-Stream-Source:"
# Headers the server adds; their content is in other columns, so they are not kept in ``headers``.
_SYSTEM_HEADERS = frozenset({"Nats-Stream-Source", "Nats-Pin-Id"})


def user_headers(raw: bytes | None, server_headers: frozenset[str] = _SYSTEM_HEADERS) -> str | None:
    """JSON of the message's own headers (``server_headers`` dropped), or None."""
    if not raw:
        return None
    lines = raw.split(b"\r\n")[1:]
    out: dict[str, str | list[str]] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name:
            continue
        k = name.strip().decode("ascii", "replace")
        if k in server_headers:
            continue
        v = value.strip().decode("utf-8", "replace")
        prev = out.get(k)
        out[k] = v if prev is None else ([*prev, v] if isinstance(prev, list) else [prev, v])
    return headers_to_json(out)


class KeySelector:
    """The partitioning key of a subject: its partitioning-wildcard tokens joined with ``.``.

    With no wildcard indexes (whole-subject hashing) or for static groups the key is the
    whole subject (partition token stripped).
    """

    def __init__(self, filters: Iterable[tuple[str, Iterable[int]]]) -> None:
        self.rules: list[tuple[list[str], list[int]]] = []
        for f, wildcards in filters:
            tokens = f.split(".")
            stars = [i for i, t in enumerate(tokens) if t == "*"]
            self.rules.append((tokens, [stars[w - 1] for w in wildcards]))

    def key(self, subject: str) -> str:
        rules = self.rules
        if not rules:
            return subject
        tokens = subject.split(".")
        if len(rules) == 1:
            positions = rules[0][1]
        else:
            positions = next((p for f, p in rules if subject_matches(tokens, f)), [])
        if not positions:
            return subject
        return ".".join(tokens[i] for i in positions if i < len(tokens))


def build_rows(msgs: Sequence[PulledMsg], *, group: str, member: str, keys: KeySelector, sourced: bool) -> pa.Table:
    """Rows (``ROW_SCHEMA``) of pulled messages, in delivery order.

    ``sourced``: the messages come from an elastic group's work-queue stream, whose
    ``Nats-Stream-Source`` header names the origin stream and sequence; otherwise (static
    groups) the consumed stream is the origin. This loop runs once per message on the job's
    hot path, so it parses the ack subject and the header by hand, once each.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()  # hundreds of thousands of new objects would trigger full collections
    try:
        return _build_rows(msgs, group, member, keys, sourced)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build_rows(msgs: Sequence[PulledMsg], group: str, member: str, keys: KeySelector, sourced: bool) -> pa.Table:
    n = len(msgs)
    streams: list[str] = [""] * n
    seqs = [0] * n
    subjects: list[str] = [""] * n
    parts = [0] * n
    key_col: list[str] = [""] * n
    headers: list[str | None] = [None] * n
    ts = [0] * n
    delivered = [0] * n
    # Fast key path: one filter whose key is a single token at a fixed position.
    single = len(keys.rules) == 1 and len(keys.rules[0][1]) == 1
    pos = keys.rules[0][1][0] + 1 if single else 0
    key_of = keys.key
    plain_lines = 4 if sourced else 3  # CRLFs of a block holding only server-added headers
    find = _SOURCE_KEY
    flen = len(find)
    for i, m in enumerate(msgs):
        subject = m.subject
        tok = subject.split(".")
        parts[i] = int(tok[0])
        rest = subject[len(tok[0]) + 1 :]
        subjects[i] = rest
        key_col[i] = (tok[pos] if pos < len(tok) else rest) if single else key_of(rest)
        meta = m.metadata  # parsed once, by jetstream/protocol.py (v1 and v2 ack subjects)
        ts[i] = meta.timestamp_ns
        delivered[i] = meta.num_delivered
        raw = m._hdr
        if sourced and raw is not None:
            j = raw.find(find)
            if j >= 0:
                e = raw.find(b" ", raw.find(b" ", j + flen + 1) + 1)
                name, _, seq = raw[j + flen : e].strip().partition(b" ")
                streams[i] = name.split(b":", 1)[0].decode()
                seqs[i] = int(seq)
            else:
                streams[i], seqs[i] = meta.stream, meta.stream_seq
        else:
            streams[i], seqs[i] = meta.stream, meta.stream_seq
        if raw is not None and raw.count(b"\r\n") > plain_lines:
            headers[i] = user_headers(raw)
    return row_table(n, origin_stream=streams, origin_seq=seqs, subject=subjects, partition=parts, key=key_col,
                     payload=[m.data for m in msgs], headers=headers, timestamp=ts, delivery_count=delivered,
                     group=group, member=member)


#: a column of ``row_table``: an Arrow array, or a list of its values
Column: TypeAlias = "pa.Array | pa.ChunkedArray | list[Any]"


def row_table(n: int, *, origin_stream: Column, origin_seq: Column, subject: Column, partition: Column, key: Column,
              payload: Column, headers: Column | None = None, timestamp: Column, delivery_count: Column | None = None,
              group: str, member: str | Column) -> pa.Table:
    """The one place a ``ROW_SCHEMA`` table is assembled, by column name: each column an Arrow
    array or a list; ``headers`` and ``delivery_count`` null when not given; ``group`` (and
    ``member`` when a string) the same on every row."""

    def same(value: str) -> pa.Array:
        return pa.array(np.broadcast_to(np.array(value, dtype=object), n), pa.string())

    columns = {
        "origin_stream": origin_stream, "origin_seq": origin_seq, "subject": subject, "partition": partition,
        "key": key, "payload": payload, "payload_text": None, "headers": headers, "timestamp": timestamp,
        "delivery_count": delivery_count, "group": same(group),
        "member": same(member) if isinstance(member, str) else member,
    }
    arrays = []
    for f in ROW_SCHEMA:
        v = columns[f.name]
        if v is None:
            arrays.append(pa.nulls(n, f.type))
        elif isinstance(v, pa.Array | pa.ChunkedArray):
            arrays.append(v if v.type == f.type else v.cast(f.type))
        else:
            arrays.append(pa.array(v, f.type))
    return pa.Table.from_arrays(arrays, schema=ROW_SCHEMA)


# --- rows of direct gets (``jetstream/direct_gets.py``), parsed column-wise -------------------------

_TAIL = (r"Nats-Subject: (?P<subject>[^\r]*)\r\nNats-Sequence: (?P<seq>\d+)\r\n"
         r"Nats-Time-Stamp: (?P<ts>[^\r]*)\r\n")
_SOURCE = r"Nats-Stream-Source: (?P<stream>[^ \r:]+)[^ \r]* (?P<seq>\d+)"
# headers the server adds on sourcing and on a direct get: their content is in other columns
_SERVER_HEADERS = frozenset({"Nats-Pin-Id", "Nats-Stream-Source", "Nats-Stream", "Nats-Subject", "Nats-Sequence",
                             "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence"})
_SERVER_LINES = 9  # CRLFs of a sourced message's block with server-added headers only


def _binary(chunks: list[bytes]) -> pa.Array:
    blob = b"".join(chunks)
    offsets = np.zeros(len(chunks) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, chunks), np.int64, len(chunks)), out=offsets[1:])
    return pa.Array.from_buffers(pa.large_binary(), len(chunks), [None, pa.py_buffer(offsets), pa.py_buffer(blob)])


def keep_matching(batches: list, pattern: str) -> list:
    """The direct-get batches with only the messages whose subject matches ``pattern`` (a
    regular expression, ``config.subjects_regex``); batches left empty go."""
    kept = []
    for b in batches:
        if not len(b):
            continue
        subjects = pc.extract_regex(_binary(b.hdrs), _TAIL).field("subject").cast(pa.string())
        mine = pc.match_substring_regex(subjects, pattern).to_numpy(zero_copy_only=False)
        if not mine.all():
            idx = np.flatnonzero(mine)
            b.hdrs, b.data = [b.hdrs[i] for i in idx], [b.data[i] for i in idx]
        if len(b):
            kept.append(b)
    return kept


def rows_from_batches(batches: list, *, group: str, member: str, keys: KeySelector,
                      origin: str | None = None) -> tuple[pa.Table, np.ndarray]:
    """Rows (``ROW_SCHEMA``) of direct-get reads, batch after batch, each in stream order, and
    the messages' sequences in the stream read (the refs a sink keeps for recovery). By default
    the stream is a sourced work-queue stream (each message's ``Nats-Stream-Source`` header
    names its origin); ``origin``: the stream read is the origin itself (a static group).
    Parsed column-wise in Arrow, which releases the GIL: no per-message Python work except for
    messages that carry headers of their own."""
    hdrs = [h for b in batches for h in b.hdrs]
    data = [d for b in batches for d in b.data]
    n = len(hdrs)
    if n == 0:
        return ROW_SCHEMA.empty_table(), np.zeros(0, np.int64)
    blocks = _binary(hdrs)
    tail = pc.extract_regex(blocks, _TAIL)
    if origin is None:
        source = pc.extract_regex(blocks, _SOURCE)
        if tail.null_count or source.null_count:
            raise DirectReadError("direct get answer without the expected headers (not a sourced work-queue stream?)",
                                  retryable=False)
        origin_stream, origin_seq, server_lines = source.field("stream"), source.field("seq"), _SERVER_LINES
    else:
        if tail.null_count:
            raise DirectReadError("direct get answer without the expected headers", retryable=False)
        origin_stream = pa.array(np.broadcast_to(np.array(origin, dtype=object), n), pa.string())
        origin_seq, server_lines = tail.field("seq"), _SERVER_LINES - 1
    subject = tail.field("subject").cast(pa.string())
    head_rest = pc.split_pattern(subject, ".", max_splits=1)
    partition = pc.list_element(head_rest, 0).cast(pa.int32())
    rest = pc.list_element(head_rest, 1)
    key = _keys(rest, keys)
    headers: pa.Array = pa.nulls(n, pa.string())
    own = np.flatnonzero(pc.count_substring(blocks, "\r\n").to_numpy() > server_lines)
    if len(own):
        values: list[str | None] = [None] * n
        for i in own:
            values[i] = user_headers(hdrs[i], _SERVER_HEADERS)
        headers = pa.array(values, pa.string())
    # a direct get is no delivery: the consumer's delivery count does not apply (null)
    table = row_table(n, origin_stream=origin_stream, origin_seq=origin_seq.cast(pa.string()),
                      subject=rest, partition=partition, key=key, payload=_binary(data), headers=headers,
                      timestamp=tail.field("ts").cast(pa.string()), group=group, member=member)
    return table, tail.field("seq").cast(pa.string()).cast(pa.int64()).to_numpy()


def _keys(rest: pa.Array, keys: KeySelector) -> pa.Array:
    """The partitioning key of each subject (partition token already stripped)."""
    rules = keys.rules
    if not rules:
        return rest
    if len(rules) == 1 and len(rules[0][1]) == 1:  # one filter, key = one token: column-wise
        try:
            return pc.list_element(pc.split_pattern(rest, "."), rules[0][1][0])
        except pa.ArrowInvalid:  # a subject with fewer tokens: per row below
            pass
    return pa.array([keys.key(s) for s in rest.to_pylist()], pa.string())
