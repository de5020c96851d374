"""The ``cg`` command: administer partitioned consumer groups (orbit ``pcgroups`` compatible).

Server commands: ``create``, ``info``, ``ls``, ``rm``, ``add``, ``drop``, ``mapping set|rm``,
``step-down``, ``members``, ``status``, ``lag``, ``reset``, ``resize``, ``reconcile``, ``layout``. Offline: ``plan`` (which member gets
which partition, and what moves on a membership change) and ``hash`` (the partition of
subjects, as the server computes it).

Secrets never go on the command line: passwords, tokens, nkey seeds and creds come from files
(``--password-file``, ``--token-file``, ``--nkey``, ``--creds``) or from ``CG_NATS_*``
environment variables (see :class:`~airflow_provider_cg.core.jetstream.connection.NatsConnectionSettings`). The parser is
``cli_parser.py``, the printing ``cli_text.py``; each server command is a function of ``SERVER_COMMANDS``.

Exit status: 0 success, 1 invalid input (``cg: error: <field>: <rule>`` on stderr), 2 the
server refused or could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TextIO

from airflow_provider_cg.core.errors import (
    ConfigError,
    ConsumerGroupError,
    GroupNotFound,
    JetStreamApiError,
    ServerUnavailable,
)
from airflow_provider_cg.core.groups import config as cgconfig
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.groups import partitioning
from airflow_provider_cg.core.groups.layouts import LayoutError
from airflow_provider_cg.core.groups.reset_plan import ResetRefused
from airflow_provider_cg.core.groups.resize import ResizeIncomplete
from airflow_provider_cg.core.groups.sourcing import SourcingError
from airflow_provider_cg.core.tools.cli_parser import (
    UsageError,
    build_parser,
    int_list,
    settings_from_args,
)
from airflow_provider_cg.core.tools.cli_text import (
    describe,
    emit,
    lag_text,
    life_text,
    members_table,
    membership_text,
    ranges,
    reset_text,
    resize_text,
    status_text,
    table,
)

if TYPE_CHECKING:
    from airflow_provider_cg.core.groups.reset_plan import ResetTarget
    from airflow_provider_cg.core.landing.sinks.options import SinkOptions
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import LastCommit

EXIT_OK, EXIT_INPUT, EXIT_SERVER = 0, 1, 2


def cmd_maintain(args: argparse.Namespace, out: TextIO) -> int:
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
    emit(args, r, text, out)
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


def cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
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
    emit(args, data, "\n".join(lines), out)
    return EXIT_OK


def _moves(old: dict[str, list[int]], new: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Normalised ``plan_moves`` output: ``[{"partition", "from", "to"}]`` sorted by partition."""
    moves = [{"partition": p, "from": a, "to": b} for p, a, b in partitioning.plan_moves(old, new)]
    return sorted(moves, key=lambda m: m["partition"])


def cmd_hash(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    if args.partitions < 1:
        raise ConfigError("partitions", "must be >= 1")
    wildcards = int_list("wildcards", args.wildcards) if args.wildcards else ()
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
    emit(args, rows, table(["SUBJECT", "PARTITION"], [(r["subject"], r["partition"]) for r in rows]), out)
    return EXIT_OK


def _create_config(args: argparse.Namespace) -> cgconfig.GroupConfig:
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
        cgconfig.PartitioningFilter(f, int_list("wildcards", args.wildcards[i]) if args.wildcards else ())
        for i, f in enumerate(args.filter)
    )
    return cgconfig.ElasticGroupConfig(
        args.max_members, pfs, args.max_buffered_msgs, args.max_buffered_bytes, tuple(members), mappings or (),
        orbit_v01=_v01(args, len(pfs)),
    )


def _v01(args: argparse.Namespace, n_filters: int) -> bool:
    if getattr(args, "orbit_format", "v0.2") != "v0.1":
        return False
    if n_filters != 1:
        raise ConfigError("orbit-format", "v0.1 configs hold exactly one --filter")
    return True


# --- server commands: one function each, in one table ----------------------------------------


@dataclass
class Call:
    """One server command's call: its arguments, where it prints, the connection and the
    groups on it, and what its check found before the network (``checked``)."""

    args: argparse.Namespace
    out: TextIO
    nc: Any
    cg: Any  # ConsumerGroups
    checked: Any = None

    def emit(self, data: Any, text: str) -> None:
        emit(self.args, data, text, self.out)


def _check_create(args: argparse.Namespace) -> cgconfig.GroupConfig:
    created_cfg = _create_config(args)
    created_cfg.validate(args.stream, args.group)
    return created_cfg


