"""The ``cg`` command: administer partitioned consumer groups (orbit ``pcgroups`` compatible).

Server commands: ``create``, ``info``, ``ls``, ``rm``, ``add``, ``drop``, ``mapping set|rm``,
``step-down``, ``members``, ``status``, ``lag``, ``reset``, ``resize``, ``reconcile``, ``layout``. Offline: ``plan`` (which member gets
which partition, and what moves on a membership change) and ``hash`` (the partition of
subjects, as the server computes it).

Secrets never go on the command line: passwords, tokens, nkey seeds and creds come from files
(``--password-file``, ``--token-file``, ``--nkey``, ``--creds``) or from ``CG_NATS_*``
environment variables (see :class:`~airflow_provider_cg.core.jetstream.connection.NatsConnectionSettings`).

Exit status: 0 success, 1 invalid input (``cg: error: <field>: <rule>`` on stderr), 2 the
server refused or could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TextIO

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    GroupNotFound,
    JetStreamApiError,
    ServerUnavailable,
)
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import layouts, partitioning
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups.layouts import LayoutError
from airflow_provider_cg.core.groups.reset import ResetRefused
from airflow_provider_cg.core.groups.resize import ResizeIncomplete
from airflow_provider_cg.core.groups.sourcing import SourcingError
from airflow_provider_cg.core.jetstream.connection import ENV_PREFIX, NatsConnectionSettings

EXIT_OK, EXIT_INPUT, EXIT_SERVER = 0, 1, 2
ENV_SERVERS = ENV_PREFIX + "SERVERS"


class _UsageError(Exception):
    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field, self.rule = field, rule


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting with status 2 (2 means "server" here), and
    takes no abbreviations (``--password`` must not silently mean ``--password-file``)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        m = re.match(r"argument ([^:]+): (.*)", message)
        if m:
            names = m.group(1).split("/")
            raise _UsageError(names[-1].lstrip("-"), m.group(2))
        m = re.match(r"the following arguments are required: (.*)", message)
        if m:
            if m.group(1).startswith("{"):  # a required subcommand, e.g. {set,rm}
                raise _UsageError("command", f"give one of {m.group(1).strip('{}').replace(',', ', ')}")
            missing = [a.strip().lstrip("-") for a in m.group(1).split(",")]
            raise _UsageError(missing[0], "is required" + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
        raise _UsageError("arguments", message)


# --- formatting ---------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table (no trailing spaces)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def ranges(parts: Sequence[int]) -> str:
    """``[0,1,2,5]`` -> ``"0-2,5"``; empty -> ``"-"``."""
    ps = sorted(parts)
    if not ps:
        return "-"
    out, start, prev = [], ps[0], ps[0]
    for p in [*ps[1:], None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if p is not None:
            start = prev = p
    return ",".join(out)


def _emit(args, data: Any, text: str, out: TextIO) -> None:
    if getattr(args, "json", False):
        out.write(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")
    else:
        out.write(text.rstrip("\n") + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# --- input parsing ------------------------------------------------------------------------


def _csv(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def _ints(field: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace(" ", ",").split(",") if x.strip())
    except ValueError:
        raise ConfigError(field, f"expected comma-separated integers, got {text!r}") from None


MAX_SECRET_FILE = 1024 * 1024


def _read_secret(field: str, path: str) -> str:
    try:
        if os.path.getsize(path) > MAX_SECRET_FILE:
            raise ConfigError(field, f"{path!r} is larger than {MAX_SECRET_FILE} bytes: not a secret file")
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as e:
        raise ConfigError(field, f"cannot read {path!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(field, f"{path!r} is not a text file") from None
    if not text:
        raise ConfigError(field, f"{path!r} is empty")
    return text


_OPTION_OF = {"servers": "server", "user": "user", "password": "password-file", "token": "token-file",
              "nkey_seed": "nkey", "creds": "creds", "tls_ca": "tlsca", "tls_cert": "tlscert", "tls_key": "tlskey",
              "connect_timeout": "timeout"}


def settings_from_args(args, environ: dict[str, str] | None = None) -> NatsConnectionSettings:
    """Connection settings: ``CG_NATS_*`` environment, then the command-line options. An error
    names the option or the variable the bad value came from."""
    env = os.environ if environ is None else environ

    def refused(e: Exception, from_args: set[str]) -> ConfigError:
        field, sep, rule = str(e).partition(": ")
        if not sep:
            return ConfigError("server", str(e))
        if field in from_args:
            return ConfigError(_OPTION_OF.get(field, field), rule)
        if field == "CG_NATS_CONFIG_FILE":
            return ConfigError(field, rule)
        return ConfigError(ENV_PREFIX + field.upper(), rule)

    try:
        values = NatsConnectionSettings.from_env(env).to_dict()
    except (OSError, TypeError, ValueError) as e:
        raise refused(e, set()) from None
    given: set[str] = set()
    servers = _csv(args.server)
    if servers:
        values["servers"] = servers
        given.add("servers")
    if args.user:
        values["user"] = args.user
        given.add("user")
    for opt, key in (("password_file", "password"), ("token_file", "token"), ("nkey", "nkey_seed"), ("creds", "creds")):
        path = getattr(args, opt)
        if path:
            values[key] = _read_secret(opt.replace("_", "-"), path)
            given.add(key)
    for opt, key in (("tlsca", "tls_ca"), ("tlscert", "tls_cert"), ("tlskey", "tls_key")):
        path = getattr(args, opt)
        if path:
            if not os.path.isfile(path):
                raise ConfigError(opt, f"{path!r} is not a file")
            values[key] = path
            given.add(key)
    if not (isinstance(args.timeout, float) and 0 < args.timeout <= 600):
        raise ConfigError("timeout", "must be a number of seconds > 0 and at most 600")
    values["connect_timeout"] = args.timeout
    given.add("connect_timeout")
    values.setdefault("name", "cg")
    try:
        return NatsConnectionSettings.from_mapping(values)
    except (TypeError, ValueError) as e:
        raise refused(e, given) from None


# --- the parser ---------------------------------------------------------------------------


def _common(json_only: bool = False) -> argparse.ArgumentParser:
    p = _Parser(add_help=False)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    if json_only:
        return p
    g = p.add_argument_group("connection (secrets only from files or CG_NATS_* variables)")
    g.add_argument("--server", "-s", action="append", metavar="URL",
                   help=f"NATS server URL, repeatable or comma-separated (default ${ENV_SERVERS} "
                        "or nats://127.0.0.1:4222)")
    g.add_argument("--user", help="user name (its password from --password-file or CG_NATS_PASSWORD)")
    g.add_argument("--password-file", metavar="FILE")
    g.add_argument("--token-file", metavar="FILE")
    g.add_argument("--nkey", metavar="FILE", help="file holding an nkey seed")
    g.add_argument("--creds", metavar="FILE", help="NATS credentials (JWT + seed) file")
    g.add_argument("--tlsca", metavar="FILE")
    g.add_argument("--tlscert", metavar="FILE")
    g.add_argument("--tlskey", metavar="FILE")
    g.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="connect and request timeout")
    g.add_argument("--js-prefix", default="$JS.API", metavar="PREFIX", help="JetStream API prefix")
    return p


def build_parser() -> argparse.ArgumentParser:
    common, offline = _common(), _common(json_only=True)
    parser = _Parser(prog="cg", description="Partitioned consumer groups on NATS JetStream (orbit pcgroups compatible).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def cmd(name: str, help: str, parents=(common,), **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=list(parents), **kw)

    def sg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("stream", metavar="STREAM")
        p.add_argument("group", metavar="GROUP")
        return p

    p = cmd("create", "create a static or elastic group (idempotent for the same config)")
    p.add_argument("kind", choices=groupnames.KINDS, metavar="{static,elastic}")
    sg(p)
    p.add_argument("--max-members", type=int, required=True, metavar="N", help="number of partitions")
    p.add_argument("--filter", action="append", default=[], metavar="F",
                   help="subject filter, repeatable (elastic: partitioning filter; static: member filter)")
    p.add_argument("--wildcards", action="append", default=[], metavar="1,2",
                   help="elastic: partitioning wildcard indexes of the matching --filter (one per --filter)")
    p.add_argument("--max-buffered-msgs", type=int, default=0, metavar="N", help="elastic: work-queue limit")
    p.add_argument("--max-buffered-bytes", type=int, default=0, metavar="N", help="elastic: work-queue limit")
    p.add_argument("--members", action="append", metavar="a,b")
    p.add_argument("--mappings", metavar="JSON", help='[{"member":"m1","partitions":[0,1]},...] or {"m1":[0,1]}')
    p.add_argument("--orbit-format", choices=("v0.2", "v0.1"), default="v0.2",
                   help="JSON shape of the stored config: orbit v0.2 (current) or v0.1 (one filter), for "
                        "groups that orbit v0.1 tools also manage")
    p.add_argument("--layout", choices=layouts.NAMES, default=layouts.DEFAULT,
                   help="elastic: where the partitions are stored: work-queue (orbit's: one stream, every member "
                        "reads its partitions from it) or partition-streams (a stream per partition, mirrored "
                        "from the work queue: members do not read each other's messages; orbit instances cannot "
                        "consume it)")

    def kinded(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--kind", choices=groupnames.KINDS, help="the group's kind, when a key is in both buckets")
        return p

    kinded(sg(cmd("info", "show a group's config, assignment and active members")))
    p = cmd("ls", "list groups")
    p.add_argument("stream", nargs="?", metavar="STREAM")
    p = kinded(sg(cmd("rm", "delete a group (config, work-queue stream / member consumers)")))
    p.add_argument("--force", action="store_true", help="also remove a stored config that is invalid")
    for name, help in (("add", "add members (elastic)"), ("drop", "drop members (elastic)")):
        p = sg(cmd(name, help))
        p.add_argument("members", nargs="+", metavar="MEMBER")
        p.add_argument("--assignment", choices=("block", "sticky"), default="block",
                       help="block: re-distribute contiguous blocks (orbit's members); sticky: move only the "
                            "partitions that must move (stored as orbit's member_mappings)")
    p = cmd("mapping", "set or remove explicit member -> partitions mappings (elastic)")
    msub: Any = p.add_subparsers(dest="mapping_command", metavar="{set,rm}", parser_class=_Parser)
    msub.required = True
    sg(msub.add_parser("set", help="set the mappings", parents=[common])).add_argument("mappings", metavar="JSON")
    sg(msub.add_parser("rm", help="remove the mappings", parents=[common]))
    sg(cmd("step-down", "unpin a member's active instance")).add_argument("member", metavar="MEMBER")
    kinded(sg(cmd("members", "member consumers: partitions, pin, pending")))
    kinded(sg(cmd("status", "backlog per partition and member")))
    p = sg(cmd("lag", "per member: backlog, in flight, age of the oldest pending message, pin holder, and (with "
                      "--sink) the last committed batch"))
    from airflow_provider_cg.core.landing.sinks.options import add_sink_arguments

    add_sink_arguments(p, sink_help="read each member's last committed batch from this sink (the jobs' sink "
                                    "options; credentials from the environment as for the job: AWS_*, CG_PG_DSN, "
                                    "CG_ICEBERG_CATALOG_URI)")
    p.add_argument("--stream-life", metavar="new:CREATED|continue:CREATED",
                   help="with --sink: record the origin's current life in the table (after the stream was deleted "
                        "and created again), as the job's option of that name does: its jobs then land it")
    sg(cmd("reconcile", "re-apply the membership to the member consumers"))
    p = sg(cmd("layout", "move an elastic group to another layout (work-queue / partition-streams) with nothing "
                         "lost or landed twice; back to work-queue waits until the partition streams are landed"))
    p.add_argument("layout", choices=layouts.NAMES, metavar="LAYOUT", help=" or ".join(layouts.NAMES))
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the partition streams to be landed (moving to work-queue); "
                        "if they are not, the group stays draining and running the command again goes on")
    p.add_argument("--partition-replicas", type=int, metavar="N",
                   help="(to partition-streams) the partition streams' replicas, 1 to 5 (default: the work "
                        "queue's)")
    p = sg(cmd("resize", "change an elastic group's partition count (max_members): a plan by default, "
                         "--execute to stop sourcing, let the members drain the old partitions, switch and resume"))
    p.add_argument("--max-members", type=int, required=True, metavar="N", help="the new number of partitions")
    p.add_argument("--mappings", metavar="JSON", help="new member mappings, if the group maps members explicitly")
    p.add_argument("--execute", action="store_true", help="apply it (default: show the plan, change nothing)")
    p.add_argument("--drain-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long to wait for the members to land the old partitions (then: run it again)")
    p = sg(cmd("reset", "move a group's (or a member's) position: a plan by default, --execute to apply"))
    p.add_argument("--member", metavar="MEMBER", help="only this member's partitions")
    p.add_argument("--to-datetime", metavar="ISO8601", help="the first message at or after this time")
    p.add_argument("--by-duration", metavar="DURATION", help="that long ago: 90s, 15m, 1h30m, 2d")
    p.add_argument("--to-earliest", action="store_true", help="the origin stream's first message")
    p.add_argument("--to-latest", action="store_true", help="after the last message (skip the backlog)")
    p.add_argument("--to-seq", metavar="SEQ", help="this origin stream sequence")
    p.add_argument("--shift-by", metavar="N", help="N messages forward (negative: back; static groups)")
    p.add_argument("--execute", action="store_true", help="apply the plan (default: show it, change nothing)")
    p.add_argument("--force", action="store_true", help="step down pinned instances first instead of refusing")

    p = cmd("plan", "offline: partitions per member, and what moves with --next-members", parents=(offline,))
    p.add_argument("--max-members", type=int, required=True, metavar="N")
    p.add_argument("--members", action="append", metavar="a,b,c")
    p.add_argument("--mappings", metavar="JSON")
    p.add_argument("--next-members", action="append", metavar="a,b,c,d")
    p.add_argument("--next-mappings", metavar="JSON")
    p.add_argument("--assignment", choices=("block", "sticky"), default="block",
                   help="the algorithm whose moves are listed (both are counted)")

    p = cmd("maintain", "offline: maintain a Delta or Iceberg table the jobs land into, safely while they land: "
                        "compaction (Delta), a checkpoint, old versions and unreferenced files removed",
            parents=(offline,))
    add_sink_arguments(p, sink_help="the table's sink, delta or iceberg, with the jobs' sink options (credentials "
                                    "from the environment: AWS_*, CG_ICEBERG_CATALOG_URI)")
    p.add_argument("--compact", action=argparse.BooleanOptionalAction, default=None,
                   help="compact small files (default: yes for Delta; Iceberg has no compaction in pyiceberg)")
    p.add_argument("--retention-hours", type=float, default=168.0, metavar="HOURS",
                   help="keep old versions and unreferenced files this long (>= 1; default 168)")

    p = cmd("hash", "offline: the partition of subjects (SUBJECT... or - for stdin)", parents=(offline,))
    p.add_argument("--partitions", type=int, required=True, metavar="N")
    p.add_argument("--filter", metavar="F", help="partitioning filter the subjects match")
    p.add_argument("--wildcards", default="", metavar="1,2", help="wildcard indexes of --filter to hash")
    p.add_argument("subjects", nargs="+", metavar="SUBJECT")
    return parser


# --- offline commands -----------------------------------------------------------------------

def cmd_maintain(args, out: TextIO) -> int:
    """``cg maintain``: ``core/landing/sinks/maintenance.py`` on the table the sink options name."""
    from airflow_provider_cg.core.landing.sinks.maintenance import maintain
    from airflow_provider_cg.core.landing.sinks.options import sink_options_from_args
    from airflow_provider_cg.core.landing.sinks.registry import maintained_names, sink_kind

    options = sink_options_from_args(args)
    if options is None:
        raise ConfigError("sink", f"required ({' or '.join(maintained_names())})")
    compact = sink_kind(options.sink).compacts if args.compact is None else args.compact
    report = maintain(options, compact=compact, retention_hours=args.retention_hours)
    r = report.to_dict()
    text = (f"maintained {r['table']} in {r['duration_s']:.1f}s: compacted {r['compacted'] or '-'}, "
            f"expired snapshots {r['expired_snapshots']}, removed files {r['removed_files']}, "
            f"checkpoint {'yes' if r['checkpoint'] else 'no'}")
    _emit(args, r, text, out)
    return 0



def _membership(field: str, members: list[str] | None, mappings_json: str | None) -> dict[str, Any]:
    from airflow_provider_cg.core.groups.membership import parse_mappings, parse_members

    members = parse_members(field.replace("_", "-"), members) if members else []
    if mappings_json is not None:
        mappings = tuple(parse_mappings(mappings_json))
        if not mappings:
            raise ConfigError(field.replace("members", "mappings").replace("_", "-"),
                              "give at least one mapping (or leave the option out)")
        return {"members": tuple(members), "member_mappings": mappings}
    return {"members": tuple(members), "member_mappings": ()}


def cmd_plan(args, out: TextIO) -> int:
    cfg = cgconfig.ElasticGroupConfig(
        max_members=args.max_members, **_membership("members", args.members, args.mappings)
    ).validate()
    assignment = {m: sorted(p) for m, p in partitioning.assign_partitions(cfg).items()}
    data: dict[str, Any] = {"max_members": cfg.max_members, "assignment": assignment}
    lines = []
    if args.next_members is None and args.next_mappings is None:
        lines.append(table(["MEMBER", "PARTITIONS", "COUNT"], [(m, ranges(p), len(p)) for m, p in assignment.items()]))
    else:
        nxt = cgconfig.ElasticGroupConfig(
            max_members=args.max_members, **_membership("next_members", args.next_members, args.next_mappings)
        ).validate()
        block = {m: sorted(p) for m, p in partitioning.assign_partitions(nxt).items()}
        sticky = {m: p for m, p in partitioning.sticky_distribute(
            assignment, nxt.members or [mm.member for mm in nxt.member_mappings], cfg.max_members).items()}
        if nxt.member_mappings:  # explicit next mappings: both are what was given
            sticky = block
        nassign = sticky if args.assignment == "sticky" else block
        moves = _moves(assignment, nassign)
        data.update(next_assignment=nassign, moves=moves, assignment_algorithm=args.assignment,
                    moved={"block": len(_moves(assignment, block)), "sticky": len(_moves(assignment, sticky))})
        rows = [
            (m, ranges(assignment.get(m, [])), ranges(block.get(m, [])), ranges(sticky.get(m, [])))
            for m in sorted(set(assignment) | set(block) | set(sticky))
        ]
        lines.append(table(["MEMBER", "PARTITIONS", "NEXT (BLOCK)", "NEXT (STICKY)"], rows))
        lines.append("")
        lines.append(f"partitions that move: block {data['moved']['block']}, sticky {data['moved']['sticky']} "
                     f"(of {cfg.max_members})")
        if moves:
            lines.append(f"{args.assignment}: {len(moves)} of {cfg.max_members} partitions move:")
            lines.append(table(["PARTITION", "FROM", "TO"], [(mv["partition"], mv["from"] or "-", mv["to"] or "-")
                                                             for mv in moves]))
        else:
            lines.append("no partition moves")
    _emit(args, data, "\n".join(lines), out)
    return EXIT_OK


def _moves(old: dict[str, list[int]], new: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Normalised ``plan_moves`` output: ``[{"partition", "from", "to"}]`` sorted by partition."""
    moves = [{"partition": p, "from": a, "to": b} for p, a, b in partitioning.plan_moves(old, new)]
    return sorted(moves, key=lambda m: m["partition"])


