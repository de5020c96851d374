"""Durations as people write them (``90s``, ``15m``, ``1h30m``, ``2d``, or seconds): one parser for
``cg reset --by-duration`` and the member job's ``--follow``."""

from __future__ import annotations

import re
from typing import Any

from airflow_provider_cg.core.errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


#: what a duration looks like, for error messages
DURATION_FORMS = "a duration such as 90s, 15m, 1h30m or 2d"


def parse_duration(value: Any, field: str = "by_duration", *, also: str = "") -> float:
    """Seconds from ``90s``, ``15m``, ``1h30m``, ``2d`` (or a number of seconds), > 0;
    ``ConfigError(field, ...)`` otherwise. ``also``: the other forms the caller accepts, named
    in the error (the operator's ``follow`` takes ``"until-next-run"`` too)."""
    forms = f"must be {DURATION_FORMS}{also} (got {value!r})"
    if isinstance(value, bool):
        raise ConfigError(field, forms)
    text = str(value).strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ConfigError(field, forms) from None
        seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(field, f"must be a finite duration > 0 (got {value!r})")
    return seconds
