"""The dict behind ``get_provider_info`` (kept apart so importing the package stays cheap)."""

from __future__ import annotations


def provider_info(version: str) -> dict:
    return {
        "package-name": "airflow-provider-cg",
        "name": "NATS JetStream consumer groups",
        "description": "Partitioned consumer groups on NATS JetStream, consumed in bounded, "
        "exactly-once batches by Apache Spark.",
        "versions": [version],
    }