def cmd_hash(args, out: TextIO, stdin: TextIO) -> int:
    if args.partitions < 1:
        raise ConfigError("partitions", "must be >= 1")
    wildcards = _ints("wildcards", args.wildcards) if args.wildcards else ()
    if wildcards and not args.filter:
        raise ConfigError("wildcards", "need --filter (the indexes count the filter's '*' tokens)")
    if args.filter:
        cgconfig.ElasticGroupConfig(
            max_members=args.partitions,
            partitioning_filters=(cgconfig.PartitioningFilter(args.filter, wildcards),),
        ).validate()
    subjects: list[str] = []
    for s in args.subjects:
        if s == "-":
            subjects.extend(line.strip() for line in stdin if line.strip())
        else:
            subjects.append(s)
    rows = []
    for s in subjects:
        groupnames.validate_subject("subject", s, wildcards=False)
        try:
            p = partitioning.partition_of(s, args.partitions, wildcards, args.filter)
        except ValueError as e:
            raise ConfigError("subject", str(e)) from None
        rows.append({"subject": s, "partition": p})
    _emit(args, rows, table(["SUBJECT", "PARTITION"], [(r["subject"], r["partition"]) for r in rows]), out)
    return EXIT_OK


# --- server commands ------------------------------------------------------------------------


