"""The member job's contract: what the operator passes, what the job accepts, what it answers.

One written boundary between ``ConsumerGroupSparkSubmitOperator`` (Airflow) and
``spark_apps/cg_member_job.py`` (a Spark driver without Airflow):

- ``MemberJobSpec``: every option with its type, default and rules. The operator builds it
  from its rendered fields, the job parses its argv into it (``from_argv``), both through
  ``MemberJobSpec.build``, so whatever the job would refuse the operator refuses first, before
  spark-submit starts. ``to_argv`` writes the command line back (nothing secret is ever an
  option: NATS settings travel as ``CG_NATS_*``, the PostgreSQL DSN as ``CG_PG_DSN``).
  ``BatchOptions``, its first part, is what the landing engine reads.
- ``Summary``: the job's answer, the last stdout line ``CG_SUMMARY {json}`` and the
  ``--summary-file``; results and the exit codes (0 done, 1 invalid input or a failing
  transformation: do not retry, 2 server or database: retry). A failed run writes a summary
  too (result ``failed``, ``exit_code``, ``error``), so the operator can tell the two apart.

Errors are ``ConfigError(field, rule)`` with the field's name as spelled here; the job shows a
field as its flag (``--max-deliver``), the operator as its parameter (``max_deliver``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.consumers import STATIC_ACK_WAIT
from airflow_provider_cg.core.landing.fields import Seconds, check_fields, converted, flag, option
from airflow_provider_cg.core.landing.modes import PayloadFormat, ReadMode
from airflow_provider_cg.core.landing.sinks.options import (
    SINK_FIELDS,
    SinkOptions,
    check_sink,
)
from airflow_provider_cg.core.landing.sinks.registry import sink_kind
from airflow_provider_cg.core.landing.stream_life import LifeChoice

EXIT_OK, EXIT_INVALID, EXIT_SERVER = 0, 1, 2
SUMMARY_PREFIX = "CG_SUMMARY "

RESULT_COMMITTED = "committed"
RESULT_EMPTY = "empty"
RESULT_NOT_PINNED = "not-pinned"
RESULT_REVOKED = "revoked"  # the member's consumer was deleted (membership change) before anything landed
RESULT_FAILED = "failed"  # exit 1 or 2: the summary carries ``exit_code`` and ``error``
RESULT_SUBMITTED = "submitted"  # the operator's, for a cluster-mode driver that keeps its summary
#: results that end the Airflow task as skipped: nothing was there or it was not this task's to land
SKIP_RESULTS = frozenset({RESULT_EMPTY, RESULT_NOT_PINNED, RESULT_REVOKED})

BAD_RECORDS = ("dead-letter", "fail")
ELASTIC_ACK_WAIT = 5.0  # orbit's default: its instances then find the consumer equal to theirs
ACK_TIMEOUT = 30.0  # how long the job keeps resolving acks of unknown outcome before it commits anyway


@dataclass(frozen=True)
class BatchOptions:
    """What one consumption run lands and for how long: the part of the contract the landing
    engine reads (live batches and backfills). Durations are seconds."""

    stream: str = option(help="origin stream of the group")
    group: str = option(help="the consumer group")
    member: str | None = option(help="the member to consume as (required unless backfilling)")
    batch_size: int = option(100_000, int, "messages per two-phase batch", positive=True)
    batch_bytes: int | None = option(None, int, "a batch's payload budget in bytes: batches are sized from the "
                                     "payloads read so far to stay about within it (the first batch reads at most "
                                     "1,000 messages to measure them); with --batch-size it bounds what a follower "
                                     "that is behind takes at once", positive=True)
    max_messages: int | None = option(None, int, "stop after this many messages", positive=True)
    max_bytes: int | None = option(None, int, "stop after this many payload bytes", positive=True)
    max_seconds: float | None = option(None, float, "stop after this many seconds", positive=True)
    follow: float | None = option(None, Seconds, "keep the pin and land new messages as they arrive for this "
                                "long (seconds, or 90s, 10m, 1h), then finish the last batch, commit and release the pin (without it, a "
                                "run lands the backlog it found and ends)", positive=True)
    commit_interval: float = option(1.0, float, "with --follow: the longest a message read waits for its batch's "
                                  "commit when messages trickle (a batch is cut at --batch-size or this)",
                                  positive=True)
    handover_wait: float = option(0.0, float, "with --follow: once its follow time is over, a follower goes on "
                                  "landing until the member's next follower is warm and waiting for the pin, at most "
                                  "this many seconds, then passes the pin on within a batch (0, the default: it ends "
                                  "at its follow time)")
    join: bool = option(False, bool, "an overflow member: the run adds its member to the (elastic) group once it "
                        "is warm (Spark started, its warm-up done), lands what its partitions hold, then drops the "
                        "member before it ends, so its partitions move to it when it can serve them and move back "
                        "as it leaves (a member with mappings joins stickily, else as the group's members list)")
    table_commit_interval: float | None = option(None, float, "Delta and Iceberg: the longest a committed batch "
                                                "waits to be published; the members' batches ready in an interval "
                                                "are published together, one table commit (default: "
                                                "--commit-interval)", positive=True)
    standby_timeout: float = option(30.0, float, "seconds to wait for the pin", positive=True)
    ack_wait: float | None = option(None, float, "ack wait (s) of a member consumer the job creates (default: "
                                  f"orbit's {ELASTIC_ACK_WAIT:g} s for elastic groups, {STATIC_ACK_WAIT:g} s for "
                                  "static ones); an existing one is used as it is", positive=True)
    max_ack_pending: int | None = option(None, int, "max_ack_pending of a member consumer the job creates (default: "
                                       "none for elastic groups, as orbit's library; for static ones 3 batches, at "
                                       "least 1000). To share a member with orbit's cg CLI, which uses 1 with ack "
                                       "wait 2 s, give both; an existing one is used as it is", positive=True)
    max_deliver: int = option(5, int, "deliveries of a poison message before it is dead-lettered (>= 2)",
                            positive=True)
    idle_timeout: float = option(2.0, float, "a pull this long with nothing ends the run", positive=True)
    progress_interval: float = option(5.0, float, "seconds between progress lines", positive=True)
    read: ReadMode = option(ReadMode.AUTO, ReadMode, "auto: the driver reads by batched direct gets (an elastic group's "
                     "partitions, acked by one purge each; a static member's subjects, acked by moving its "
                     "durable; 2.14+); executors: the same, read by the batch's Spark tasks (needs Spark); "
                     "consumer: pulls and a double ack per message")
    stream_life: str | None = option(help="land an origin stream the table cannot place (stream_life.py): "
                                   "new:<created> lands a stream deleted and created again as a new stream beside "
                                   "the old one, continue:<created> as the same messages (a restored backup, "
                                   "checked against what the table landed); went-back:<seq> lands the messages "
                                   "of an origin whose store went back to <seq> under a life of their own; "
                                   "<created> and <seq> as the job's refusal prints them")

    def consumer_ack_wait(self, elastic: bool) -> float:
        """The ack wait of a member consumer this run creates."""
        if self.ack_wait is not None:
            return self.ack_wait
        return ELASTIC_ACK_WAIT if elastic else STATIC_ACK_WAIT

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_deliver < 2:
            raise ConfigError("max_deliver", "must be >= 2 so a poison message is retried once")
        if not 0 <= self.handover_wait < float("inf"):
            raise ConfigError("handover_wait", "must be a number of seconds >= 0")
        LifeChoice.parse(self.stream_life)


@dataclass(frozen=True)
class MemberJobSpec(SinkOptions, BatchOptions):
    """Everything one member job run is given (see the module docstring)."""

    payload_format: PayloadFormat = option(PayloadFormat.RAW, PayloadFormat, "how Spark decodes payloads (avro needs Spark's Avro package: "
                               "--packages)")
    json_schema: str | None = option(help="Spark DDL schema of JSON payloads, e.g. 'id BIGINT, amount DOUBLE'")
    avro_schema: str | None = option(help="Avro record schema (JSON) of Avro payloads (binary-encoded datums)")
    transform: str | None = option(help="your transformation, package.module:function: called with each batch as "
                                 "a Spark DataFrame and a BatchContext, returns the DataFrame to land")
    transform_sql: str | None = option(help="or a Spark SQL statement over the temporary view 'batch'")
    backfill_start: str | None = option(help="backfill mode: window start (ISO 8601, inclusive; naive = UTC)")
    backfill_end: str | None = option(help="backfill mode: window end (ISO 8601, exclusive)")
    bad_records: str = option("dead-letter", str, "a record its table cannot take (a merge key null or missing): "
                            "dead-letter moves its message to the dead-letter stream with the reason and lands the "
                            "rest; fail ends the run with exit 1 naming the column, nothing acknowledged",
                            BAD_RECORDS)
    no_spark: bool = option(False, bool, "run without a SparkSession (raw/text payloads only)")
    summary_file: str | None = option(help="also write the summary JSON to this file (atomically)")

    @property
    def backfill(self) -> bool:
        return bool(self.backfill_start or self.backfill_end)

    @property
    def transforming(self) -> bool:
        return bool(self.transform or self.transform_sql)

    def window(self) -> tuple[dt.datetime, dt.datetime]:
        """The backfill window as UTC datetimes (validated: both given, end after start)."""
        return parse_time("backfill_start", self.backfill_start), parse_time("backfill_end", self.backfill_end)

    def __post_init__(self) -> None:
        BatchOptions.__post_init__(self)
        _check_job(self)

    @property
    def sink_options(self) -> SinkOptions:
        return SinkOptions.of(self)

    # --- building ------------------------------------------------------------------------

    @classmethod
    def build(cls, values: Mapping[str, Any]) -> MemberJobSpec:
        """A spec from field values as the operator renders them or argv carries them: text
        is converted by each field's kind; ``None`` is the default. ``ConfigError`` names the
        first field that breaks a rule."""
        return cls(**converted(values, cls, "an option of the member job"))

    @classmethod
    def check_known(cls, values: Mapping[str, Any], unknown: set[str]) -> None:
        """What can be checked before the ``unknown`` fields are known (Jinja templates at DAG
        parse time): the known fields with the defaults standing in for the unknown ones, and
        no rule that involves an unknown field."""
        known = {k: v for k, v in values.items() if k not in unknown}
        try:
            cls.build(known)
        except ConfigError as e:
            if not _involves(e.field, unknown):
                raise

    @classmethod
    def from_argv(cls, argv: list[str]) -> MemberJobSpec:
        """Parse the job's command line (``UsageError`` for what argparse refuses)."""
        parser = job_parser()
        ns = parser.parse_args(argv)
        return cls.build(vars(ns))

    def to_argv(self) -> list[str]:
        """The job's command line for this spec: identity, then every option not at its default."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (value == f.default and f.name not in ("stream", "group")):
                continue
            if f.metadata["kind"] is bool:
                out.append(flag(f.name))
            else:
                out += [flag(f.name), _plain(value)]
        return out

    def values(self) -> dict[str, Any]:
        """Plain values (a ``ReadMode`` as its text), as ``build`` takes them."""
        return {k: str(v) if isinstance(v, enum.Enum) else v for k, v in dataclasses.asdict(self).items()}

    # --- checks of the machine the driver runs on -----------------------------------------

    def check_local_paths(self) -> None:
        """Each local table directory (the lake, a Delta table's; every route's) can be created
        and written by this user, here (the job checks it on its driver; the operator too when
        the driver runs on its machine)."""
        for route, options in self.tables():
            field = "sink_path" if route is None else f"routes.{route}.sink_path"
            if "sink_path" not in sink_kind(options.sink).location or not options.sink_path \
                    or "://" in options.sink_path:
                continue
            path = os.path.abspath(options.sink_path)
            if os.path.exists(path) and not os.path.isdir(path):
                raise ConfigError(field, f"{options.sink_path!r} exists and is not a directory")
            existing = path
            while not os.path.exists(existing):
                existing = os.path.dirname(existing)
            if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
                raise ConfigError(field, f"{options.sink_path!r} is not writable (by this user)")


class UsageError(ConfigError):
    """A command line argparse refuses (unknown option, a flag without its value)."""

    def __init__(self, message: str) -> None:
        super().__init__("usage", message)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # noqa: D102 - argparse's hook: exit 1 with one line, not exit 2
        raise UsageError(message)


def job_parser() -> argparse.ArgumentParser:
    """The member job's command line, made from its contract's fields (the docs print its help)."""
    p = _Parser(prog="cg_member_job", description="Land one member's backlog of a consumer group into a sink.",
                argument_default=None)
    for f in dataclasses.fields(MemberJobSpec):
        meta = f.metadata
        if meta["kind"] is bool:
            p.add_argument(flag(f.name), dest=f.name, action="store_true", default=None, help=meta["help"])
        else:
            p.add_argument(flag(f.name), dest=f.name, metavar=f.name.upper(), help=meta["help"])
    return p


def parse_time(name: str, value: Any) -> dt.datetime:
    """A timezone-aware UTC datetime from a datetime or an ISO 8601 string (naive = UTC)."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(name, f"must be an ISO 8601 date-time such as 2026-01-01T09:00:00Z (got {value!r})") \
                from None
    if not isinstance(value, dt.datetime):
        raise ConfigError(name, f"must be an ISO 8601 date-time (got {value!r})")
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def _check_job(spec: MemberJobSpec) -> None:
    """Rules across fields of the whole job."""
    if spec.backfill:
        if not (spec.backfill_start and spec.backfill_end):
            missing = "backfill_end" if spec.backfill_start else "backfill_start"
            raise ConfigError(missing, "backfill_start and backfill_end go together")
        start, end = spec.window()
        if end <= start:
            raise ConfigError("backfill_end", f"must be after backfill_start ({end.isoformat()} <= {start.isoformat()})")
        if spec.follow:
            raise ConfigError("follow", "a backfill reads a closed window: it has nothing to follow")
        if spec.join:
            raise ConfigError("join", "a backfill reads the origin, not a member's partitions: it has no member to add")
    elif not spec.member:
        raise ConfigError("member", "required (unless backfill_start and backfill_end are given)")
    check_sink(spec)
    schema_field = spec.payload_format.schema_field
    if schema_field is not None and not getattr(spec, schema_field):
        raise ConfigError(schema_field, f"required when payload_format is {spec.payload_format}")
    if spec.avro_schema is not None and spec.payload_format is PayloadFormat.AVRO:
        from airflow_provider_cg.core.landing.pipeline.decode import parse_avro_schema

        parse_avro_schema(spec.avro_schema)
    if spec.transform is not None:
        from airflow_provider_cg.core.landing.transform import parse_spec

        if spec.transform_sql is not None:
            raise ConfigError("transform", "give transform or transform_sql, not both")
        parse_spec(spec.transform)
    elif spec.transform_sql is not None and not spec.transform_sql.strip():
        raise ConfigError("transform_sql", "must not be empty")
    if spec.no_spark:
        if spec.read is ReadMode.EXECUTORS:
            raise ConfigError("read", "executors are Spark's (drop no_spark)")
        if spec.transforming:
            raise ConfigError("transform", "a transformation runs in Spark (drop no_spark)")
        if spec.payload_format.needs_spark:
            raise ConfigError("payload_format", f"{spec.payload_format} needs Spark (drop no_spark)")



