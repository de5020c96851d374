"""The Airflow 3 plugin that shows the consumer-groups page (``app.py``) in Airflow's UI.

Registered through the ``airflow.plugins`` entry point, so installing the provider is
enough: the API server mounts the page at ``/cg`` and the UI lists it under Browse.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_cg.ui.app import create_app

URL_PREFIX = "/cg"


class ConsumerGroupsPlugin(AirflowPlugin):
    name = "nats_consumer_groups"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "NATS consumer groups"}]
    external_views = [{"name": "Consumer groups", "href": f"{URL_PREFIX}/", "destination": "nav",
                       "category": "browse", "url_route": "nats-consumer-groups"}]
