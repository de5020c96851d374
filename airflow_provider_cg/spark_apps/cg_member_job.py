"""spark-submit entry point: land one member's backlog of a consumer group into a sink.

    spark-submit --py-files cg_core.zip airflow_provider_cg/spark_apps/cg_member_job.py \
        --stream ORDERS --group g1 --member m1 --sink parquet --sink-path /lake/orders

Backfill mode (``--backfill-start ISO --backfill-end ISO``, no ``--member``): re-read the
origin stream's messages of ``[start, end)`` into the sink (``core/backfill.py``); pinning
and ``--member`` do not apply, the result is "committed" or "empty".

The summary is also written to ``--summary-file`` when given.

NATS settings and credentials come from ``CG_NATS_*`` environment variables or the JSON
file named by ``CG_NATS_CONFIG_FILE``; the PostgreSQL DSN from ``CG_PG_DSN`` or the file
named by ``CG_PG_DSN_FILE``. Nothing secret is ever an argument. The last line on stdout is
``CG_SUMMARY {json}``; the exit status is 0 for committed / empty / not-pinned.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys

SUMMARY_PREFIX = "CG_SUMMARY "
EXIT_OK, EXIT_INVALID, EXIT_SERVER = 0, 1, 2


class UsageError(Exception):
    """A bad command line: exit 1 (invalid input) with one line, not argparse's exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise UsageError(message)


def _positive(kind):
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0 (got {text!r})")
        return value

    convert.__name__ = kind.__name__
    return convert


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="cg_member_job", description=__doc__.split("\n")[0])
    p.add_argument("--stream", required=True, help="origin stream of the group")
    p.add_argument("--group", required=True)
    p.add_argument("--member", help="the member to consume as (required unless backfilling)")
    p.add_argument("--sink", choices=["parquet", "postgres"], default="parquet")
    p.add_argument("--sink-path", help="dataset directory of the Parquet lake sink")
    p.add_argument("--pg-table", default="cg_events", help="target table of the PostgreSQL sink")
    from airflow_provider_cg.core.decode import FORMATS

    p.add_argument("--payload-format", choices=FORMATS, default="raw",
                   help="how Spark decodes payloads (avro needs Spark's Avro package: --packages)")
    p.add_argument("--json-schema", help="Spark DDL schema of JSON payloads, e.g. 'id BIGINT, amount DOUBLE'")
    p.add_argument("--avro-schema", help="Avro record schema (JSON) of Avro payloads (binary-encoded datums)")
    p.add_argument("--batch-size", type=_positive(int), default=100_000, help="messages per two-phase batch")
    p.add_argument("--max-messages", type=_positive(int))
    p.add_argument("--max-bytes", type=_positive(int))
    p.add_argument("--max-seconds", type=_positive(float))
    p.add_argument("--standby-timeout", type=_positive(float), default=30.0, help="seconds to wait for the pin")
    p.add_argument("--ack-wait", type=_positive(float), help="ack wait (s) of a member consumer the job creates "
                   "(default: orbit's 5 s for elastic groups, 60 s for static ones); an existing one is used as it is")
    p.add_argument("--max-deliver", type=_positive(int), default=5)
    p.add_argument("--idle-timeout", type=_positive(float), default=2.0, help="a pull this long with nothing ends the run")
    p.add_argument("--progress-interval", type=_positive(float), default=5.0)
    p.add_argument("--read", choices=["auto", "consumer"], default="auto",
                   help="auto: an elastic group's partitions by direct gets (one purge per partition acks a "
                        "batch); consumer: pulls and a double ack per message (static groups always)")
    p.add_argument("--transform", metavar="PACKAGE.MODULE:FUNCTION",
                   help="your transformation: called with each batch as a Spark DataFrame and a BatchContext, "
                        "returns the DataFrame to land (ship its module with --py-files)")
    p.add_argument("--transform-sql", metavar="SQL",
                   help="or a Spark SQL statement over the temporary view 'batch' (one row per message)")
    p.add_argument("--summary-file", help="also write the summary JSON to this file (atomically), for a caller "
                   "that runs the driver on its own machine (the operator in local and client mode)")
    p.add_argument("--no-spark", action="store_true", help="run without a SparkSession (raw/text payloads only)")
    p.add_argument("--backfill-start", help="backfill mode: window start (ISO 8601, inclusive; naive = UTC)")
    p.add_argument("--backfill-end", help="backfill mode: window end (ISO 8601, exclusive)")
    args = p.parse_args(argv)
    args.backfill = bool(args.backfill_start or args.backfill_end)
    if args.backfill and not (args.backfill_start and args.backfill_end):
        p.error("--backfill-start and --backfill-end go together")
    if not args.backfill and not args.member:
        p.error("--member is required (unless --backfill-start/--backfill-end are given)")
    _check_args(args)
    return args


