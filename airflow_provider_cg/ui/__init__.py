"""The consumer-groups page in Airflow's UI (an Airflow 3 plugin: ``plugin.py``)."""
