"""Airflow operators: consumer-group administration and the Spark member fan-out."""
