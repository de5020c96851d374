"""A follower's Spark warm-up (``SparkPipeline.warm_up``): before it asks for its pin, one Spark
job on a made-up row, so that its first batch does not pay for Spark's first job. The row is
decoded as a batch is and never reaches the user's transformation; nothing is left behind; a
failure costs only the head start (the first batch reports real failures); a batch that came
first (a backlog) leaves it only the session to start. In a real local
SparkSession; a follower through spark-submit, warmed up, is ``test_dag_follow.py``."""

from __future__ import annotations

import tempfile

import pytest

from airflow_provider_cg.core.landing.pipeline.decode import SparkDecoder
from airflow_provider_cg.core.landing.pipeline.processing import SparkPipeline
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from tests.support.sink_rows import rows

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _jobs(spark, group: str) -> list[str]:
    tracker = spark.sparkContext.statusTracker()
    return [tracker.getJobInfo(j).status for j in tracker.getJobIdsForGroup(group)]


@pytest.mark.parametrize("payload_format", ["raw", "json"])
def test_the_warm_up_runs_one_spark_job_without_the_users_code(payload_format, spark_session, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its scratch directory, where it can be seen
    decoder = SparkDecoder(spark_session, payload_format, "id BIGINT" if payload_format == "json" else None)
    pipeline = SparkPipeline(lambda: spark_session, decoder, function="tests.support.transforms:broken")
    group = f"warm-up-{payload_format}"
    spark_session.sparkContext.setJobGroup(group, "the warm-up")  # this thread's jobs
    try:
        pipeline.warm_up()
    finally:
        spark_session.sparkContext.setJobGroup(None, None)  # type: ignore[arg-type]
    statuses = _jobs(spark_session, group)
    assert statuses and set(statuses) == {"SUCCEEDED"}, statuses  # a real job ran, and the user's code did not
    assert list(tmp_path.iterdir()) == []  # its Parquet went into a temporary directory, removed


def test_a_failing_warm_up_costs_only_the_head_start(spark_session, tmp_path, monkeypatch):
    def refused(*_a, **_k):
        raise RuntimeError("no Spark job today")

    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"), sql="SELECT * FROM batch")
    monkeypatch.setattr(pipeline.decoder, "apply", refused)
    pipeline.warm_up()  # no exception: the first batch reports what is really wrong
    assert pipeline._one_at_a_time.acquire(blocking=False)  # and the pipeline is free for it
    pipeline._one_at_a_time.release()


def test_a_batch_that_came_first_leaves_the_warm_up_no_job_to_run(spark_session, tmp_path):
    sink = open_sink(SinkOptions(sink="parquet", sink_path=str(tmp_path / "lake")), transformed=True)
    pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"), sql="SELECT * FROM batch")
    processed = pipeline.process(sink, rows(range(1, 11)), BatchId("ORDERS", "g", "m1", 1))
    assert sum(n for _, n in processed.rows.files) == 10  # the batch's own Spark job ran
    spark_session.sparkContext.setJobGroup("warm-up-after-a-batch", "the warm-up")
    try:
        pipeline.warm_up()
    finally:
        spark_session.sparkContext.setJobGroup(None, None)  # type: ignore[arg-type]
    assert _jobs(spark_session, "warm-up-after-a-batch") == []
