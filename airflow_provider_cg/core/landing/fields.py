"""The fields of the member job's contract and of the sink options: how each is declared
(``option``: its kind, help, choices), spelled on a command line (``flag``), converted from
text (``convert``) and checked alone (``check_fields``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import field
from typing import Any, cast

from airflow_provider_cg.core.errors import ConfigError


def option(default: Any = None, kind: type = str, help: str = "", choices: tuple[str, ...] | None = None,
         positive: bool = False) -> Any:
    """A field of the contract: ``kind`` is how argv text (and rendered templates) convert;
    ``choices``: the values it takes (a ``StrEnum`` kind's members unless given); ``positive``:
    a finite number > 0. (Which sinks take a sink option is theirs to say:
    ``registry.option_owners``.)"""
    if choices is None and _is_enum(kind):
        choices = tuple(cast("type[enum.StrEnum]", kind))
    return field(default=default, metadata={"kind": kind, "help": help, "choices": choices, "positive": positive})


def _is_enum(kind: type) -> bool:
    return isinstance(kind, type) and issubclass(kind, enum.StrEnum)


class Seconds(float):
    """The kind of a duration field: seconds, or a duration as people write it (``90s``,
    ``10m``, ``1h30m``: ``core/durations.py``)."""


def flag(name: str) -> str:
    """The command-line spelling of a field."""
    return "--" + name.replace("_", "-")


def converted(values: Mapping[str, Any], of: Any, what: str) -> dict[str, Any]:
    """``values`` converted to the kinds of the fields of the dataclass ``of`` (``None``: left
    out, the default); ``ConfigError`` naming a value that is not one of them (``what``)."""
    fields = {f.name: f for f in dataclasses.fields(of)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        f = fields.get(name)
        if f is None:
            raise ConfigError(name, f"is not {what}")
        if value is None:
            continue
        out[name] = convert(name, value, f.metadata["kind"])
    return out


def convert(name: str, value: Any, kind: type) -> Any:
    """Text (argv, rendered templates) to the field's kind; numbers stay numbers. A ``dict``
    field (``routes``) is kept as compact JSON text, given as text or as a mapping."""
    if kind is dict:
        if isinstance(value, Mapping):
            return json.dumps(value, separators=(",", ":"))
        if not isinstance(value, str):
            raise ConfigError(name, f"must be a JSON object or a mapping (got {type(value).__name__})")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(name, f"not JSON ({e.msg} at character {e.pos})") from None
        if not isinstance(parsed, dict):
            raise ConfigError(name, "must be a JSON object")
        return json.dumps(parsed, separators=(",", ":"))
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(name, f"must be true or false (got {value!r})")
    if kind is Seconds:
        from airflow_provider_cg.core.durations import parse_duration

        return parse_duration(value, name)
    if kind is str or _is_enum(kind):  # (an enum's members are checked with the other choices)
        if not isinstance(value, str):
            raise ConfigError(name, f"must be text (got {type(value).__name__})")
        return value
    rule = "a positive integer" if kind is int else "a positive number"
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            raise ConfigError(name, f"must be {rule} (got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, f"must be {rule} (got {value!r})")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(name, f"must be {rule} (got {value!r})")
        return int(value)
    return float(value)


def check_fields(spec: Any) -> None:
    """Each field alone: names, choices, positive finite numbers."""
    from airflow_provider_cg.core.groups.names import validate_name

    for name in ("stream", "group"):
        if hasattr(spec, name) and getattr(spec, name) is None:
            raise ConfigError(name, "required")
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if value is None:
            continue
        meta = f.metadata
        if f.name in ("stream", "group", "member"):
            validate_name(f.name, value, f.name)
        if meta["choices"] and value not in meta["choices"]:
            raise ConfigError(f.name, f"must be one of {', '.join(meta['choices'])} (got {value!r})")
        if _is_enum(meta["kind"]) and not isinstance(value, meta["kind"]):  # the member, however it was given
            object.__setattr__(spec, f.name, meta["kind"](value))
        if meta["positive"]:
            convert(f.name, value, meta["kind"])  # a number of the right kind
            if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
                raise ConfigError(f.name, f"must be a finite number > 0 (got {value!r})")
