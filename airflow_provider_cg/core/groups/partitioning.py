"""Partitions: the server's partition hash, member distribution, filters and plan diffs.

The hash is what nats-server's subject transform ``{{partition(N, i, j, ...)}}`` computes:
the source tokens at the ``*`` wildcards ``i, j, ...`` (1-based, in the order given) are
concatenated as UTF-8 bytes *without separator* and hashed with 32-bit FNV-1a, modulo ``N``.
``{{partition(N)}}`` (server 2.12+) hashes the whole subject, ``.`` separators included and
``>``-matched tokens too. Consequences worth knowing: ``a.bc`` and ``ab.c`` land in the same
partition when both tokens are selected, and ``partition(N,2,1)`` differs from
``partition(N,1,2)``.

The member distribution is the pcgroups design's (orbit's ``GeneratePartitionFilters``): de-duplicate,
sort, cap at ``max_members``, contiguous blocks of ``max_members // n``, the remainder
round-robin from the first member.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig

__all__ = [
    "assign_partitions",
    "distribute",
    "fnv1a_32",
    "member_filter_subjects",
    "member_partitions",
    "partition_key",
    "partition_of",
    "plan_moves",
    "strip_partition",
    "transform_destination",
]

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a of ``data`` (Go's ``hash/fnv.New32a``)."""
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def subject_matches(tokens: Sequence[str], pattern: Sequence[str]) -> bool:
    """Whether a subject (its tokens) matches a filter (its tokens, with ``*`` and ``>``)."""
    for i, p in enumerate(pattern):
        if p == ">":
            return len(tokens) > i
        if i >= len(tokens) or (p != "*" and p != tokens[i]):
            return False
    return len(tokens) == len(pattern)


def partition_key(subject: str, wildcards: Sequence[int] = (), filter: str | None = None) -> bytes:
    """The bytes the server hashes for ``subject`` (see :func:`partition_of`)."""
    tokens = subject.split(".")
    if not subject or any(t in ("", "*", ">") for t in tokens):
        raise ValueError(f"not a literal subject: {subject!r}")
    ftokens = filter.split(".") if filter is not None else None
    if ftokens is not None and not subject_matches(tokens, ftokens):
        raise ValueError(f"subject {subject!r} does not match the filter {filter!r}")
    if not wildcards:
        return subject.encode()
    if ftokens is None:
        raise ValueError("wildcard indexes need the filter that numbers the '*' wildcards")
    stars = [i for i, t in enumerate(ftokens) if t == "*"]
    key = bytearray()
    for w in wildcards:
        if not 1 <= w <= len(stars):
            raise ValueError(f"wildcard index {w} is not in 1..{len(stars)} for filter {filter!r}")
        key += tokens[stars[w - 1]].encode()
    return bytes(key)


def partition_of(
    subject: str, partitions: int, wildcards: Sequence[int] = (), filter: str | None = None
) -> int:
    """The partition nats-server's ``{{partition(partitions, *wildcards)}}`` gives ``subject``.

    ``wildcards`` are 1-based indexes of the ``*`` tokens of ``filter`` (which the subject must
    match); with none, the whole subject is hashed.
    """
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return fnv1a_32(partition_key(subject, wildcards, filter)) % partitions


def transform_destination(filter: str, wildcards: Sequence[int], partitions: int) -> str:
    """The subject-transform destination that puts the partition number first.

    ``foo.*.*.>``, ``[1, 2]``, 4 -> ``{{Partition(4,1,2)}}.foo.{{Wildcard(1)}}.{{Wildcard(2)}}.>``;
    no wildcards -> ``{{Partition(4)}}.<filter>`` (whole subject, server 2.12+).

    Spelled exactly like orbit (capitalised function names; the server accepts both cases):
    the server compares stream configs as strings, so a different spelling would make orbit's
    idempotent create of the same work-queue stream fail with 10058.
    """
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    tokens = filter.split(".")
    stars = 0
    for i, tok in enumerate(tokens):
        if tok == "*":
            stars += 1
            tokens[i] = f"{{{{Wildcard({stars})}}}}"
    for w in wildcards:
        if not 1 <= w <= stars:
            raise ValueError(f"wildcard index {w} is not in 1..{stars} for filter {filter!r}")
    args = "".join(f",{w}" for w in wildcards)
    return f"{{{{Partition({partitions}{args})}}}}." + ".".join(tokens)