def _create_config(args) -> cgconfig.GroupConfig:
    from airflow_provider_cg.core.groups.membership import parse_members

    members = parse_members("members", args.members) if args.members is not None else []
    mappings = None
    if args.mappings is not None:
        from airflow_provider_cg.core.groups.membership import parse_mappings

        mappings = tuple(parse_mappings(args.mappings))
        if not mappings:
            raise ConfigError("mappings", "give at least one mapping (or leave --mappings out)")
    if args.kind == groupnames.STATIC:
        if args.wildcards:
            raise ConfigError("wildcards", "only for elastic groups")
        if args.max_buffered_msgs or args.max_buffered_bytes:
            raise ConfigError("max-buffered-msgs" if args.max_buffered_msgs else "max-buffered-bytes",
                              "only for elastic groups")
        return cgconfig.StaticGroupConfig(args.max_members, tuple(args.filter), tuple(members), mappings or (),
                                          orbit_v01=_v01(args, len(args.filter)))
    if args.wildcards and len(args.wildcards) != len(args.filter):
        raise ConfigError("wildcards", "give one --wildcards per --filter (in the same order)")
    pfs = tuple(
        cgconfig.PartitioningFilter(f, _ints("wildcards", args.wildcards[i]) if args.wildcards else ())
        for i, f in enumerate(args.filter)
    )
    return cgconfig.ElasticGroupConfig(
        args.max_members, pfs, args.max_buffered_msgs, args.max_buffered_bytes, tuple(members), mappings or (),
        orbit_v01=_v01(args, len(pfs)),
    )


