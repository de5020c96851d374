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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.names import (
    ELASTIC,
    MAX_NAME_LEN,
    MAX_PARTITIONS,
    PLACEHOLDER_RE,
    STATIC,
    is_mirror_consumer,
    static_consumer_name,
    subjects_intersect,
    validate_name,
    validate_names,
    validate_subject,
)

_INT64_MAX = 2**63 - 1


_INT64_MAX = 2**63 - 1


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



GroupConfig = StaticGroupConfig | ElasticGroupConfig
#: either kind, the same one in and out
AnyConfig = TypeVar("AnyConfig", bound=GroupConfig)


def _validate_partitioning_filter(where: str, pf: PartitioningFilter) -> None:
    validate_subject(f"{where}.filter", pf.filter)
    tokens = pf.filter.split(".")
    for tok in tokens:
        if PLACEHOLDER_RE.match(tok):
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


def with_members(cfg: GroupConfig, members: Iterable[str]) -> GroupConfig:
    """A validated copy with ``members`` set and the mappings cleared (as orbit does)."""
    if isinstance(members, str):
        raise ConfigError("members", "must be a list of member names, not one string")
    return dataclasses.replace(cfg, members=tuple(members), member_mappings=()).validate()


def with_mappings(
    cfg: AnyConfig, mappings: Iterable[MemberMapping] | Mapping[str, Iterable[int]]
) -> AnyConfig:
    """A validated copy with ``member_mappings`` set and the members cleared (as orbit does).

    ``mappings`` is a list of :class:`MemberMapping` or a ``{member: partitions}`` dict.
    """
    if isinstance(mappings, Mapping):
        items = tuple(MemberMapping(m, tuple(ps)) for m, ps in mappings.items())
    else:
        items = tuple(mappings)
    new = dataclasses.replace(cfg, members=(), member_mappings=items)
    new.validate()  # returns ``new`` itself
    return new


def current_members(cfg: GroupConfig) -> list[str]:
    """The group's members: its member list, or the members of its mappings (the two exclude
    each other), each once, in order. The one membership query; ``in_membership`` asks it."""
    if cfg.member_mappings:
        return list(dict.fromkeys(mm.member for mm in cfg.member_mappings))
    return list(dict.fromkeys(cfg.members))


def in_membership(cfg: GroupConfig, member: str) -> bool:
    """Whether ``member`` is listed in the members or the mappings (orbit's IsInMembership)."""
    return member in current_members(cfg)