def distribute(members: Iterable[str], max_members: int) -> dict[str, list[int]]:
    """Seed 000's partition-to-member distribution, as ``{member: [partitions]}``.

    Members are de-duplicated and sorted (code point order = Go's byte order on UTF-8);
    members past ``max_members`` in that order are listed with no partitions.
    """
    if max_members < 1:
        raise ValueError("max_members must be >= 1")
    ordered = sorted(set(members))
    result: dict[str, list[int]] = {m: [] for m in ordered}
    active = ordered[:max_members]
    n = len(active)
    if n == 0:
        return result
    per = max_members // n
    blocks = n * per
    for p in range(max_members):
        owner = active[(p // per) % n] if p < blocks else active[(p - blocks) % n]
        result[owner].append(p)
    return result


def sticky_distribute(previous: Mapping[str, Iterable[int]], members: Iterable[str],
                      max_members: int) -> dict[str, list[int]]:
    """``{member: [partitions]}`` balanced within one partition that moves the fewest
    partitions away from ``previous`` (Kafka's sticky assignors do the same for consumers).

    Each member keeps what it holds up to its share (``q`` or ``q + 1`` of ``max_members``
    over the members; the ``q + 1`` shares go to the members holding the most), returning
    its highest partitions beyond that; the partitions of departed members and those returned
    go, lowest first, to the members under their share, in member order. A member beyond
    ``max_members`` (more members than partitions) gets none, preferring those holding some.
    """
    if max_members < 1:
        raise ValueError("max_members must be >= 1")
    ordered = sorted(set(members))
    result: dict[str, list[int]] = {m: [] for m in ordered}
    seen: set[int] = set()
    held: dict[str, list[int]] = {}
    for m in ordered:
        keep = []
        for p in previous.get(m, ()):
            if 0 <= p < max_members and p not in seen:
                seen.add(p)
                keep.append(p)
        held[m] = sorted(keep)
    active = sorted(ordered, key=lambda m: (-len(held[m]), m))[:max_members]
    if not active:
        return result
    q, r = divmod(max_members, len(active))
    share = {m: q + (1 if i < r else 0) for i, m in enumerate(active)}  # active is by holdings, largest first
    free = [p for p in range(max_members) if p not in seen]
    for m in ordered:
        if m not in share:
            free += held[m]
        elif len(held[m]) > share[m]:
            free += held[m][share[m]:]
            held[m] = held[m][:share[m]]
    free.sort()
    for m in ordered:
        if m in share:
            need = share[m] - len(held[m])
            held[m], free = held[m] + free[:need], free[need:]
            result[m] = sorted(held[m])
    return result


def assign_partitions(cfg: GroupConfig) -> dict[str, list[int]]:
    """``{member: [partitions]}`` from the members (distributed) or the explicit mappings.

    Mapped partitions keep the order of the mapping, as orbit uses them.
    """
    if cfg.members:
        return distribute(cfg.members, cfg.max_members)
    return {mm.member: list(mm.partitions) for mm in cfg.member_mappings}


def member_partitions(cfg: GroupConfig, member: str) -> list[int]:
    """The partitions ``member`` owns (empty if it is not in the membership)."""
    return assign_partitions(cfg).get(member, [])


def _filters(cfg: GroupConfig) -> list[str]:
    if isinstance(cfg, ElasticGroupConfig):
        return [pf.filter for pf in cfg.partitioning_filters] or [">"]
    if isinstance(cfg, StaticGroupConfig):
        return list(cfg.filters) or [">"]
    raise TypeError(f"not a group config: {type(cfg).__name__}")


def member_filter_subjects(cfg: GroupConfig, member: str) -> list[str]:
    """The member consumer's filter subjects, exactly as orbit writes them (the server compares
    consumer configs, filter order included, when orbit's create-only call meets ours):

    * members list (orbit v0.2): ``<p>.<filter>`` per filter, then per partition; without
      filters ``<p>.>``;
    * member mappings: ``<p>.>`` in the mappings' own partition order (orbit ignores the
      filters there; where it would repeat them per filter, the server refuses the overlap,
      so each appears once here);
    * a config in orbit v0.1's shape: ``<p>.>`` for every member, as v0.1 writes.
    """
    if cfg.member_mappings:
        parts = [p for mm in cfg.member_mappings if mm.member == member for p in mm.partitions]
        return [f"{p}.>" for p in dict.fromkeys(parts)]
    parts = member_partitions(cfg, member)
    if getattr(cfg, "orbit_v01", False):
        return [f"{p}.>" for p in parts]
    return [f"{p}.{f}" for f in _filters(cfg) for p in parts]


def strip_partition(subject: str) -> tuple[int, str]:
    """``"3.orders.eu"`` -> ``(3, "orders.eu")``; the partition token must be a number."""
    head, _, rest = subject.partition(".")
    if not (head.isascii() and head.isdigit()):
        raise ValueError(f"subject {subject!r} does not start with a partition number")
    return int(head), rest


def plan_moves(
    old_assignment: Mapping[str, Iterable[int]], new_assignment: Mapping[str, Iterable[int]]
) -> list[tuple[int, str | None, str | None]]:
    """``(partition, from_member, to_member)`` for each partition whose owner changes, by partition.

    ``None`` stands for "nobody" (a partition newly owned or left unowned).
    """

    def owners(assignment: Mapping[str, Iterable[int]]) -> dict[int, str]:
        out: dict[int, str] = {}
        for member, parts in assignment.items():
            for p in parts:
                out[p] = member
        return out

    before, after = owners(old_assignment), owners(new_assignment)
    return [
        (p, before.get(p), after.get(p))
        for p in sorted(before.keys() | after.keys())
        if before.get(p) != after.get(p)
    ]


def key_rules(cfg: GroupConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Per partitioning filter: the filter and the 1-based wildcard indexes that make a
    subject's key (none for a static group: the key is the whole subject)."""
    if isinstance(cfg, ElasticGroupConfig):
        return [(pf.filter, tuple(pf.partitioning_wildcards or ())) for pf in cfg.partitioning_filters]
    return []