def _check_args(args) -> None:
    """Everything checkable without a server, before anything is created or any pin taken."""
    from airflow_provider_cg.core.config import validate_name
    from airflow_provider_cg.core.errors import ConfigError

    validate_name("stream", args.stream, "stream")
    validate_name("group", args.group, "group")
    if not args.backfill:
        validate_name("member", args.member, "member")
    if args.max_deliver < 2:
        raise ConfigError("max-deliver", "must be >= 2 so a poison message is retried once")
    if args.sink == "parquet":
        if not args.sink_path:
            raise ConfigError("sink-path", "required for the parquet sink")
        path = os.path.abspath(args.sink_path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ConfigError("sink-path", f"{args.sink_path!r} exists and is not a directory")
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError("sink-path", f"{args.sink_path!r} is not writable (by this user)")
    else:
        from airflow_provider_cg.core.sinks.postgres import validate_identifier

        validate_identifier("pg-table", args.pg_table)
        if args.pg_table in ("cg_prepared_writes", "cg_committed_writes", "cg_partition_fences"):
            raise ConfigError("pg-table", f"{args.pg_table!r} is one of the sink's own tables")
    if args.payload_format == "json" and not args.json_schema:
        raise ConfigError("json-schema", "required when --payload-format is json")
    if args.payload_format == "avro":
        from airflow_provider_cg.core.decode import parse_avro_schema

        if not args.avro_schema:
            raise ConfigError("avro-schema", "required when --payload-format is avro")
        parse_avro_schema(args.avro_schema)
    if args.transform is not None or args.transform_sql is not None:
        from airflow_provider_cg.core.transform import parse_spec

        if args.transform is not None and args.transform_sql is not None:
            raise ConfigError("transform", "give --transform or --transform-sql, not both")
        if args.transform is not None:
            parse_spec(args.transform)
        elif not args.transform_sql.strip():
            raise ConfigError("transform-sql", "must not be empty")
        if args.no_spark:
            raise ConfigError("transform", "a transformation runs in Spark (drop --no-spark)")

    if args.payload_format in ("json", "avro") and args.no_spark:
        raise ConfigError("payload-format", f"{args.payload_format} needs Spark (drop --no-spark)")


def _build_sink(args):
    if args.sink == "parquet":
        from airflow_provider_cg.core.sinks.parquet import ParquetLakeSink

        if not args.sink_path:
            raise ValueError("--sink-path: required for the parquet sink")
        try:
            return ParquetLakeSink(args.sink_path)
        except OSError as e:
            raise ValueError(f"sink-path: cannot create the lake in {args.sink_path!r} ({e.strerror})") from None
    from airflow_provider_cg.core.sinks.postgres import PostgresSink

    dsn = os.environ.get("CG_PG_DSN")
    if not dsn and os.environ.get("CG_PG_DSN_FILE"):
        try:
            with open(os.environ["CG_PG_DSN_FILE"], encoding="utf-8") as f:
                dsn = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"CG_PG_DSN_FILE: cannot read the file it names ({type(e).__name__})") from None
    if not dsn:
        raise ValueError("CG_PG_DSN: the PostgreSQL sink needs a DSN in CG_PG_DSN or CG_PG_DSN_FILE")
    sink = PostgresSink(dsn, table=args.pg_table, transformed=_transforming(args))
    sink.check()  # an unreachable database fails here, before the pin is taken
    return sink


def _transforming(args) -> bool:
    return bool(args.transform or args.transform_sql)


def _build_pipeline(args, spark):
    """Spark decodes and transforms; a raw batch with no transformation has nothing for Spark
    to compute and lands as read (the data path's speed)."""
    from airflow_provider_cg.core.decode import SparkDecoder, text_decoder
    from airflow_provider_cg.core.pipeline import ArrowPipeline, SparkPipeline

    if spark is None:
        return ArrowPipeline(text_decoder() if args.payload_format == "text" else None)
    if args.payload_format == "raw" and not _transforming(args):
        return ArrowPipeline()
    decoder = SparkDecoder(spark, args.payload_format, args.json_schema or args.avro_schema)
    return SparkPipeline(spark, decoder, function=args.transform, sql=args.transform_sql)


