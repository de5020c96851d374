"""Airflow sensors: GroupOverflowSensor."""
