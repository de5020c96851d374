"""The rules a group config obeys beyond its own fields: against the origin stream's subjects
(``validate_against_stream``) and from one version of a group to the next (``check_change``:
what orbit never changes in place).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, GroupConfig, StaticGroupConfig
from airflow_provider_cg.core.groups.names import (
    ELASTIC,
    MULTI_TOKEN_FN_RE,
    PARTITION_FN_RE,
    PLACEHOLDER_RE,
    subjects_intersect,
    validate_subject,
)


def _pattern(field: str, subject: str) -> str:
    """A stream subject or transform destination as a plain pattern.

    ``$N`` and ``{{fn(...)}}`` tokens become ``*``; a split/slice function may yield several
    tokens, so the pattern is cut there and ends in ``>`` (a superset: never a false alarm).
    """
    if not isinstance(subject, str) or not subject:
        raise ConfigError(field, "subject must be a non-empty string")
    tokens: list[str] = []
    for tok in subject.split("."):
        if MULTI_TOKEN_FN_RE.match(tok):
            tokens.append(">")
            break
        tokens.append("*" if PLACEHOLDER_RE.match(tok) else tok)
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
        m = PARTITION_FN_RE.match(first_raw)
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
