"""spark-submit entry point: land one member's backlog of a consumer group into a sink.

    spark-submit --py-files cg_core.zip spark_apps/cg_member_job.py \
        --stream ORDERS --group g1 --member m1 --sink parquet --sink-path /lake/orders

The options, their defaults and rules, the summary and the exit codes are the member job's
contract (``airflow_provider_cg/core/landing/contract.py``; ``--help`` lists them). Backfill
mode (``--backfill-start ISO --backfill-end ISO``, no ``--member``) re-reads the origin
stream's messages of ``[start, end)`` into the sink (``core/landing/run/backfill.py``).

NATS settings and credentials come from ``CG_NATS_*`` environment variables or the JSON
file named by ``CG_NATS_CONFIG_FILE``; the PostgreSQL DSN from ``CG_PG_DSN`` or the file
named by ``CG_PG_DSN_FILE``. Nothing secret is ever an argument. The last line on stdout is
``CG_SUMMARY {json}``; exit 0 (committed / empty / not-pinned / revoked), 1 (invalid input, a
failing transformation: retrying cannot help), 2 (server, database: retrying may).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import SparkSession

    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.landing.contract import MemberJobSpec, Summary
    from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, SparkPipeline
    from airflow_provider_cg.core.landing.sinks.shared.two_phase_sink import TwoPhaseSink

# numpy (under pyarrow) starts one busy OpenBLAS thread per core at import; the job does no
# linear algebra, and on a small machine running many members those threads cost each run
# ~0.15 s of CPU. A value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _build_sink(spec: MemberJobSpec) -> TwoPhaseSink:
    from airflow_provider_cg.core.landing.sinks.opening import open_sink

    sink = open_sink(spec.sink_options, transformed=spec.transforming)
    # a table's commits for all its writers at most once per interval (``sinks/lake/tables.py``)
    sink.set_table_commit_interval(spec.table_commit_interval or spec.commit_interval)
    check = getattr(sink, "check", None)
    if check is not None:
        check()  # an unreachable database fails here, before the pin is taken
    return sink


class JobSession:
    """The job's SparkSession, started when first asked for: a raw batch with no transformation
    never needs one, and a run that finds nothing to land (a standby, an empty backlog) skips
    the context's start-up (about 2.5 s of the 4 s a spark-submit takes here)."""

    def __init__(self, spec: MemberJobSpec) -> None:
        self.spec = spec
        self.session: SparkSession | None = None

    def __call__(self) -> SparkSession:
        if self.session is None:
            import time

            from pyspark.sql import SparkSession

            started = time.monotonic()
            who = self.spec.member or "backfill"
            session = SparkSession.builder.appName(f"cg-{self.spec.stream}-{self.spec.group}-{who}").getOrCreate()
            session.sparkContext.setLogLevel("WARN")
            self.session = session
            logging.getLogger("cg").info("cg Spark session started in %.1f s", time.monotonic() - started)
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()