async def _create(c: Call) -> None:
    args, created_cfg = c.args, c.checked
    info = await c.cg.create(args.stream, args.group, created_cfg, layout=args.layout)
    given = created_cfg.members or created_cfg.member_mappings
    if not info.created and given and (info.config.members, info.config.member_mappings) != (
            created_cfg.members, created_cfg.member_mappings):
        raise ConfigError("members", f"group {args.group!r} exists with another membership ("
                          f"{membership_text(info.config)}); change it with add, drop or mapping set")
    verb = "created" if info.created else "exists (same config):"
    c.emit({**info.to_dict(), "created": info.created},
           f"{verb} {info.kind} group {args.group} on stream {args.stream}\n\n{describe(info)}")


async def _layout(c: Call) -> None:
    args = c.args
    move = await c.cg.move_layout(args.stream, args.group, args.layout, wait=args.wait,
                                  partition_replicas=args.partition_replicas)
    if not move.done:
        raise LayoutError(move.unfinished(args.wait))
    c.emit(move.to_dict(), f"group {args.group} is in the {move.layout} layout")


async def _info(c: Call) -> None:
    args = c.args
    info = await c.cg.get(args.stream, args.group, args.kind)
    states = await c.cg.member_info(args.stream, args.group, args.kind)
    c.emit({**info.to_dict(), "active_members": [s.member for s in states if s.consumer_exists]},
           describe(info, states))


async def _ls(c: Call) -> None:
    groups = await c.cg.list(c.args.stream)
    listed = [{"kind": k, "stream": s, "group": g} for k, s, g in groups]
    c.emit(listed, table(["KIND", "STREAM", "GROUP"], groups) if groups else "no consumer groups")


async def _rm(c: Call) -> None:
    args = c.args
    info = await c.cg.delete(args.stream, args.group, args.kind, force=args.force)
    c.emit({"deleted": True, "kind": info.kind, "stream": args.stream, "group": args.group},
           f"deleted {info.kind} group {args.group} on stream {args.stream}")


async def _membership_change(c: Call) -> None:
    args, cg = c.args, c.cg
    if args.command == "add":
        info = await cg.add_members(args.stream, args.group, args.members, assignment=args.assignment)
    elif args.command == "drop":
        info = await cg.drop_members(args.stream, args.group, args.members, assignment=args.assignment)
    elif args.mapping_command == "set":
        info = await cg.set_mappings(args.stream, args.group, args.mappings)
    else:
        info = await cg.delete_mappings(args.stream, args.group)
    c.emit(info.to_dict(), describe(info))


async def _step_down(c: Call) -> None:
    args = c.args
    groupnames.validate_name("member", args.member, "member")
    await c.cg.step_down(args.stream, args.group, args.member)
    c.emit({"stepped_down": args.member, "stream": args.stream, "group": args.group},
           f"asked the active instance of member {args.member} to step down")


async def _members(c: Call) -> None:
    states = await c.cg.member_info(c.args.stream, c.args.group, c.args.kind)
    c.emit([s.to_dict() for s in states], members_table(states) if states else "no members")


async def _status(c: Call) -> None:
    from airflow_provider_cg.core.groups.lag import group_lag

    args = c.args
    st = await c.cg.status(args.stream, args.group, args.kind)
    lag = await group_lag(c.nc, args.stream, args.group, js_prefix=args.js_prefix, status=st)
    c.emit(lag.add_to(st.to_dict()), status_text(st, lag))


def _check_lag(args: argparse.Namespace) -> SinkOptions | None:
    """The job's rules for the sink, before the network."""
    from airflow_provider_cg.core.landing.sinks.options import sink_options_from_args

    return sink_options_from_args(args)


async def _lag(c: Call) -> None:
    from airflow_provider_cg.core.groups.lag import group_lag
    from airflow_provider_cg.core.landing.stream_life import LifeChoice

    args, sink_options = c.args, c.checked
    LifeChoice.parse(args.stream_life)  # a bad value is refused before anything is read

    lag = await group_lag(c.nc, args.stream, args.group, js_prefix=args.js_prefix)
    data = lag.to_dict()
    commits = life = None
    if sink_options is not None:
        commits, life = await _in_table(c, sink_options)
        data["members"] = [{**m, "last_commit": asdict(commits[m["member"]]) if m["member"] in commits
                            else None} for m in data["members"]]
        data["origin_life"] = life
    elif args.stream_life:
        raise ConfigError("stream_life", "needs --sink: the life is recorded in the table")
    c.emit(data, lag_text(lag, commits) + life_text(args.stream, life))


