"""A follower's Spark warm-up (``SparkPipeline.warm_up``): before it asks for its pin, a batch's
Spark job on made-up rows, so that its first batch does not pay for Spark's first job and the
Python workers that write its files. The rows are decoded as a batch is; a SQL query runs over
them, a transformation function never sees them, nor does a SQL statement that is no query;
nothing is left behind; a failure costs only the head start (the first batch reports real
failures); a batch that came first (a backlog) leaves it only the session to start. In a real
local SparkSession; a follower through spark-submit, warmed up, is ``test_dag_follow.py``, and
what it changes is measured by ``benchmarks/bench_freshness.py --spark``."""

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


def _warm_up_jobs(spark, pipeline: SparkPipeline, group: str) -> list[str]:
    spark.sparkContext.setJobGroup(group, "the warm-up")  # this thread's jobs
    try:
        pipeline.warm_up()
    finally:
        spark.sparkContext.setJobGroup(None, None)  # type: ignore[arg-type]
    return _jobs(spark, group)


@pytest.mark.parametrize("payload_format", ["raw", "json"])
def test_the_warm_up_runs_a_batchs_spark_job_without_the_users_code(payload_format, spark_session, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a scratch directory would show there
    decoder = SparkDecoder(spark_session, payload_format, "id BIGINT" if payload_format == "json" else None)
    pipeline = SparkPipeline(lambda: spark_session, decoder, function="tests.support.transforms:broken")
    statuses = _warm_up_jobs(spark_session, pipeline, f"warm-up-{payload_format}")
    assert statuses and set(statuses) == {"SUCCEEDED"}, statuses  # real jobs ran, and the user's code did not
    assert list(tmp_path.iterdir()) == []  # its files were written into the workers' memory


def test_the_warm_up_runs_a_sql_query_but_no_other_statement(spark_session):
    def jobs(group: str, sql: str) -> list[str]:
        pipeline = SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw"), sql=sql)
        return _warm_up_jobs(spark_session, pipeline, group)

    plain = _warm_up_jobs(spark_session, SparkPipeline(lambda: spark_session, SparkDecoder(spark_session, "raw")),
                          "warm-up-plain")
    query = jobs("warm-up-query", "SELECT *, length(subject) AS n FROM batch")
    statement = jobs("warm-up-statement", "CACHE TABLE warm_up_cache AS SELECT * FROM batch")
    assert set(plain + query + statement) == {"SUCCEEDED"}, (plain, query, statement)
    assert len(query) > len(plain) == len(statement), (plain, query, statement)  # the query's own job
    assert not spark_session.catalog.tableExists("warm_up_cache")  # the statement never ran


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
    assert _warm_up_jobs(spark_session, pipeline, "warm-up-after-a-batch") == []
