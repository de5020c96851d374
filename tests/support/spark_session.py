"""One local SparkSession in the test process, for tests of the Spark pipeline that need no
spark-submit of their own (one JVM start for the whole session instead of one per case)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from tests.support.spark_cds import spark_driver_java_options

    spark = (SparkSession.builder.master("local[2]").appName("cg-tests")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", spark_driver_java_options())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()
