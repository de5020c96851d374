"""Airflow hooks: NatsHook (connection type ``nats``)."""
