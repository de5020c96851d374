"""Apache Airflow provider for partitioned consumer groups on NATS JetStream."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata for Airflow's ``apache_airflow_provider`` entry point."""
    from airflow_provider_cg._provider_info import provider_info

    return provider_info(__version__)
