"""Spark as an independent reader of a Delta table the member job wrote (with delta-rs):
``spark-submit --packages io.delta:delta-spark_2.13`` from Maven Central (cached by Ivy under
``~/.ivy2.5.2`` after the first run).

Iceberg has no Spark reader here: Iceberg 1.12's newest runtime is built for Spark 4.1 and
fails to load on the project's Spark 4.2 (``IncompatibleClassChangeError`` on
``CatalogManager``), so the Iceberg tests read through pyiceberg instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

DELTA_SPARK_PACKAGE = "io.delta:delta-spark_2.13:4.4.0"  # the newest on Maven Central; runs on Spark 4.2

_READER = r'''
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
path = sys.argv[1]
history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
versions = sorted(r.version for r in history)
per_version = {v: spark.read.format("delta").option("versionAsOf", v).load(path).count() for v in versions}
df = spark.read.format("delta").load(path)
ids = df.select("origin_stream", "origin_seq")
out = {"rows": ids.count(), "distinct": ids.distinct().count(), "per_version": per_version,
       "columns": df.columns}
print("CG_SPARK_READ " + json.dumps(out))
'''


def spark_read_delta(path: str, workdir) -> dict:
    """What Spark's own Delta reader sees in the table at ``path``: row count, distinct ids,
    the row count as of every version in the table's history, the columns."""
    script = os.path.join(str(workdir), "cg_spark_read_delta.py")
    with open(script, "w") as f:
        f.write(_READER)
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "SPARK_LOCAL_IP": "127.0.0.1"}
    cmd = [os.path.join(bindir, "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--driver-java-options", "-XX:TieredStopAtLevel=1", "--packages", DELTA_SPARK_PACKAGE,
           "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
           "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
           # a tiny table: Spark's default 200 shuffle partitions, and Delta's 50 for rebuilding each
           # version's snapshot, made each version's read 9-12 s on 2 cores (1-4 s with these)
           "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.databricks.delta.snapshotPartitions=1",
           script, str(path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CG_SPARK_READ ")]
    assert proc.returncode == 0 and lines, f"Spark's Delta reader failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1][len("CG_SPARK_READ "):])
    out["per_version"] = {int(k): v for k, v in out["per_version"].items()}
    return out
