"""Opening the sink ``SinkOptions`` name: the one way the member job, ``cg lag`` and
``cg maintain`` get one (each sink's own opening is its ``SinkKind.open``, ``registry.py``).

Credentials come from the environment only (``CG_PG_DSN`` / ``CG_PG_DSN_FILE``,
``CG_ICEBERG_CATALOG_URI``, ``CG_ICEBERG_CATALOG_TOKEN`` / ``_CREDENTIAL``, ``AWS_*``), never
from arguments.
"""

from __future__ import annotations

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.options import Routes, SinkOptions
from airflow_provider_cg.core.landing.sinks.registry import sink_kind
from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink


def open_sink(options: SinkOptions, *, transformed: bool = False) -> TwoPhaseSink:
    """The sink ``options`` name (a registered ``SinkKind``), or a routed landing's tables;
    ``ConfigError`` naming the field when it cannot be opened as asked."""
    if options.routes is not None:  # several tables, each its own sink (``routing.py``)
        from airflow_provider_cg.core.landing.sinks.routing import RoutedSink  # imports pyarrow

        routes = Routes.parse(options)
        opened: dict[str, TwoPhaseSink] = {}
        try:
            for route in routes.routes:
                try:
                    opened[route.name] = open_sink(route.options, transformed=transformed)
                except ConfigError as e:
                    raise ConfigError(f"routes.{route.name}.{e.field}", e.rule) from None
        except BaseException:
            for table in opened.values():
                table.close()
            raise
        return RoutedSink(routes, opened)
    kind = sink_kind(options.sink)
    kind.needs_modules()
    typed = kind.typed(options)
    return kind.open(typed, transformed=transformed)