async def _in_table(c: Call, o: SinkOptions) -> tuple[dict[str, LastCommit], dict]:
    """Each member's last committed batch in the table the jobs land into, and the origin's life
    there, checked against the origin (``--stream-life`` records a choice, as on the jobs)."""
    from airflow_provider_cg.core.jetstream.api import JsApi
    from airflow_provider_cg.core.landing.protocol.origin_guard import OriginGuard, OriginWentBack
    from airflow_provider_cg.core.landing.sinks.opening import open_sink
    from airflow_provider_cg.core.landing.stream_life import origin_created

    args = c.args
    api = JsApi(c.nc, prefix=args.js_prefix)
    created = await origin_created(api, args.stream)
    sink = await asyncio.to_thread(open_sink, o)
    try:
        commits = await asyncio.to_thread(sink.last_commits, args.stream, args.group)
        lives = await asyncio.to_thread(sink.stream_lives, args.stream)
        known = not lives or any(life.created == created for life in lives)
        key = went = None
        if lives and (known or args.stream_life):  # else read only: the jobs refuse it, as it says
            try:
                key = (await OriginGuard.open(api, sink, args.stream, args.stream_life,
                                              reads_origin=True)).keys.current
                known = True
            except OriginWentBack as e:
                went = e.went.to_dict()
            lives = await asyncio.to_thread(sink.stream_lives, args.stream)
    finally:
        await asyncio.to_thread(sink.close)
    return commits, {"created": created, "key": key, "known": known, "went_back": went,
                     "lives": [{"created": life.created, "key": life.key, "from_seq": life.from_seq} for life in lives]}


def _check_reset(args: argparse.Namespace) -> ResetTarget:
    from airflow_provider_cg.core.groups.reset_plan import MODES, ResetTarget

    groupnames.validate_names(args.stream, args.group)
    if args.member is not None:
        groupnames.validate_name("member", args.member, "member")
    return ResetTarget.parse(**{m: getattr(args, m) for m in MODES})


async def _reset(c: Call) -> None:
    from airflow_provider_cg.core.groups.reset import GroupReset

    args = c.args
    resets = GroupReset(c.nc, js_prefix=args.js_prefix)
    plan = await resets.plan(args.stream, args.group, c.checked, args.member)
    if args.execute:
        plan = await resets.execute(plan, force=args.force)
    c.emit(plan.to_dict(), reset_text(plan))


async def _resize(c: Call) -> None:
    from airflow_provider_cg.core.groups.resize import GroupResize

    args = c.args
    resizes = GroupResize(c.nc, js_prefix=args.js_prefix)
    if args.execute:
        resize = await resizes.execute(args.stream, args.group, args.max_members, args.mappings,
                                       drain_timeout=args.drain_timeout)
    else:
        resize = await resizes.plan(args.stream, args.group, args.max_members, args.mappings)
    c.emit(resize.to_dict(), resize_text(resize))


async def _reconcile(c: Call) -> None:
    done = await c.cg.reconcile(c.args.stream, c.args.group)
    c.emit(done, f"deleted: {', '.join(done['deleted']) or '-'}\nre-created: {', '.join(done['recreated']) or '-'}")


#: each server command: the check of its input before the network (or None), and the command
SERVER_COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], Any] | None, Callable[[Call], Awaitable[None]]]] = {
    "create": (_check_create, _create),
    "layout": (None, _layout),
    "info": (None, _info),
    "ls": (None, _ls),
    "rm": (None, _rm),
    "add": (None, _membership_change),
    "drop": (None, _membership_change),
    "mapping": (None, _membership_change),
    "step-down": (None, _step_down),
    "members": (None, _members),
    "status": (None, _status),
    "lag": (_check_lag, _lag),
    "reset": (_check_reset, _reset),
    "resize": (None, _resize),
    "reconcile": (None, _reconcile),
}


async def _online(args: argparse.Namespace, out: TextIO) -> int:
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.jetstream.api import validate_prefix

    validate_prefix("js-prefix", args.js_prefix)
    settings = settings_from_args(args)
    check, command = SERVER_COMMANDS[args.command]
    checked = check(args) if check is not None else None  # the input, before touching the network
    nc = await settings.connect(max_reconnect_attempts=1)
    try:
        cg = ConsumerGroups(nc, js_prefix=args.js_prefix, timeout=args.timeout)
        await command(Call(args, out, nc, cg, checked))
        return EXIT_OK
    finally:
        await nc.close()


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
    except UsageError as e:
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
