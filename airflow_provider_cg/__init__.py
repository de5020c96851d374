"""Apache Airflow provider for partitioned consumer groups on NATS JetStream."""

from __future__ import annotations

__version__ = "0.1.0"

#: the modules a DAG, a transformation or a tool may import from: each states its public names
#: in ``__all__`` (the reference is generated from them); every other module is internal
PUBLIC_MODULES = (
    "airflow_provider_cg.operators.groups",
    "airflow_provider_cg.operators.members",
    "airflow_provider_cg.operators.spark",
    "airflow_provider_cg.operators.maintenance",
    "airflow_provider_cg.operators.streaming",
    "airflow_provider_cg.sensors.overflow",
    "airflow_provider_cg.triggers.overflow",
    "airflow_provider_cg.hooks.nats",
    "airflow_provider_cg.queues.nats",
    "airflow_provider_cg.assets",
    "airflow_provider_cg.examples",
    "airflow_provider_cg.metrics",
    "airflow_provider_cg.core.errors",
    "airflow_provider_cg.core.landing.transform",
    "airflow_provider_cg.core.landing.modes",
    "airflow_provider_cg.core.streaming",
)


def get_provider_info() -> dict:
    """Provider metadata for Airflow's ``apache_airflow_provider`` entry point."""
    from airflow_provider_cg._provider_info import provider_info

    return provider_info(__version__)