#: the fields each cross-field rule reads, for ``check_known``
_RULE_FIELDS = {
    "backfill_start": {"backfill_start", "backfill_end"},
    "backfill_end": {"backfill_start", "backfill_end"},
    "member": {"member", "backfill_start", "backfill_end"},
    "sink_path": {"sink", "sink_path"},
    "iceberg_table": {"sink", "iceberg_table"},
    "iceberg_catalog_uri": {"sink", "iceberg_catalog_uri"},
    "iceberg_warehouse": {"sink", "iceberg_warehouse"},
    "pg_table": {"sink", "pg_table"},
    "iceberg_catalog_name": {"sink", "iceberg_catalog_name"},
    "partition_by": {"sink", "partition_by"},
    "target_file_size": {"sink", "target_file_size"},
    "merge_keys": {"sink", "merge_keys", "delete_when"},
    "delete_when": {"sink", "merge_keys", "delete_when"},
    "route_by": {"routes", "route_by"},
    "json_schema": {"payload_format", "json_schema"},
    "avro_schema": {"payload_format", "avro_schema"},
    "transform": {"transform", "transform_sql", "no_spark"},
    "read": {"read", "no_spark"},
    "transform_sql": {"transform", "transform_sql"},
    "payload_format": {"payload_format", "no_spark"},
}


