"""Consumer-group configurations, stored as JSON in orbit ``pcgroups``' KV buckets.

Two kinds, as in Synadia orbit:

* ``static``: the origin stream's subjects already start with the partition number (a stream
  subject transform put it there); members consume the origin stream directly.
* ``elastic``: a work-queue stream ``<stream>-<group>`` sources the origin stream and puts the
  partition number in front of each subject; members consume that stream.

The JSON uses orbit's current field names and is written the way Go's ``encoding/json`` writes
it (compact, struct field order, ``omitempty``, ``<``/``>``/``&`` escaped as ``\\u003c`` ...), so a
config written here is byte-identical to orbit's. A config in orbit v0.1's shape (one
top-level ``filter`` with ``partitioning_wildcards``; static: one ``filter`` string) is read
as such and written back in that shape (``orbit_v01``), since v0.1 instances stop when the
filter fields of a config they watch change. Seed 000's names (``filter``,
``partitioning-wildcards``, ``msg-buffer-size``, ``member-mappings``) are accepted on read and
written back in the current shape.

Limits enforced on top of orbit's own rules (see :meth:`ElasticGroupConfig.validate`):

* ``max_members`` (the number of partitions) is 1..:data:`MAX_PARTITIONS` (65,536; orbit sets
  no bound): a lone member's consumer carries one filter subject per partition, and its
  config must fit in one message; the bound also keeps what a stored config costs to read
  (status, assignment) small.
* stream and group names must be JetStream names *and* usable in the KV key ``<stream>.<group>``
  (``A-Z a-z 0-9 - _ =``); member names must be valid consumer names; all names are at most
  :data:`MAX_NAME_LEN` (255) UTF-8 bytes, including the composed names ``<stream>-<group>``
  (elastic work-queue stream) and ``<group>-<member>`` (static member consumer).

No Airflow imports: this module runs on Spark drivers too.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from airflow_provider_cg.core.errors import ConfigError

__all__ = [
    "ELASTIC",
    "KINDS",
    "KV_BUCKETS",
    "MAX_NAME_LEN",
    "MAX_PARTITIONS",
    "STATIC",
    "ElasticGroupConfig",
    "GroupConfig",
    "MemberMapping",
    "PartitioningFilter",
    "StaticGroupConfig",
    "check_change",
    "config_key",
    "in_membership",
    "load_config",
    "static_consumer_name",
    "subjects_intersect",
    "validate_against_stream",
    "validate_name",
    "validate_names",
    "validate_subject",
    "with_mappings",
    "with_members",
    "work_queue_stream",
]

STATIC = "static"
ELASTIC = "elastic"
KINDS = (STATIC, ELASTIC)
KV_BUCKETS = {STATIC: "static-consumer-groups", ELASTIC: "elastic-consumer-groups"}

#: Upper bound for ``max_members`` (= the number of partitions).
MAX_PARTITIONS = 65_536
#: nats-server's JSMaxNameLen: streams and consumers, in bytes.
MAX_NAME_LEN = 255
_INT64_MAX = 2**63 - 1

# Stream and group names end up in the KV key "<stream>.<group>"; nats.go and nats-py only accept
# keys matching [-/_=.a-zA-Z0-9]+, and "/" and "." are not allowed in JetStream names.
_KV_NAME_RE = re.compile(r"[-_=A-Za-z0-9]+")
# Characters nats-server refuses in stream and consumer names (besides whitespace).
_NAME_FORBIDDEN = ".*>/\\"
# A filter token that a transform destination would read as a placeholder ($1, {{...}}).
_PLACEHOLDER_RE = re.compile(r"^(\$\d+|\{\{.*\}\})$")
_PARTITION_FN_RE = re.compile(r"^\{\{\s*[pP]artition\s*\(\s*(\d+)")
_MULTI_TOKEN_FN_RE = re.compile(r"^\{\{\s*([sS]plit|[sS]lice)")


def config_key(stream: str, group: str) -> str:
    """The KV key of a group's config: ``<stream>.<group>``."""
    return f"{stream}.{group}"


def work_queue_stream(stream: str, group: str) -> str:
    """The work-queue stream of an elastic group: ``<stream>-<group>``."""
    return f"{stream}-{group}"