def _v01(args, n_filters: int) -> bool:
    if getattr(args, "orbit_format", "v0.2") != "v0.1":
        return False
    if n_filters != 1:
        raise ConfigError("orbit-format", "v0.1 configs hold exactly one --filter")
    return True


def _membership_text(cfg) -> str:
    if cfg.member_mappings:
        return "mappings " + ", ".join(f"{m.member}:{ranges(m.partitions)}" for m in cfg.member_mappings)
    return "members " + (", ".join(cfg.members) or "none")


def _describe(info, states=None) -> str:
    cfg = info.config
    lines = [f"group:        {info.group} on stream {info.stream} ({info.kind}, revision {info.revision})",
             f"max members:  {cfg.max_members} (partitions)"]
    if info.kind == groupnames.ELASTIC:
        fl = [f"{pf.filter} (wildcards {','.join(map(str, pf.partitioning_wildcards)) or 'none: whole subject'})"
              for pf in cfg.partitioning_filters]
        lines.append(f"filters:      {'; '.join(fl) or '> (whole subject)'}")
        lines.append(f"buffer:       max msgs {cfg.max_buffered_msgs or 'unlimited'}, "
                     f"max bytes {cfg.max_buffered_bytes or 'unlimited'}")
        lines.append(f"work queue:   {groupnames.work_queue_stream(info.stream, info.group)}")
    else:
        lines.append(f"filters:      {', '.join(cfg.filters) or '> (all)'}")
    if cfg.member_mappings:
        lines.append("mappings:     " + "; ".join(f"{m.member}={ranges(m.partitions)}" for m in cfg.member_mappings))
    else:
        lines.append(f"members:      {', '.join(cfg.members) or '(none)'}")
    assignment = partitioning.assign_partitions(cfg)
    if states is not None:
        rows = [(s.member, ranges(s.partitions), "yes" if s.consumer_exists else "no", s.pinned_id or "-")
                for s in states]
        lines += ["", table(["MEMBER", "PARTITIONS", "ACTIVE", "PINNED"], rows)]
    elif assignment:
        lines += ["", table(["MEMBER", "PARTITIONS"], [(m, ranges(p)) for m, p in assignment.items()])]
    return "\n".join(lines)


