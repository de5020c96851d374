"""The group operators' arguments as a DAG gives them: a value that is a Jinja template is
checked after rendering (still before the server is contacted); a template rendered as text
that holds a list, dict or number is read as that value; partitioning filters as subjects or
``{"filter", "partitioning_wildcards"}``."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.config import PartitioningFilter


def templated(value: Any) -> bool:
    """Whether ``value`` (or a string inside it) is a Jinja template rendered at run time."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(templated(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(templated(v) for v in value)
    return False


def partitioning_filters(value: Any) -> tuple[PartitioningFilter, ...]:
    """``"foo.*"`` (hash the whole subject) or ``{"filter", "partitioning_wildcards"}`` items."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ConfigError("partitioning_filters", 'must be a list of subjects or {"filter", "partitioning_wildcards"}')
    out = []
    for i, item in enumerate(value):
        where = f"partitioning_filters[{i}]"
        if isinstance(item, PartitioningFilter):
            out.append(item)
        elif isinstance(item, str):
            out.append(PartitioningFilter(item))
        elif isinstance(item, Mapping) and isinstance(item.get("filter"), str):
            unknown = set(item) - {"filter", "partitioning_wildcards"}
            if unknown:
                raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key")
            wcs = literal(f"{where}.partitioning_wildcards", item.get("partitioning_wildcards")) or ()
            if not isinstance(wcs, list | tuple):
                raise ConfigError(f"{where}.partitioning_wildcards", "must be a list of wildcard indexes")
            out.append(PartitioningFilter(item["filter"], tuple(wcs)))
        else:
            raise ConfigError(where, 'must be a subject or {"filter": ..., "partitioning_wildcards": [...]}')
    return tuple(out)


# a NATS subject-transform function inside a string ({{partition(3,1)}}, {{ wildcard(2) }}, ...)
TRANSFORM_FUNCTION = re.compile(
    r"\{\{\s*(partition|wildcard|split|splitfromleft|splitfromright|slicefromleft|slicefromright|left|right)\s*\(",
    re.IGNORECASE,
)
MAX_LITERAL_CHARS = 1_000_000


def literal(field: str, value: Any) -> Any:
    """A template rendered as text (no ``render_template_as_native_obj``) that holds a list,
    dict or number, as that value; anything else unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text or text[0] not in "[{(-0123456789":
        return value
    if len(text) > MAX_LITERAL_CHARS:
        raise ConfigError(field, f"longer than {MAX_LITERAL_CHARS} characters")
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        if text[0] in "[{(":
            raise ConfigError(field, "is not a valid list or dict literal") from None
        return value