class StartingUp:
    """The progress line from the job's first second, until its run's own takes over: the job
    starts (``waiting=start``: its servers, its table) or waits on Spark's session
    (``waiting=spark``). A thread, as the session's start blocks the caller."""

    def __init__(self, spec: MemberJobSpec) -> None:
        import threading

        from airflow_provider_cg.core.landing.contract import Summary
        from airflow_provider_cg.core.landing.reads.reading import Progress

        self.progress = Progress(Summary(spec.stream, spec.group, spec.member or "backfill"), spec.progress_interval)
        self.progress.waiting = "start"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._talk, daemon=True, name="cg-starting-up")

    def __enter__(self) -> StartingUp:
        self.progress.tick(force=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def waiting(self, what: str) -> None:
        self.progress.waiting = what

    def _talk(self) -> None:
        while not self._done.wait(max(0.2, self.progress.interval / 4)):
            self.progress.tick()



def _build_pipeline(spec: MemberJobSpec, session: JobSession | None,
                    starting: StartingUp | None = None) -> ArrowPipeline | SparkPipeline:
    """Spark decodes and transforms; a raw batch with no transformation has nothing for Spark
    to compute and lands as read (the data path's speed). Schemas are checked by Spark before
    anything is read, and executor reads start their workers while the job waits for its pin:
    those start the session now; the others on their first batch."""
    from airflow_provider_cg.core.landing.modes import PayloadFormat, ReadMode
    from airflow_provider_cg.core.landing.pipeline.decode import SparkDecoder, text_decoder
    from airflow_provider_cg.core.landing.pipeline.processing import ArrowPipeline, SparkPipeline

    if session is None:
        return ArrowPipeline(text_decoder() if spec.payload_format is PayloadFormat.TEXT else None,
                             bad_records=spec.bad_records)
    executors = spec.read is ReadMode.EXECUTORS
    if spec.payload_format is PayloadFormat.RAW and not spec.transforming and not executors:
        return ArrowPipeline(bad_records=spec.bad_records)
    now = spec.payload_format.needs_spark or executors
    if now and starting is not None:
        starting.waiting("spark")
    decoder = SparkDecoder(session() if now else None, spec.payload_format, spec.json_schema or spec.avro_schema)
    if starting is not None:
        starting.waiting("start")
    return SparkPipeline(session, decoder, function=spec.transform, sql=spec.transform_sql,
                         bad_records=spec.bad_records)


async def _run(spec: MemberJobSpec, make_sink: Callable[[], TwoPhaseSink], pipeline: ArrowPipeline | SparkPipeline,
               starting: StartingUp | None = None) -> Summary:
    """Connect to NATS first (a refused or unreachable server leaves nothing behind), check the
    group and the member, then open the sink and run; ``starting``'s line stops where the run's
    own begins."""
    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.groups.admin import ConsumerGroups
    from airflow_provider_cg.core.groups.config import in_membership
    from airflow_provider_cg.core.jetstream.connection import NatsConnectionSettings
    from airflow_provider_cg.core.landing.modes import ReadMode
    from airflow_provider_cg.core.landing.pipeline.processing import SparkPipeline

    try:
        settings = NatsConnectionSettings.from_env()
    except (TypeError, ValueError) as e:
        field, sep, rule = str(e).partition(": ")
        name = field if field.startswith("CG_") else f"CG_NATS_{field.upper()}"
        raise ConfigError(name if sep else "CG_NATS_*", rule if sep else str(e)) from None
    who = "backfill" if spec.backfill else spec.member
    settings.name = settings.name or f"cg-job-{spec.stream}-{spec.group}-{who}"
    nc = await settings.connect()
    try:
        if spec.read is ReadMode.EXECUTORS and not spec.backfill and isinstance(pipeline, SparkPipeline):
            pipeline.read_in_tasks(settings)  # (executor reads always have Spark's pipeline)
        info = await ConsumerGroups(nc).get(spec.stream, spec.group)
        if not spec.backfill and not spec.join and not in_membership(info.config, spec.member or ""):
            raise ConfigError("member", f"{spec.member!r} is not a member of group {spec.group!r} "
                                        f"on stream {spec.stream!r}")
        sink = await asyncio.to_thread(make_sink)
        try:
            if spec.backfill:
                from airflow_provider_cg.core.landing.run.backfill import run_backfill

                start, end = spec.window()
                if starting is not None:
                    starting.__exit__()
                return await run_backfill(nc, sink, spec.stream, spec.group, start, end, batch_size=spec.batch_size,
                                          batch_bytes=spec.batch_bytes, pipeline=pipeline,
                                          stream_life=spec.stream_life)
            from airflow_provider_cg.core.landing.run.member import run_member_batch

            if starting is not None:
                starting.__exit__()  # the run talks from here on
            return await run_member_batch(nc, sink, spec, pipeline)
        finally:
            await asyncio.to_thread(sink.close)  # e.g. a database session ends cleanly, not by a dropped socket
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(OneLineLibraryErrors())
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # TLS transport chatter on failed handshakes
    from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound
    from airflow_provider_cg.core.landing import contract
    from airflow_provider_cg.core.landing.transform import TransformError

    spec = None

    def fail(code: int, message: str) -> int:
        print(f"cg_member_job: error: {message}", file=sys.stderr)
        if spec is not None and spec.summary_file:  # the operator reads why (exit 1: no retry)
            try:
                _write_atomically(spec.summary_file, contract.Summary.failed(spec, code, message).to_json())
            except OSError as e:
                print(f"cg_member_job: cannot write the summary file ({e.strerror})", file=sys.stderr)
        return code

    try:
        spec = contract.MemberJobSpec.from_argv(sys.argv[1:] if argv is None else argv)
        spec.check_local_paths()
    except ConfigError as e:
        return fail(contract.EXIT_INVALID, _shown(e))
    session = None if spec.no_spark else JobSession(spec)
    try:
        try:
            with StartingUp(spec) as starting:
                pipeline = _build_pipeline(spec, session, starting)
                summary = asyncio.run(_run(spec, lambda: _build_sink(spec), pipeline, starting))
        except GroupNotFound as e:
            return fail(contract.EXIT_INVALID, f"group: {e}")
        except TransformError as e:  # the user's transformation failed: the batch was not acked
            return fail(contract.EXIT_INVALID, str(e))
        except ConfigError as e:
            return fail(contract.EXIT_INVALID, _shown(e))
        except (ConsumerGroupError, ConnectionError, OSError) as e:  # server, connection, sink storage
            return fail(contract.EXIT_SERVER, str(e))
        except KeyboardInterrupt:
            return 130
        except Exception as e:  # a bug or an unforeseen failure: one line, never the settings
            logging.getLogger("cg").debug("unexpected error", exc_info=True)
            first = (str(e).splitlines() or [""])[0]
            return fail(contract.EXIT_SERVER, f"unexpected {type(e).__name__}: {first[:300]}")
    finally:
        if session is not None:
            session.stop()
    line = summary.to_json()
    if spec.summary_file:
        _write_atomically(spec.summary_file, line)
    print(contract.SUMMARY_PREFIX + line, flush=True)
    return contract.EXIT_OK


class OneLineLibraryErrors(logging.Filter):
    """A library's log record with a traceback as one line: the job's output never shows a
    traceback for what it handles (pyiceberg logs its failed clean-up of a lost commit's files
    with one, e.g. while the object store restarts; the job then retries the batch)."""

    OWN = ("airflow_provider_cg", "cg")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.name.startswith(self.OWN):
            exc = record.exc_info[1]
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {first})", None
            record.exc_info = record.exc_text = None
        return True


def _shown(e: ConfigError) -> str:
    """A ``ConfigError`` as a command-line user reads it: an option by its flag."""
    from airflow_provider_cg.core.landing.contract import MemberJobSpec
    from airflow_provider_cg.core.landing.fields import flag

    if e.field == "usage":
        return e.rule
    if e.field in MemberJobSpec.__dataclass_fields__:
        return f"{flag(e.field)}: {e.rule}"
    return str(e)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _end(code: int) -> NoReturn:
    """End the job's process once ``main`` has returned: by then the run's work is committed,
    its connections closed and its summary printed, so the interpreter's teardown of every
    module the job imported buys nothing and costs about 0.13 s of CPU here (an eighth of a
    short run's). Logs and standard streams are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _end(main())