def _members_table(states) -> str:
    rows = [
        (s.member, ranges(s.partitions), "yes" if s.consumer_exists else "no",
         ("" if s.filters_current else "stale ") + (s.pinned_id or "-"), s.num_pending, s.num_ack_pending,
         s.num_redelivered, s.num_waiting)
        for s in states
    ]
    return table(["MEMBER", "PARTITIONS", "CONSUMER", "PINNED", "PENDING", "ACK_PENDING", "REDELIVERED", "WAITING"],
                 rows)


async def _online(args, out: TextIO) -> int:
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.jetstream.api import validate_prefix

    validate_prefix("js-prefix", args.js_prefix)
    settings = settings_from_args(args)
    if args.command == "create":  # check the input before touching the network
        created_cfg = _create_config(args)
        created_cfg.validate(args.stream, args.group)
    sink_options = None
    if args.command == "lag":  # the job's rules for the sink, before the network
        from airflow_provider_cg.core.landing.sinks.options import sink_options_from_args

        sink_options = sink_options_from_args(args)
    if args.command == "reset":
        from airflow_provider_cg.core.groups.reset import MODES, ResetTarget

        groupnames.validate_names(args.stream, args.group)
        if args.member is not None:
            groupnames.validate_name("member", args.member, "member")
        target = ResetTarget.parse(**{m: getattr(args, m) for m in MODES})
    nc = await settings.connect(max_reconnect_attempts=1)
    try:
        cg = ConsumerGroups(nc, js_prefix=args.js_prefix, timeout=args.timeout)
        c = args.command
        if c == "create":
            info = await cg.create(args.stream, args.group, created_cfg, layout=args.layout)
            given = created_cfg.members or created_cfg.member_mappings
            if not info.created and given and (info.config.members, info.config.member_mappings) != (
                    created_cfg.members, created_cfg.member_mappings):
                raise ConfigError("members", f"group {args.group!r} exists with another membership ("
                                  f"{_membership_text(info.config)}); change it with add, drop or mapping set")
            verb = "created" if info.created else "exists (same config):"
            _emit(args, {**info.to_dict(), "created": info.created},
                  f"{verb} {info.kind} group {args.group} on stream {args.stream}\n\n{_describe(info)}", out)
        elif c == "layout":
            move = await cg.move_layout(args.stream, args.group, args.layout, wait=args.wait,
                                        partition_replicas=args.partition_replicas)
            if not move.done:
                raise LayoutError(f"draining: {sum(move.left.values())} messages are still in the partition streams "
                                  f"after {args.wait:g}s (their members land them; new ones wait in the work queue): "
                                  "run the command again to finish")
            _emit(args, move.to_dict(), f"group {args.group} is in the {move.layout} layout", out)
        elif c == "info":
            info = await cg.get(args.stream, args.group, args.kind)
            states = await cg.member_info(args.stream, args.group, args.kind)
            data = {**info.to_dict(), "active_members": [s.member for s in states if s.consumer_exists]}
            _emit(args, data, _describe(info, states), out)
        elif c == "ls":
            groups = await cg.list(args.stream)
            listed = [{"kind": k, "stream": s, "group": g} for k, s, g in groups]
            _emit(args, listed, table(["KIND", "STREAM", "GROUP"], groups) if groups else "no consumer groups", out)
        elif c == "rm":
            info = await cg.delete(args.stream, args.group, args.kind, force=args.force)
            _emit(args, {"deleted": True, "kind": info.kind, "stream": args.stream, "group": args.group},
                  f"deleted {info.kind} group {args.group} on stream {args.stream}", out)
        elif c in ("add", "drop", "mapping"):
            if c == "add":
                info = await cg.add_members(args.stream, args.group, args.members, assignment=args.assignment)
            elif c == "drop":
                info = await cg.drop_members(args.stream, args.group, args.members, assignment=args.assignment)
            elif args.mapping_command == "set":
                info = await cg.set_mappings(args.stream, args.group, args.mappings)
            else:
                info = await cg.delete_mappings(args.stream, args.group)
            _emit(args, info.to_dict(), _describe(info), out)
        elif c == "step-down":
            groupnames.validate_name("member", args.member, "member")
            await cg.step_down(args.stream, args.group, args.member)
            _emit(args, {"stepped_down": args.member, "stream": args.stream, "group": args.group},
                  f"asked the active instance of member {args.member} to step down", out)
        elif c == "members":
            states = await cg.member_info(args.stream, args.group, args.kind)
            _emit(args, [s.to_dict() for s in states], _members_table(states) if states else "no members", out)
        elif c == "status":
            from airflow_provider_cg.core.groups.lag import group_lag

            st = await cg.status(args.stream, args.group, args.kind)
            lag = await group_lag(nc, args.stream, args.group, js_prefix=args.js_prefix, status=st)
            _emit(args, lag.add_to(st.to_dict()), _status_text(st, lag), out)
        elif c == "lag":
            from airflow_provider_cg.core.groups.lag import group_lag
            from airflow_provider_cg.core.jetstream.api import JsApi
            from airflow_provider_cg.core.landing.protocol.stream_life import LifeChoice, origin_created

            LifeChoice.parse(args.stream_life)  # a bad value is refused before anything is read

            lag = await group_lag(nc, args.stream, args.group, js_prefix=args.js_prefix)
            commits = await asyncio.to_thread(_last_commits, sink_options, args.stream, args.group) \
                if sink_options else None
            data = lag.to_dict()
            life = None
            if commits is not None:
                data["members"] = [{**m, "last_commit": asdict(commits[m["member"]]) if m["member"] in commits
                                    else None} for m in data["members"]]
                created = await origin_created(JsApi(nc, prefix=args.js_prefix), args.stream)
                life = data["origin_life"] = await asyncio.to_thread(_origin_life, sink_options, args.stream,
                                                                     created, args.stream_life)
            elif args.stream_life:
                raise ConfigError("stream_life", "needs --sink: the life is recorded in the table")
            _emit(args, data, _lag_text(lag, commits) + _life_text(args.stream, life), out)
        elif c == "reset":
            from airflow_provider_cg.core.groups.reset import GroupReset

            resets = GroupReset(nc, js_prefix=args.js_prefix)
            plan = await resets.plan(args.stream, args.group, target, args.member)
            if args.execute:
                plan = await resets.execute(plan, force=args.force)
            _emit(args, plan.to_dict(), reset_text(plan), out)
        elif c == "resize":
            from airflow_provider_cg.core.groups.resize import GroupResize

            resizes = GroupResize(nc, js_prefix=args.js_prefix)
            if args.execute:
                resize = await resizes.execute(args.stream, args.group, args.max_members, args.mappings,
                                               drain_timeout=args.drain_timeout)
            else:
                resize = await resizes.plan(args.stream, args.group, args.max_members, args.mappings)
            _emit(args, resize.to_dict(), resize_text(resize), out)
        elif c == "reconcile":
            done = await cg.reconcile(args.stream, args.group)
            _emit(args, done, f"deleted: {', '.join(done['deleted']) or '-'}\n"
                              f"re-created: {', '.join(done['recreated']) or '-'}", out)
        return EXIT_OK
    finally:
        await nc.close()


