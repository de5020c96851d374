"""The names and subjects of consumer groups (orbit ``pcgroups``' rules, and ours on top): the
kinds and their KV buckets, the names composed from a group's (``<stream>.<group>``,
``<stream>-<group>``, ``<group>-<member>``, the partition mirrors'), and what a stream, group,
member name or subject filter may be. No Airflow imports: this module runs on Spark drivers too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from airflow_provider_cg.core.errors import ConfigError

STATIC = "static"


ELASTIC = "elastic"


KINDS = (STATIC, ELASTIC)


KV_BUCKETS = {STATIC: "static-consumer-groups", ELASTIC: "elastic-consumer-groups"}


#: Upper bound for ``max_members`` (= the number of partitions).
MAX_PARTITIONS = 65_536


#: nats-server's JSMaxNameLen: streams and consumers, in bytes.
MAX_NAME_LEN = 255


_KV_NAME_RE = re.compile(r"[-_=A-Za-z0-9]+")


_NAME_FORBIDDEN = ".*>/\\"


PLACEHOLDER_RE = re.compile(r"^(\$\d+|\{\{.*\}\})$")


PARTITION_FN_RE = re.compile(r"^\{\{\s*[pP]artition\s*\(\s*(\d+)")


MULTI_TOKEN_FN_RE = re.compile(r"^\{\{\s*([sS]plit|[sS]lice)")


def config_key(stream: str, group: str) -> str:
    """The KV key of a group's config: ``<stream>.<group>``."""
    return f"{stream}.{group}"


def work_queue_stream(stream: str, group: str) -> str:
    """The work-queue stream of an elastic group: ``<stream>-<group>``."""
    return f"{stream}-{group}"


def static_consumer_name(group: str, member: str) -> str:
    """The durable consumer of a static group's member: ``<group>-<member>``."""
    return f"{group}-{member}"


def _bad_char(value: str) -> str | None:
    for ch in value:
        if ch.isspace():
            return "must not contain whitespace"
        if ch in _NAME_FORBIDDEN:
            return f"must not contain {ch!r}"
        if not ch.isprintable():
            return f"must not contain the non-printable character {ch!r}"
    return None


def mirror_consumer(p: int) -> str:
    """The name of partition ``p``'s mirror consumer on the work queue (``partition_streams.py``):
    a name no member may take (``config.py`` refuses it)."""
    return f"cg-partition-{p}"


def is_mirror_consumer(name: str) -> bool:
    head, _, tail = name.rpartition("-")
    return head == "cg-partition" and tail.isdigit()


def validate_name(field: str, value: Any, kind: str | None = None) -> str:
    """Check a stream, group or member name; return it, or raise ``ConfigError(field, rule)``.

    ``kind`` is ``"stream"``, ``"group"`` or ``"member"``; when omitted it is taken from
    ``field`` if that is one of those words, else ``"stream"``.

    All kinds: a non-empty string of at most 255 UTF-8 bytes without whitespace, ``.``, ``*``,
    ``>``, ``/``, ``\\`` or non-printable characters (nats-server's rules for stream and consumer
    names, plus non-printables). ``stream`` and ``group`` are also restricted to ``A-Z a-z 0-9 - _
    =`` because they form the KV key ``<stream>.<group>``. Limits on composed names need both
    parts: see :func:`validate_names`.
    """
    if kind is None:
        kind = field if field in ("stream", "group", "member") else "stream"
    if kind not in ("stream", "group", "member"):
        raise ValueError(f"unknown name kind {kind!r}")
    if not isinstance(value, str):
        raise ConfigError(field, f"{kind} name must be a string")
    if not value:
        raise ConfigError(field, f"{kind} name must not be empty")
    if len(value.encode()) > MAX_NAME_LEN:
        raise ConfigError(field, f"{kind} name must be at most {MAX_NAME_LEN} bytes")
    bad = _bad_char(value)
    if bad:
        raise ConfigError(field, f"{kind} name {bad}")
    if kind in ("stream", "group") and not _KV_NAME_RE.fullmatch(value):
        raise ConfigError(field, f"{kind} name may only contain A-Z a-z 0-9 - _ = (it is part of a KV key)")
    return value


def validate_names(stream: str, group: str, kind: str | None = None) -> None:
    """Check a stream and group name pair, including the composed work-queue stream name.

    ``<stream>-<group>`` must fit in 255 bytes for elastic groups (``kind`` ``"elastic"`` or
    ``None``); static groups have no work-queue stream.
    """
    validate_name("stream", stream, "stream")
    validate_name("group", group, "group")
    if kind != STATIC and len(work_queue_stream(stream, group).encode()) > MAX_NAME_LEN:
        raise ConfigError(
            "group", f"the work-queue stream name '<stream>-<group>' must be at most {MAX_NAME_LEN} bytes"
        )


def validate_subject(field: str, subject: Any, *, wildcards: bool = True) -> str:
    """Check a subject (filter): non-empty tokens, no whitespace or non-printables, ``>`` last.

    ``*`` and ``>`` are wildcards only as whole tokens (``a.b*`` is a literal subject, as for
    the server). ``wildcards=False`` requires a literal subject.
    """
    if not isinstance(subject, str):
        raise ConfigError(field, "subject must be a string")
    if not subject:
        raise ConfigError(field, "subject must not be empty")
    for ch in subject:
        if ch.isspace() or not ch.isprintable():
            raise ConfigError(field, f"subject must not contain {ch!r}")
    tokens = subject.split(".")
    for i, tok in enumerate(tokens):
        if not tok:
            raise ConfigError(field, "subject must not have empty tokens")
        if tok in ("*", ">") and not wildcards:
            raise ConfigError(field, "subject must not contain wildcards")
        if tok == ">" and i != len(tokens) - 1:
            raise ConfigError(field, "'>' may only be the last token")
    return subject


def subjects_intersect(a: str, b: str) -> bool:
    """Whether some literal subject matches both subject patterns ``a`` and ``b``.

    ``*`` matches exactly one token, a final ``>`` one or more tokens.
    """
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        if i >= len(ta) or i >= len(tb):
            return False  # different lengths and no '>' before the shorter one ended
        x, y = ta[i], tb[i]
        if x == ">" or y == ">":
            return True  # the other side has a token here, and so at least one more
        if x != y and x != "*" and y != "*":
            return False
    return True


def subjects_regex(subjects: Iterable[str]) -> str:
    """A regular expression matching exactly the subjects that match any of ``subjects`` (NATS
    wildcards: ``*`` one token, ``>`` one or more trailing tokens)."""
    def one(subject: str) -> str:
        out = []
        for t in subject.split("."):
            out.append(r"[^.]+" if t == "*" else r"[^.]+(?:\.[^.]+)*" if t == ">" else re.escape(t))
        return r"\.".join(out)
    return "^(?:" + "|".join(one(s) for s in subjects) + ")$"
