"""A group config as orbit ``pcgroups`` stores it: JSON written the way Go's ``encoding/json``
writes it (compact, struct field order, ``omitempty``, ``<``/``>``/``&`` escaped), so a config
written here is byte-identical to orbit's (``dump_config``), and read in orbit's current field
names, its v0.1 shape and seed 000's names (``load_config``; see ``config.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.config import (
    ElasticGroupConfig,
    GroupConfig,
    MemberMapping,
    PartitioningFilter,
    StaticGroupConfig,
)
from airflow_provider_cg.core.groups.names import ELASTIC, KINDS, STATIC


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


def dump_config(cfg: GroupConfig) -> bytes:
    """Compact JSON in orbit's current field names, byte-identical to Go's ``json.Marshal``."""
    return _go_json(cfg.to_dict())