def _stopped_text(stopped: dict | None) -> list[str]:
    if not stopped:
        return []
    what = (f"a resize to {stopped.get('max_members')} partitions" if stopped.get("op") == "resize"
            else f"a reset ({stopped.get('target')})")
    return [f"sourcing:     STOPPED after origin sequence {stopped['cut']} by {what} that has not finished: run it "
            "again (--execute) to finish it"]


def _status_text(st, lag=None) -> str:
    layout = f", layout {st.layout}" if st.kind == groupnames.ELASTIC else ""
    lines = [f"group:        {st.group} on stream {st.stream} ({st.kind}, revision {st.revision}{layout})",
             f"backlog:      {st.backlog}  pending {st.num_pending}  ack pending {st.num_ack_pending}  "
             f"redelivered {st.num_redelivered}"
             + (f"  oldest pending {_age(lag.oldest_pending_age_s)}" if lag is not None else "")]
    lines += _stopped_text(st.sourcing_stopped)
    if st.kind == groupnames.ELASTIC:
        fill = st.buffer_fill
        lines.append(f"buffer:       {st.buffered_msgs} msgs / {st.buffered_bytes} bytes"
                     + (f" ({fill:.0%} full)" if fill is not None else "")
                     + (f", source lag {st.source_lag}" if st.source_lag is not None else ""))
    for p, why in sorted(st.partition_problems.items()):  # its backlog is unknown: say so
        lines.append(f"NOT CURRENT:  partition {p}'s stream {layouts.named(st.layout).partition_store(work_queue_of(st), p)}: "
                     f"{why}")
    if st.inactive_members:
        lines.append(f"no consumer:  {', '.join(st.inactive_members)}")
    if st.unassigned_partitions:
        lines.append(f"unassigned:   partitions {ranges(st.unassigned_partitions)}")
    owner = {p: m.member for m in st.members for p in m.partitions}
    label = "BACKLOG" if st.kind == groupnames.ELASTIC else "STORED"
    lines += ["", table(["PARTITION", "MEMBER", label], [(p, owner.get(p, "-"), n) for p, n in sorted(st.partitions.items())])]
    if st.members:
        lines += ["", _members_table(st.members)]
    return "\n".join(lines)


