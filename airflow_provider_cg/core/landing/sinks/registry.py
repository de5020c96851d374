"""The registered sinks: every layer asks here (``sink_kind(name)``) instead of comparing sink
names. Each sink declares itself in its family's ``declaration.py`` (``shared.declaration.SinkKind``);
registering one is its line in ``BUILT_IN``. Nothing here imports a table library.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.delta import declaration as delta
from airflow_provider_cg.core.landing.sinks.iceberg import declaration as iceberg
from airflow_provider_cg.core.landing.sinks.lake import declaration as parquet
from airflow_provider_cg.core.landing.sinks.postgres import declaration as postgres
from airflow_provider_cg.core.landing.sinks.shared.declaration import SinkKind

#: the sinks, in the order choices and messages list them
BUILT_IN: tuple[SinkKind[Any], ...] = (parquet.KIND, delta.KIND, iceberg.KIND, postgres.KIND)
_KINDS: dict[str, SinkKind[Any]] = {k.name: k for k in BUILT_IN}


def sink_kind(name: str) -> SinkKind[Any]:
    """The registered sink ``name`` (``ConfigError`` on the ``sink`` field for another)."""
    if name not in _KINDS:
        raise ConfigError("sink", f"must be one of {', '.join(_KINDS)} (got {name!r})")
    return _KINDS[name]


def sink_kinds() -> tuple[SinkKind[Any], ...]:
    """Every registered sink, in registration order."""
    return tuple(_KINDS.values())


def sink_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def option_owners(field: str) -> tuple[str, ...]:
    """The sinks that take the option ``field`` (empty: every sink, or not a table option)."""
    owners = tuple(k.name for k in sink_kinds() if field in k.option_fields())
    return () if len(owners) == len(_KINDS) else owners


def maintained_names() -> tuple[str, ...]:
    return tuple(k.name for k in sink_kinds() if k.maintained)


