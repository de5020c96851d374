"""The built-in sinks' declarations (``registry.SinkKind``), one module each; registering a
sink is one line here."""

from airflow_provider_cg.core.landing.sinks.kinds import delta, iceberg, parquet, postgres
from airflow_provider_cg.core.landing.sinks.registry import register

for _module in (parquet, delta, iceberg, postgres):
    register(_module.KIND)