def work_queue_of(st) -> str:
    return groupnames.work_queue_stream(st.stream, st.group)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _last_commits(o, stream: str, group: str) -> dict:
    """Each member's last committed batch from the sink the jobs land into (read-only)."""
    from airflow_provider_cg.core.landing.sinks.opening import open_sink

    with open_sink(o) as sink:
        return sink.last_commits(stream, group)


def _origin_life(o, stream: str, created: str, choice: str | None) -> dict:
    """The origin's current life in the table the jobs land into; ``choice`` records it."""
    from airflow_provider_cg.core.landing.protocol.stream_life import LifeChoice
    from airflow_provider_cg.core.landing.sinks.opening import open_sink

    with open_sink(o) as sink:
        if choice:
            sink.stream_life(stream, created, LifeChoice.parse(choice))
        lives = sink.stream_lives(stream)
    key = next((life.key for life in lives if life.created == created), None)
    return {"created": created, "key": key, "known": key is not None or not lives,
            "lives": [{"created": life.created, "key": life.key} for life in lives]}


def _life_text(stream: str, life: dict | None) -> str:
    if life is None:
        return ""
    if life["key"]:
        return f"\norigin:       {stream} created {life['created']}, lands as {life['key']}"
    if life["known"]:
        return f"\norigin:       {stream} created {life['created']}, not landed here yet"
    return (f"\norigin:       {stream} created {life['created']}: ANOTHER LIFE than the table holds (created "
            f"{', '.join(x['created'] for x in life['lives'])}); its jobs refuse until "
            f"--stream-life new:{life['created']} (here or on the jobs)")


def _commit_text(c) -> str:
    if c is None:
        return "-"
    seqs = ", ".join(f"{r['first_seq']}-{r['last_seq']}" for r in c.origin.values()) or "-"
    return f"{c.committed_at[:19].replace('T', ' ')} {c.rows_written} rows, seq {seqs}"


