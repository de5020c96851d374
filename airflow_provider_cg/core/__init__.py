"""Consumer-group core on NATS JetStream. Imports nothing from Airflow.

A Spark driver on a cluster without Airflow runs this package (shipped with --py-files).
"""