def static_consumer_name(group: str, member: str) -> str:
    """The durable consumer of a static group's member: ``<group>-<member>``."""
    return f"{group}-{member}"


# --------------------------------------------------------------------------- names and subjects


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


# --------------------------------------------------------------------------- data classes


def subjects_regex(subjects: Iterable[str]) -> str:
    """A regular expression matching exactly the subjects that match any of ``subjects`` (NATS
    wildcards: ``*`` one token, ``>`` one or more trailing tokens)."""
    def one(subject: str) -> str:
        out = []
        for t in subject.split("."):
            out.append(r"[^.]+" if t == "*" else r"[^.]+(?:\.[^.]+)*" if t == ">" else re.escape(t))
        return r"\.".join(out)
    return "^(?:" + "|".join(one(s) for s in subjects) + ")$"


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value


@dataclass(frozen=True)
class MemberMapping:
    """An explicit assignment of partitions to a member."""

    member: str
    partitions: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", _tuple(self.partitions))

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "partitions": list(self.partitions)}


@dataclass(frozen=True)
class PartitioningFilter:
    """A filter on the origin stream and the ``*`` wildcards (1-based) hashed into the partition.

    No wildcard indexes means the whole subject is hashed.
    """

    filter: str
    partitioning_wildcards: tuple[int, ...] = ()
    # Go keeps nil (null) and [] apart and orbit compares configs with DeepEqual: an empty list
    # is written as null (Go's nil, what orbit writes for none) unless it was read as [].
    wildcards_null: bool = field(default=True, compare=False, repr=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitioning_wildcards", _tuple(self.partitioning_wildcards))

    def to_dict(self) -> dict[str, Any]:
        wcs = self.partitioning_wildcards
        return {
            "filter": self.filter,
            "partitioning_wildcards": None if (self.wildcards_null and not wcs) else list(wcs),
        }


def _check_int(field: str, value: Any, low: int, high: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"{what} must be an integer")
    if not low <= value <= high:
        raise ConfigError(field, f"{what} must be between {low} and {high}")


class _GroupConfigBase:
    """Validation and JSON shared by both kinds (fields are declared by the dataclasses)."""

    kind: ClassVar[str]
    _filters_attr: ClassVar[str]  # the name of the kind's filter list
    max_members: int
    members: tuple[str, ...]
    member_mappings: tuple[MemberMapping, ...]

    def __post_init__(self) -> None:
        for name in ("members", "member_mappings", self._filters_attr):
            object.__setattr__(self, name, _tuple(getattr(self, name)))

    @property
    def partition_count(self) -> int:
        """The number of partitions (``max_members``)."""
        return self.max_members

    # -- validation --------------------------------------------------------------------------

    def validate(self, stream: str | None = None, group: str | None = None) -> Self:
        """Check orbit's rules and ours; return ``self`` or raise ``ConfigError(field, rule)``.

        With ``stream`` and ``group`` the names and the composed names are checked too.
        """
        if stream is not None and group is not None:
            validate_names(stream, group, self.kind)
        elif stream is not None:
            validate_name("stream", stream, "stream")
        elif group is not None:
            validate_name("group", group, "group")
        _check_int("max_members", self.max_members, 1, MAX_PARTITIONS, "max_members")
        self._validate_filters()
        self._validate_membership(group)
        return self

    def _validate_filters(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _validate_membership(self, group: str | None) -> None:
        n = self.max_members
        if not isinstance(self.members, tuple):
            raise ConfigError("members", "must be a list of member names")
        if not isinstance(self.member_mappings, tuple):
            raise ConfigError("member_mappings", "must be a list of mappings")
        if self.members and self.member_mappings:
            raise ConfigError("member_mappings", "members and member_mappings are mutually exclusive")
        for i, m in enumerate(self.members):
            self._check_member(f"members[{i}]", m, group)
        if not self.member_mappings:
            return
        if len(self.member_mappings) > n:
            raise ConfigError("member_mappings", f"must have between 1 and max_members ({n}) entries")
        seen_members: set[str] = set()
        owner: dict[int, int] = {}
        for i, mm in enumerate(self.member_mappings):
            where = f"member_mappings[{i}]"
            if not isinstance(mm, MemberMapping):
                raise ConfigError(where, "must be a MemberMapping")
            self._check_member(f"{where}.member", mm.member, group)
            if mm.member in seen_members:
                raise ConfigError(f"{where}.member", f"duplicate member name {mm.member!r}")
            seen_members.add(mm.member)
            if not isinstance(mm.partitions, tuple):
                raise ConfigError(f"{where}.partitions", "must be a list of partition numbers")
            for j, p in enumerate(mm.partitions):
                pfield = f"{where}.partitions[{j}]"
                _check_int(pfield, p, 0, n - 1, "partition number")
                if p in owner:
                    raise ConfigError(pfield, f"partition {p} is already used by member_mappings[{owner[p]}]")
                owner[p] = i
        missing = [p for p in range(n) if p not in owner]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            raise ConfigError(
                "member_mappings", f"every partition 0..{n - 1} must be mapped; missing {shown}"
            )

    def _check_member(self, field: str, member: Any, group: str | None) -> None:
        validate_name(field, member, "member")
        if self.kind == ELASTIC and is_mirror_consumer(member):
            raise ConfigError(field, f"{member!r}: names of the form cg-partition-<n> are the consumers of the "
                                     "partition mirrors on the work queue (groups/layouts/partition_streams.py); choose another name")
        if (
            self.kind == STATIC
            and group is not None
            and len(static_consumer_name(group, member).encode()) > MAX_NAME_LEN
        ):
            raise ConfigError(
                field, f"the consumer name '<group>-<member>' must be at most {MAX_NAME_LEN} bytes"
            )

    # -- JSON --------------------------------------------------------------------------------

    def _membership_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.members:
            d["members"] = list(self.members)
        if self.member_mappings:
            d["member_mappings"] = [mm.to_dict() for mm in self.member_mappings]
        return d

    def to_json(self) -> bytes:
        """Compact JSON in orbit's current field names, byte-identical to Go's ``json.Marshal``."""
        return _go_json(self.to_dict())  # type: ignore[attr-defined]


@dataclass(frozen=True)
class StaticGroupConfig(_GroupConfigBase):
    """A static group: the origin's subjects already start with the partition number.

    An empty ``filters`` means every subject (members use ``<p>.>``), as orbit does with an
    empty filter.
    """

    max_members: int
    filters: tuple[str, ...]
    members: tuple[str, ...] = ()
    member_mappings: tuple[MemberMapping, ...] = ()
    #: read in orbit v0.1's shape (one ``filter`` string): written back the same way, and
    #: members consume ``<p>.>`` as orbit v0.1 does
    orbit_v01: bool = field(default=False, compare=False, repr=False, kw_only=True)

    kind: ClassVar[str] = STATIC
    _filters_attr: ClassVar[str] = "filters"

    def _validate_filters(self) -> None:
        if not isinstance(self.filters, tuple):
            raise ConfigError("filters", "must be a list of subjects")
        for i, f in enumerate(self.filters):
            validate_subject(f"filters[{i}]", f)
            for j in range(i):
                if subjects_intersect(self.filters[j], f):
                    raise ConfigError(
                        f"filters[{i}]",
                        f"overlaps filters[{j}] (a consumer's filter subjects cannot overlap)",
                    )

    def to_dict(self) -> dict[str, Any]:
        if self.orbit_v01 and len(self.filters) <= 1:
            return {"max_members": self.max_members, "filter": self.filters[0] if self.filters else "",
                    **self._membership_dict()}
        d: dict[str, Any] = {"max_members": self.max_members}
        if self.filters:  # orbit: `json:"filters,omitempty"`
            d["filters"] = list(self.filters)
        return {**d, **self._membership_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StaticGroupConfig:
        return _static_from_dict(data)

    @classmethod
    def from_json(cls, data: bytes | str) -> StaticGroupConfig:
        return _static_from_dict(_parse_json(data))


@dataclass(frozen=True)
class ElasticGroupConfig(_GroupConfigBase):
    """An elastic group: a work-queue stream sources the origin and inserts the partition token.

    No partitioning filters means every subject, partitioned on the whole subject.
    ``max_buffered_msgs`` / ``max_buffered_bytes`` limit the work-queue stream (0 = unlimited).
    """

    max_members: int
    partitioning_filters: tuple[PartitioningFilter, ...] = ()
    max_buffered_msgs: int = 0
    max_buffered_bytes: int = 0
    members: tuple[str, ...] = ()
    member_mappings: tuple[MemberMapping, ...] = ()
    #: no partitioning filters: written as null (Go's nil, as orbit writes) unless read as []
    filters_null: bool = field(default=True, compare=False, repr=False, kw_only=True)
    #: read in orbit v0.1's shape (top-level ``filter`` and ``partitioning_wildcards``):
    #: written back the same way (orbit v0.1 instances stop on a config whose filter changed),
    #: and members consume ``<p>.>`` as orbit v0.1 does
    orbit_v01: bool = field(default=False, compare=False, repr=False, kw_only=True)

    kind: ClassVar[str] = ELASTIC
    _filters_attr: ClassVar[str] = "partitioning_filters"

    def _validate_filters(self) -> None:
        _check_int("max_buffered_msg", self.max_buffered_msgs, 0, _INT64_MAX, "max_buffered_msg")
        _check_int("max_buffered_bytes", self.max_buffered_bytes, 0, _INT64_MAX, "max_buffered_bytes")
        if not isinstance(self.partitioning_filters, tuple):
            raise ConfigError("partitioning_filters", "must be a list of partitioning filters")
        for i, pf in enumerate(self.partitioning_filters):
            where = f"partitioning_filters[{i}]"
            if not isinstance(pf, PartitioningFilter):
                raise ConfigError(where, "must be a PartitioningFilter")
            _validate_partitioning_filter(where, pf)
            for j in range(i):
                if subjects_intersect(self.partitioning_filters[j].filter, pf.filter):
                    raise ConfigError(
                        f"{where}.filter",
                        f"overlaps partitioning_filters[{j}].filter (a source's filters cannot overlap)",
                    )

    def to_dict(self) -> dict[str, Any]:
        pfs = self.partitioning_filters
        d: dict[str, Any] = {"max_members": self.max_members}
        if self.orbit_v01 and len(pfs) <= 1:
            pf = pfs[0].to_dict() if pfs else {"filter": "", "partitioning_wildcards": None}
            d.update(pf)
        else:
            d["partitioning_filters"] = None if (self.filters_null and not pfs) else [pf.to_dict() for pf in pfs]
        if self.max_buffered_msgs:
            d["max_buffered_msg"] = self.max_buffered_msgs
        if self.max_buffered_bytes:
            d["max_buffered_bytes"] = self.max_buffered_bytes
        d.update(self._membership_dict())
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ElasticGroupConfig:
        return _elastic_from_dict(data)

    @classmethod
    def from_json(cls, data: bytes | str) -> ElasticGroupConfig:
        return _elastic_from_dict(_parse_json(data))


GroupConfig = StaticGroupConfig | ElasticGroupConfig


def _validate_partitioning_filter(where: str, pf: PartitioningFilter) -> None:
    validate_subject(f"{where}.filter", pf.filter)
    tokens = pf.filter.split(".")
    for tok in tokens:
        if _PLACEHOLDER_RE.match(tok):
            raise ConfigError(
                f"{where}.filter",
                f"token {tok!r} would be read as a placeholder in the transform destination",
            )
    stars = tokens.count("*")
    if stars == 0 and tokens[-1] != ">":
        raise ConfigError(f"{where}.filter", "must contain at least one '*' wildcard or end with '>'")
    wcs = pf.partitioning_wildcards
    if not isinstance(wcs, tuple):
        raise ConfigError(f"{where}.partitioning_wildcards", "must be a list of wildcard indexes")
    if len(wcs) > stars:
        raise ConfigError(
            f"{where}.partitioning_wildcards",
            f"must not have more indexes than the filter has '*' wildcards ({stars})",
        )
    seen: set[int] = set()
    for k, w in enumerate(wcs):
        wfield = f"{where}.partitioning_wildcards[{k}]"
        _check_int(wfield, w, 1, stars, "wildcard index (1-based, at most the number of '*')")
        if w in seen:
            raise ConfigError(wfield, f"wildcard index {w} is given twice")
        seen.add(w)


# --------------------------------------------------------------------------- JSON reading


def _go_json(obj: Any) -> bytes:
    """``json.Marshal``-compatible bytes: compact, UTF-8, HTML-sensitive characters escaped."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for raw, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, esc)
    return text.encode()


def _parse_json(data: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            data = bytes(data).decode()
        except UnicodeDecodeError as e:
            raise ConfigError("config", f"not UTF-8: {e.reason}") from None
    if not isinstance(data, str):
        raise ConfigError("config", "must be JSON bytes, a JSON string or a dict")
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise ConfigError("config", f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ConfigError("config", "must be a JSON object")
    return obj


def _pick(d: Mapping[str, Any], new: str, old: str) -> tuple[Any, str]:
    """The value under the current name or the old one (not both); and the name it came from."""
    if d.get(new) is not None and d.get(old) is not None:
        raise ConfigError(old, f"cannot be given together with {new!r} (its newer name)")
    if d.get(old) is not None:
        return d[old], old
    return d.get(new), new


def _read_int(value: Any, field: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, "must be an integer")
    return value


def _read_elem(value: Any, field: str) -> int:
    """A list element: null is an error here (Go would silently read it as 0)."""
    if value is None:
        raise ConfigError(field, "must be an integer")
    return _read_int(value, field)


def _read_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(field, "must be a string")
    return value


def _read_list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ConfigError(field, "must be a list")
    return list(value)


def _read_members(d: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[MemberMapping, ...]]:
    members = tuple(
        _read_str(m, f"members[{i}]") for i, m in enumerate(_read_list(d.get("members"), "members"))
    )
    raw, name = _pick(d, "member_mappings", "member-mappings")
    mappings = []
    for i, mm in enumerate(_read_list(raw, name)):
        where = f"{name}[{i}]"
        if not isinstance(mm, Mapping):
            raise ConfigError(where, "must be an object with 'member' and 'partitions'")
        member = _read_str(mm.get("member"), f"{where}.member")
        parts = tuple(
            _read_elem(p, f"{where}.partitions[{j}]")
            for j, p in enumerate(_read_list(mm.get("partitions"), f"{where}.partitions"))
        )
        mappings.append(MemberMapping(member, parts))
    return members, tuple(mappings)


def _static_from_dict(d: Mapping[str, Any]) -> StaticGroupConfig:
    max_members = _read_int(d.get("max_members"), "max_members")
    raw, name = _pick(d, "filters", "filter")
    if name == "filter":  # orbit's earlier single filter (the pcgroups design, Java, .NET): "" means all
        filters: tuple[str, ...] = (f,) if (f := _read_str(raw, "filter")) else ()
    else:
        filters = tuple(_read_str(f, f"filters[{i}]") for i, f in enumerate(_read_list(raw, "filters")))
    members, mappings = _read_members(d)
    v01 = name == "filter" and "member-mappings" not in d
    return StaticGroupConfig(max_members, filters, members, mappings, orbit_v01=v01)


def _elastic_from_dict(d: Mapping[str, Any]) -> ElasticGroupConfig:
    max_members = _read_int(d.get("max_members"), "max_members")
    old_filter = d.get("filter")
    old_wcs, wcs_name = _pick(d, "partitioning_wildcards", "partitioning-wildcards")
    null, v01 = True, False
    if old_filter is not None or old_wcs is not None:  # orbit v0.1 / the pcgroups design: one filter + its wildcards
        if d.get("partitioning_filters") is not None:
            raise ConfigError(
                "filter", "cannot be given together with 'partitioning_filters' (its newer name)"
            )
        f = _read_str(old_filter, "filter") if old_filter is not None else ""
        wcs = tuple(
            _read_elem(w, f"{wcs_name}[{k}]") for k, w in enumerate(_read_list(old_wcs, wcs_name))
        )
        pfs: tuple[PartitioningFilter, ...] = (
            (PartitioningFilter(f, wcs, wildcards_null=old_wcs is None),) if (f or wcs) else ()
        )
        # orbit v0.1's names (the pcgroups design used hyphenated ones, rewritten in the current shape)
        v01 = not any(k in d for k in ("partitioning-wildcards", "msg-buffer-size", "member-mappings"))
    else:
        raw = d.get("partitioning_filters")
        null = raw is None
        items = []
        for i, pf in enumerate(_read_list(raw, "partitioning_filters")):
            where = f"partitioning_filters[{i}]"
            if not isinstance(pf, Mapping):
                raise ConfigError(where, "must be an object with 'filter' and 'partitioning_wildcards'")
            f = _read_str(pf.get("filter"), f"{where}.filter")
            raw_wcs = pf.get("partitioning_wildcards")
            wcs = tuple(
                _read_elem(w, f"{where}.partitioning_wildcards[{k}]")
                for k, w in enumerate(_read_list(raw_wcs, f"{where}.partitioning_wildcards"))
            )
            items.append(PartitioningFilter(f, wcs, wildcards_null=raw_wcs is None))
        pfs = tuple(items)
    raw_msgs, msgs_name = _pick(d, "max_buffered_msg", "msg-buffer-size")
    max_msgs = _read_int(raw_msgs, msgs_name)
    max_bytes = _read_int(d.get("max_buffered_bytes"), "max_buffered_bytes")
    members, mappings = _read_members(d)
    return ElasticGroupConfig(max_members, pfs, max_msgs, max_bytes, members, mappings, filters_null=null,
                              orbit_v01=v01)


def load_config(kind: str, data: bytes | str | Mapping[str, Any]) -> GroupConfig:
    """Parse a stored config of ``kind`` (``"static"`` / ``"elastic"``).

    Reads current and older field names; raises ``ConfigError`` for bad JSON or wrong types.
    Does not validate the rules: call ``.validate()``.
    """
    if kind == STATIC:
        return _static_from_dict(_parse_json(data))
    if kind == ELASTIC:
        return _elastic_from_dict(_parse_json(data))
    raise ConfigError("kind", f"must be one of {', '.join(KINDS)}")


# --------------------------------------------------------------------------- stream checks


def _pattern(field: str, subject: str) -> str:
    """A stream subject or transform destination as a plain pattern.

    ``$N`` and ``{{fn(...)}}`` tokens become ``*``; a split/slice function may yield several
    tokens, so the pattern is cut there and ends in ``>`` (a superset: never a false alarm).
    """
    if not isinstance(subject, str) or not subject:
        raise ConfigError(field, "subject must be a non-empty string")
    tokens: list[str] = []
    for tok in subject.split("."):
        if _MULTI_TOKEN_FN_RE.match(tok):
            tokens.append(">")
            break
        tokens.append("*" if _PLACEHOLDER_RE.match(tok) else tok)
    return validate_subject(field, ".".join(tokens))


def validate_against_stream(cfg: GroupConfig, origin_subjects: Sequence[str]) -> None:
    """Check that the group's filters can match what the origin stream stores.

    ``origin_subjects`` are the subjects as *stored*: the stream's subjects, or, when the
    stream has a subject transform, its destination (``{{...}}`` and ``$N`` tokens count as
    ``*``). For a stream with sources and no subjects, pass the sourced subjects.

    * elastic: every partitioning filter must intersect at least one stored subject.
    * static: every stored subject must start with a partition token: ``*`` (a placeholder) or
      a number below ``max_members``; a ``{{partition(N, ...)}}`` first token must have
      ``N == max_members``. Each ``<p>.<filter>`` must intersect a stored subject.

    Not checkable from subjects alone: that a plain ``*`` first token really carries partition
    numbers, or how the stored messages are spread; the server decides those at publish time.
    """
    subjects = list(origin_subjects)
    if not subjects:
        raise ConfigError("origin_subjects", "the stream has no subjects to check the filters against")
    patterns = [_pattern(f"origin_subjects[{i}]", s) for i, s in enumerate(subjects)]
    if cfg.kind == ELASTIC:
        for i, pf in enumerate(cfg.partitioning_filters):  # type: ignore[union-attr]
            if not any(subjects_intersect(pf.filter, p) for p in patterns):
                raise ConfigError(
                    f"partitioning_filters[{i}].filter",
                    f"matches none of the stream's subjects {subjects}",
                )
        return
    for i, (raw, pat) in enumerate(zip(subjects, patterns, strict=True)):
        first_raw, first = raw.split(".")[0], pat.split(".")[0]
        where = f"origin_subjects[{i}]"
        m = _PARTITION_FN_RE.match(first_raw)
        if m and int(m.group(1)) != cfg.max_members:
            raise ConfigError(
                where, f"partitions into {int(m.group(1))} partitions but max_members is {cfg.max_members}"
            )
        if first == "*":
            continue
        if first.isdigit() and first.isascii():
            if int(first) >= cfg.max_members:
                raise ConfigError(
                    where, f"partition token {first} is not below max_members ({cfg.max_members})"
                )
            continue
        raise ConfigError(where, "must start with the partition number token ('*' or a number)")
    filters = cfg.filters or (">",)  # type: ignore[union-attr]
    for i, f in enumerate(filters):
        if not any(subjects_intersect(f"*.{f}", p) for p in patterns):
            where = f"filters[{i}]" if cfg.filters else "filters"  # type: ignore[union-attr]
            raise ConfigError(where, f"'<partition>.{f}' matches none of the stream's subjects {subjects}")


# --------------------------------------------------------------------------- changes


def check_change(old: GroupConfig, new: GroupConfig) -> None:
    """Raise ``ConfigError(field, "cannot change after the group is created")`` unless only
    ``members`` / ``member_mappings`` differ.

    Note: orbit's static members stop on *any* change of their config, membership included.
    """
    rule = "cannot change after the group is created"
    if old.kind != new.kind:
        raise ConfigError("kind", rule)
    if old.max_members != new.max_members:
        raise ConfigError("max_members", rule)
    if isinstance(old, StaticGroupConfig):
        assert isinstance(new, StaticGroupConfig)
        if len(old.filters) != len(new.filters):
            raise ConfigError("filters", rule)
        for i, (was, now) in enumerate(zip(old.filters, new.filters, strict=True)):
            if was != now:
                raise ConfigError(f"filters[{i}]", rule)
        return
    assert isinstance(new, ElasticGroupConfig)
    if len(old.partitioning_filters) != len(new.partitioning_filters):
        raise ConfigError("partitioning_filters", rule)
    for i, (a, b) in enumerate(zip(old.partitioning_filters, new.partitioning_filters, strict=True)):
        if a.filter != b.filter:
            raise ConfigError(f"partitioning_filters[{i}].filter", rule)
        if a.partitioning_wildcards != b.partitioning_wildcards:
            raise ConfigError(f"partitioning_filters[{i}].partitioning_wildcards", rule)
    if old.max_buffered_msgs != new.max_buffered_msgs:
        raise ConfigError("max_buffered_msg", rule)
    if old.max_buffered_bytes != new.max_buffered_bytes:
        raise ConfigError("max_buffered_bytes", rule)


def with_members(cfg: GroupConfig, members: Iterable[str]) -> GroupConfig:
    """A validated copy with ``members`` set and the mappings cleared (as orbit does)."""
    if isinstance(members, str):
        raise ConfigError("members", "must be a list of member names, not one string")
    return dataclasses.replace(cfg, members=tuple(members), member_mappings=()).validate()


def with_mappings(
    cfg: GroupConfig, mappings: Iterable[MemberMapping] | Mapping[str, Iterable[int]]
) -> GroupConfig:
    """A validated copy with ``member_mappings`` set and the members cleared (as orbit does).

    ``mappings`` is a list of :class:`MemberMapping` or a ``{member: partitions}`` dict.
    """
    if isinstance(mappings, Mapping):
        items = tuple(MemberMapping(m, tuple(ps)) for m, ps in mappings.items())
    else:
        items = tuple(mappings)
    return dataclasses.replace(cfg, members=(), member_mappings=items).validate()


def current_members(cfg: GroupConfig) -> list[str]:
    """The group's members: its member list, or the members of its mappings (the two exclude
    each other), each once, in order. The one membership query; ``in_membership`` asks it."""
    if cfg.member_mappings:
        return list(dict.fromkeys(mm.member for mm in cfg.member_mappings))
    return list(dict.fromkeys(cfg.members))


def in_membership(cfg: GroupConfig, member: str) -> bool:
    """Whether ``member`` is listed in the members or the mappings (orbit's IsInMembership)."""
    return member in current_members(cfg)