def _involves(name: str, unknown: set[str]) -> bool:
    if "routes" in unknown and (name in SINK_FIELDS or name.startswith("routes.")):
        return True  # with routes, every sink option's rule is a route's
    return bool(_RULE_FIELDS.get(name, {name}) & unknown)


def _plain(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


# --- the answer ---------------------------------------------------------------------------------


#: a summary's counts of messages and rows, in the order reports show them (``Summary``)
COUNTS = ("messages_read", "messages_landed", "rows_written", "duplicates_skipped", "dead_lettered")


@dataclass
class Summary:
    """The job's result: one JSON object (``to_json``), printed after ``SUMMARY_PREFIX`` and
    written to ``--summary-file``.

    Counts, each named for what it counts: ``messages_read`` (read and acknowledged in the
    batches this run committed; a backfill: read from the window), ``messages_landed`` (those
    whose effect this run committed: read minus duplicates, dead-lettered and, in a backfill,
    skipped), ``rows_written`` (rows the sink wrote, also for writes an earlier run left
    prepared and this one committed: ``recovered_committed``; a transformation may write more
    or fewer rows than messages), ``duplicates_skipped`` (messages already landed), ``dead_lettered``
    (poison messages moved to the dead-letter stream); ``partitions``: per partition the
    messages read and the first/last origin sequence (with a transformation: of the messages whose
    effect the run landed, so inputs read again after a recovery are not announced twice). A backfill fills ``window_start`` /
    ``window_end`` and ``skipped``; ``recomputed``: batches rolled back before any ack and
    computed again because another writer (a backfill, a replay) committed some of their
    inputs meanwhile; a failed run ``exit_code`` and ``error`` (one line, never a
    secret). ``read_path``: how the messages were read, ``direct`` (batched direct gets by the
    driver, a range acknowledged at once), ``executors`` (the same, by the batch's Spark tasks:
    ``--read executors``) or ``consumer`` (pulls and an ack per message: the stream has
    no direct gets, ``--read consumer``, a server without consumer resets for a static group,
    or an earlier instance's deliveries still in flight; ``read_path_reason`` then says which and
    what to do, as the job's warning does). ``origin_key``: the ``origin_stream`` the run's
    rows carry (the stream's name, or ``<stream>#<n>`` for the n-th life of a stream deleted and created
    again: ``stream_life.py``). ``routes``: a routed landing's counts per route (its table)."""

    stream: str
    group: str
    member: str | None
    result: str = RESULT_EMPTY
    target: int = 0
    messages_read: int = 0
    rows_written: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    poison_deliveries: int = 0
    batches: int = 0
    recovered_committed: int = 0
    recovered_aborted: int = 0
    recomputed: int = 0  # batches computed again: another writer committed some of their inputs meanwhile
    unconfirmed_acks: int = 0
    bytes: int = 0
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)
    batch_ids: list[str] = field(default_factory=list)  # the batches this run committed (sink gids)
    stop_reason: str = ""  # a ``StopReason``, or a sentence with the details of one (``modes.py``)
    pin_id: str | None = None
    origin_key: str | None = None  # the origin_stream of the rows landed: the stream, or <stream>#<n> for its n-th life
    read_path: str = ""
    read_path_reason: str | None = None  # why a run that could read directly read through the consumer, and the remedy
    duration_s: float = 0.0
    window_start: str | None = None
    window_end: str | None = None
    skipped: int = 0  # backfill: outside the group (static subject without a partition token), poison, or left_to_members
    left_to_members: int = 0  # backfill: pending for members whose partition lags behind the window (they land them)
    exit_code: int = EXIT_OK
    error: str | None = None
    #: a routed landing (``routes``): per route, what its table got: ``rows_written``,
    #: ``duplicates_skipped``, ``messages_landed`` (inputs it recorded) and ``partitions``, as above,
    #: and its ``columns`` and ``table_location``
    routes: dict[str, dict] = field(default_factory=dict)
    #: [name, Arrow type] of the columns of the rows this run wrote (a lineage schema), None
    #: before a batch with rows committed
    columns: list[list[str]] | None = None
    #: where the table's files are when its catalog decides it (an Iceberg table's location URI;
    #: lineage names the table by it), None otherwise
    table_location: str | None = None
    rebuilt_partitions: list[int] = field(default_factory=list)
    #: a Delta or Iceberg table's group commit (``sinks/lake/tables.py``): the table commits this run
    #: made, the records they published (its own and other writers'), and commits that lost a
    #: race to another writer's (each retried after re-reading the table)
    table_commits: int = 0
    records_published: int = 0
    table_conflicts: int = 0

    def count_partition(self, partition: int, first_seq: int, last_seq: int, n: int,
                        into: dict | None = None) -> None:
        parts = self.partitions if into is None else into
        p = parts.setdefault(str(partition), {"messages": 0, "first_origin_seq": first_seq,
                                              "last_origin_seq": last_seq})
        p["messages"] += n
        p["first_origin_seq"] = min(p["first_origin_seq"], first_seq)
        p["last_origin_seq"] = max(p["last_origin_seq"], last_seq)

    def route(self, name: str) -> dict:
        """A route's counts (created at zero)."""
        return self.routes.setdefault(name, {"rows_written": 0, "duplicates_skipped": 0, "messages_landed": 0,
                                             "partitions": {}})

    @classmethod
    def failed(cls, spec: MemberJobSpec | None, exit_code: int, error: str) -> Summary:
        stream: Any = getattr(spec, "stream", None)  # None when the spec itself was refused
        group: Any = getattr(spec, "group", None)
        return cls(stream, group, getattr(spec, "member", None), result=RESULT_FAILED, exit_code=exit_code, error=error)

    @property
    def messages_landed(self) -> int:
        return max(self.messages_read - self.duplicates_skipped - self.dead_lettered - self.skipped, 0)

    def to_dict(self) -> dict:
        """Plain values (a ``StopReason`` as its text): what XCom, the summary file and the
        progress board carry."""
        return {**dataclasses.asdict(self), "stop_reason": str(self.stop_reason),
                "messages_landed": self.messages_landed}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)
