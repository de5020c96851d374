"""spark-submit applications: ``spark_apps/`` in the repository, ``airflow_provider_cg.spark_apps`` in the wheel."""