async def _run(args, make_sink, pipeline):
    """Connect to NATS first (a refused or unreachable server leaves nothing behind), then
    open the sink and run."""
    from airflow_provider_cg.core.batch import BatchOptions, run_member_batch
    from airflow_provider_cg.core.config import in_membership
    from airflow_provider_cg.core.connection import NatsConnectionSettings
    from airflow_provider_cg.core.errors import ConfigError
    from airflow_provider_cg.core.groups import ConsumerGroups

    try:
        settings = NatsConnectionSettings.from_env()
    except (TypeError, ValueError) as e:
        field, sep, rule = str(e).partition(": ")
        name = field if field.startswith("CG_") else f"CG_NATS_{field.upper()}"
        raise ConfigError(name if sep else "CG_NATS_*", rule if sep else str(e)) from None

    async def check_group(nc):  # before the sink is opened: nothing is created for a wrong name
        info = await ConsumerGroups(nc).get(args.stream, args.group)
        if not args.backfill and not in_membership(info.config, args.member):
            raise ConfigError("member", f"{args.member!r} is not a member of group {args.group!r} "
                                        f"on stream {args.stream!r}")

    if args.backfill:
        from airflow_provider_cg.core.backfill import run_backfill

        settings.name = settings.name or f"cg-backfill-{args.stream}-{args.group}"
        nc = await settings.connect()
        try:
            await check_group(nc)
            sink = await asyncio.to_thread(make_sink)
            return await run_backfill(nc, sink, args.stream, args.group, args.backfill_start, args.backfill_end,
                                      batch_size=args.batch_size, pipeline=pipeline)
        finally:
            await nc.close()
    settings.name = settings.name or f"cg-job-{args.stream}-{args.group}-{args.member}"
    options = BatchOptions(
        stream=args.stream, group=args.group, member=args.member, batch_size=args.batch_size,
        max_messages=args.max_messages, max_bytes=args.max_bytes, max_seconds=args.max_seconds,
        standby_timeout=args.standby_timeout, ack_wait=args.ack_wait, max_deliver=args.max_deliver,
        idle_timeout=args.idle_timeout, progress_interval=args.progress_interval, read=args.read,
    )
    nc = await settings.connect()
    try:
        await check_group(nc)
        sink = await asyncio.to_thread(make_sink)
        return await run_member_batch(nc, sink, options, pipeline)
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # TLS transport chatter on failed handshakes
    from airflow_provider_cg.core.errors import ConfigError, ConsumerGroupError, GroupNotFound
    from airflow_provider_cg.core.transform import TransformError

    def fail(code: int, message: str) -> int:
        print(f"cg_member_job: error: {message}", file=sys.stderr)
        return code

    try:
        args = parse_args(argv)
    except UsageError as e:
        return fail(EXIT_INVALID, str(e))
    except ConfigError as e:
        return fail(EXIT_INVALID, str(e))
    spark = None
    try:
        try:
            if not args.no_spark:
                from pyspark.sql import SparkSession

                spark = SparkSession.builder.appName(
                    f"cg-{args.stream}-{args.group}-{args.member or 'backfill'}").getOrCreate()
                spark.sparkContext.setLogLevel("WARN")
            pipeline = _build_pipeline(args, spark)
            summary = asyncio.run(_run(args, lambda: _build_sink(args), pipeline))
        except GroupNotFound as e:
            return fail(EXIT_INVALID, f"group: {e}")
        except TransformError as e:  # the user's transformation failed: the batch was not acked
            return fail(EXIT_INVALID, str(e))
        except (ConfigError, ValueError) as e:
            return fail(EXIT_INVALID, str(e))
        except (ConsumerGroupError, ConnectionError, OSError) as e:  # server, connection, sink storage
            return fail(EXIT_SERVER, str(e))
        except KeyboardInterrupt:
            return 130
        except Exception as e:  # a bug or an unforeseen failure: one line, never the settings
            logging.getLogger("cg").debug("unexpected error", exc_info=True)
            return fail(EXIT_SERVER, f"unexpected {type(e).__name__}: {str(e)[:300]}")
    finally:
        if spark is not None:
            spark.stop()
    line = summary.to_json()
    if args.summary_file:
        _write_atomically(args.summary_file, line)
    print(SUMMARY_PREFIX + line, flush=True)
    return EXIT_OK


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
