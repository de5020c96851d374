"""``cg``'s command line: its parser (every command, its options and their help) and the NATS
connection settings it gives (``CG_NATS_*`` environment, then the options; secrets only from
files or the environment, never from an option's value)."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups import names as groupnames
from airflow_provider_cg.core.jetstream.connection import ENV_PREFIX, NatsConnectionSettings

ENV_SERVERS = ENV_PREFIX + "SERVERS"


class UsageError(Exception):
    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field, self.rule = field, rule


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting with status 2 (2 means "server" here), and
    takes no abbreviations (``--password`` must not silently mean ``--password-file``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        m = re.match(r"argument ([^:]+): (.*)", message)
        if m:
            names = m.group(1).split("/")
            raise UsageError(names[-1].lstrip("-"), m.group(2))
        m = re.match(r"the following arguments are required: (.*)", message)
        if m:
            if m.group(1).startswith("{"):  # a required subcommand, e.g. {set,rm}
                raise UsageError("command", f"give one of {m.group(1).strip('{}').replace(',', ', ')}")
            missing = [a.strip().lstrip("-") for a in m.group(1).split(",")]
            raise UsageError(missing[0], "is required" + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""))
        raise UsageError("arguments", message)


def csv_list(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def int_list(field: str, text: str) -> tuple[int, ...]:
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


def settings_from_args(args: argparse.Namespace,
                       environ: dict[str, str] | None = None) -> NatsConnectionSettings:
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
    servers = csv_list(args.server)
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


def _common(json_only: bool = False) -> argparse.ArgumentParser:
    p = Parser(add_help=False)
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


class _Commands:
    """The subcommands of one parser, and the arguments several of them share."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.common, self.offline = _common(), _common(json_only=True)
        self.sub: Any = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
        self.sub.required = True
        #: each command's parser, in the order --help lists them
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def cmd(self, name: str, help: str, parents: Sequence[argparse.ArgumentParser] | None = None,
            **kw: Any) -> argparse.ArgumentParser:
        p = self.sub.add_parser(name, help=help, description=help,
                                parents=list(parents if parents is not None else (self.common,)), **kw)
        self.parsers[name] = p
        return p

    @staticmethod
    def sg(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """The stream and group arguments."""
        p.add_argument("stream", metavar="STREAM")
        p.add_argument("group", metavar="GROUP")
        return p

    @staticmethod
    def kinded(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--kind", choices=groupnames.KINDS, help="the group's kind, when a key is in both buckets")
        return p


def build_parser() -> argparse.ArgumentParser:
    return build_commands()[0]


def build_commands() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """``cg``'s parser and each command's (the reference docs print every command's help)."""
    parser = Parser(prog="cg", description="Partitioned consumer groups on NATS JetStream (orbit pcgroups compatible).")
    commands = _Commands(parser)
    for add in (_group_commands, _observation_commands, _position_commands, _offline_commands):
        add(commands)  # in this order: the order --help lists them
    return parser, commands.parsers


def _group_commands(c: _Commands) -> None:
    """create, info, ls, rm, add, drop, mapping, step-down."""
    cmd, sg, kinded = c.cmd, c.sg, c.kinded
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
    msub: Any = p.add_subparsers(dest="mapping_command", metavar="{set,rm}", parser_class=Parser)
    msub.required = True
    sg(msub.add_parser("set", help="set the mappings", parents=[c.common])).add_argument("mappings", metavar="JSON")
    sg(msub.add_parser("rm", help="remove the mappings", parents=[c.common]))
    sg(cmd("step-down", "unpin a member's active instance")).add_argument("member", metavar="MEMBER")


def _observation_commands(c: _Commands) -> None:
    """members, status, lag, reconcile."""
    cmd, sg, kinded = c.cmd, c.sg, c.kinded
    kinded(sg(cmd("members", "member consumers: partitions, pin, pending")))
    kinded(sg(cmd("status", "backlog per partition and member")))
    p = sg(cmd("lag", "per member: backlog, in flight, age of the oldest pending message, pin holder, and (with "
                      "--sink) the last committed batch"))
    from airflow_provider_cg.core.landing.sinks.options import add_sink_arguments

    add_sink_arguments(p, sink_help="read each member's last committed batch from this sink (the jobs' sink "
                                    "options; credentials from the environment as for the job: AWS_*, CG_PG_DSN, "
                                    "CG_ICEBERG_CATALOG_URI)")
    p.add_argument("--stream-life", metavar="new:CREATED|continue:CREATED|went-back:SEQ",
                   help="with --sink: record the origin's current life in the table (after the stream was deleted "
                        "and created again, or its store went back to SEQ), as the job's option of that name does: "
                        "its jobs then land it")
    sg(cmd("reconcile", "re-apply the membership to the member consumers"))


def _position_commands(c: _Commands) -> None:
    """layout, resize, reset: moving a group's partitions and positions."""
    cmd, sg = c.cmd, c.sg
    p = sg(cmd("layout", "move an elastic group to another layout (work-queue / partition-streams) with nothing "
                         "lost or landed twice; the move waits until the side it leaves is landed. Again in "
                         "partition-streams: rebuild partition streams that are missing, lost messages or have no server"))
    p.add_argument("layout", choices=layouts.NAMES, metavar="LAYOUT", help=" or ".join(layouts.NAMES))
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the side the group leaves to be landed (the work queue, or the "
                        "partition log); if it is not, the group stays filling or draining and running the command "
                        "again goes on")
    p.add_argument("--partition-replicas", type=int, metavar="N",
                   help="(to partition-streams) the partition streams' replicas, 1 to 5 (default 1: the "
                        "partition log keeps the work queue's replicas and every message until it is landed)")
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


def _offline_commands(c: _Commands) -> None:
    """plan, maintain, hash: no server."""
    from airflow_provider_cg.core.landing.sinks.options import add_sink_arguments

    cmd = c.cmd
    p = cmd("plan", "offline: partitions per member, and what moves with --next-members", parents=(c.offline,))
    p.add_argument("--max-members", type=int, required=True, metavar="N")
    p.add_argument("--members", action="append", metavar="a,b,c")
    p.add_argument("--mappings", metavar="JSON")
    p.add_argument("--next-members", action="append", metavar="a,b,c,d")
    p.add_argument("--next-mappings", metavar="JSON")
    p.add_argument("--assignment", choices=("block", "sticky"), default="block",
                   help="the algorithm whose moves are listed (both are counted)")

    p = cmd("maintain", "offline: maintain a Delta or Iceberg table the jobs land into, safely while they land: "
                        "compaction (Delta), a checkpoint, old versions and unreferenced files removed",
            parents=(c.offline,))
    add_sink_arguments(p, sink_help="the table's sink, delta or iceberg, with the jobs' sink options (credentials "
                                    "from the environment: AWS_*, CG_ICEBERG_CATALOG_URI)")
    p.add_argument("--compact", action=argparse.BooleanOptionalAction, default=None,
                   help="compact small files (default: yes for Delta; Iceberg has no compaction in pyiceberg)")
    p.add_argument("--retention-hours", type=float, default=168.0, metavar="HOURS",
                   help="keep old versions and unreferenced files this long (>= 1; default 168)")

    p = cmd("hash", "offline: the partition of subjects (SUBJECT... or - for stdin)", parents=(c.offline,))
    p.add_argument("--partitions", type=int, required=True, metavar="N")
    p.add_argument("--filter", metavar="F", help="partitioning filter the subjects match")
    p.add_argument("--wildcards", default="", metavar="1,2", help="wildcard indexes of --filter to hash")
    p.add_argument("subjects", nargs="+", metavar="SUBJECT")