def _lag_text(lag, commits: dict | None = None) -> str:
    lines = [f"group:        {lag.group} on stream {lag.stream} ({lag.kind})",
             f"backlog:      {lag.backlog}  oldest pending {_age(lag.oldest_pending_age_s)}"
             + (f"  source lag {lag.source_lag}" if lag.source_lag is not None else "")]
    lines += _stopped_text(lag.sourcing_stopped)
    for p, why in sorted(lag.partition_problems.items(), key=lambda kv: int(kv[0])):
        lines.append(f"NOT CURRENT:  partition {p}'s stream: {why} (its backlog is not known)")
    if lag.unassigned_partitions:
        lines.append(f"unassigned:   partitions {ranges(lag.unassigned_partitions)}")
    rows: list[tuple[Any, ...]] = [(m.member, ranges(m.partitions), m.backlog, m.num_ack_pending, _age(m.oldest_pending_age_s),
             m.pin_holder or "-", m.pinned_since or "-") for m in lag.members]
    headers = ["MEMBER", "PARTITIONS", "BACKLOG", "IN_FLIGHT", "OLDEST_PENDING", "PINNED", "SINCE"]
    if commits is not None:
        headers.append("LAST_COMMIT (UTC)")
        rows = [(*r, _commit_text(commits.get(m.member))) for r, m in zip(rows, lag.members, strict=True)]
    if rows:
        lines += ["", table(headers, rows)]
    return "\n".join(lines)


def resize_text(plan) -> str:
    members = sorted(set(plan.partitions) | set(plan.new_partitions))
    rows = [(m, ranges(plan.partitions.get(m, [])) or "-", ranges(plan.new_partitions.get(m, [])) or "-")
            for m in members]
    lines = [f"resize of elastic group {plan.group} on stream {plan.stream}: {plan.max_members} -> "
             f"{plan.new_max_members} partitions", "",
             table(["MEMBER", "PARTITIONS", "NEW_PARTITIONS"], rows), ""]
    if plan.state == "done":
        lines.append(f"done: sourcing stopped after origin sequence {plan.cut}, the old partitions drained, the "
                     "group switched and sourcing resumed with the new partitions")
    else:
        lines += [f"{plan.backlog} message(s) in the work queue land in the old partitions first"
                  + (f" (sourcing stopped after origin sequence {plan.cut})" if plan.in_progress else ""),
                  "dry run: nothing changed (--execute stops sourcing, waits for the members' jobs to drain the "
                  "work queue, switches, resumes)"]
    return "\n".join(lines)


def reset_text(plan) -> str:
    who = f"member {plan.member}" if plan.member else "every member"
    rows = [(c.member, ranges(c.partitions), c.current, c.new, c.replay, c.skip) for c in plan.changes]
    lines = [f"reset {plan.target} of {who} of {plan.kind} group {plan.group} on stream {plan.stream} "
             f"(origin sequences {plan.origin_first_seq}..{plan.origin_last_seq})", "",
             table(["MEMBER", "PARTITIONS", "POSITION", "NEW_POSITION", "REPLAY", "SKIP"], rows) if rows
             else "no partitions", "",
             f"{plan.replay} message(s) will be read again (sinks drop those they hold), {plan.skip} skipped"]
    if plan.executed:
        lines.append("done: the positions were moved")
    else:
        if plan.pinned:
            lines.append("running (pinned): " + ", ".join(sorted(plan.pinned)) + " -- --execute refuses unless "
                         "--force (steps them down)")
        lines.append("dry run: nothing changed (--execute applies it)")
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------


def _error(err: TextIO, field: str, rule: str) -> None:
    err.write(f"cg: error: {field}: {rule}\n")


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None,
         stdin: TextIO | None = None) -> int:
    """Run ``cg``; return the exit status (0 ok, 1 invalid input, 2 server refused/unreachable)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # TLS transport chatter on failed handshakes
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as e:
        _error(err, e.field, e.rule)
        return EXIT_INPUT
    except SystemExit as e:  # --help
        return int(e.code or 0)
    try:
        if args.command == "plan":
            return cmd_plan(args, out)
        if args.command == "hash":
            return cmd_hash(args, out, stdin or sys.stdin)
        if args.command == "maintain":
            return cmd_maintain(args, out)
        return asyncio.run(_online(args, out))
    except ConfigError as e:
        _error(err, e.field, e.rule)
        return EXIT_INPUT
    except GroupNotFound as e:
        _error(err, "group", str(e))
        return EXIT_INPUT
    except ResetRefused as e:
        _error(err, "reset", str(e).removeprefix("reset: "))
        return EXIT_SERVER
    except (ResizeIncomplete, SourcingError) as e:
        _error(err, "resize" if isinstance(e, ResizeIncomplete) else "sourcing", str(e))
        return EXIT_SERVER
    except LayoutError as e:
        _error(err, "layout", str(e))
        return EXIT_SERVER
    except (JetStreamApiError, ServerUnavailable, ConnectionError, ConsumerGroupError) as e:
        _error(err, "server", str(e))
        return EXIT_SERVER
    except KeyboardInterrupt:
        return 130
    except (RecursionError, MemoryError, UnicodeError) as e:  # input too deep, large or not text
        _error(err, "input", f"cannot be processed ({type(e).__name__})")
        return EXIT_INPUT
    except Exception as e:  # a bug: still one line, and never the settings (they hold secrets)
        _error(err, "internal", f"unexpected {type(e).__name__}; please report it with the command used")
        return EXIT_SERVER


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
