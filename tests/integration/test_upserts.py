"""Upserts (``merge_keys``, ``delete_when``: core/landing/sinks/shared/merging.py) into Delta, Iceberg and
PostgreSQL: a change stream of inserts, updates and deletes becomes a table of the last state
per key, read back by delta-rs, pyiceberg and psycopg2 and compared with the last state computed
here; replays change nothing, and an older record landed after a newer one (a hole a backfill
fills) never replaces it. The randomized run under outside faults is in test_member_job_chaos.py."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.rows import BatchId
from airflow_provider_cg.core.landing.sinks.lake.tables import SchemaMismatch
from airflow_provider_cg.core.landing.sinks.opening import open_sink
from airflow_provider_cg.core.landing.sinks.options import SinkOptions
from tests.support.chaos import chaos_seed
from tests.support.sink_rows import refs_for, rows

pytestmark = [pytest.mark.integration]

RULE = "payload_text = 'deleted'"


def _options(kind: str, tmp_path, request) -> SinkOptions:
    if kind == "delta":
        return SinkOptions(sink="delta", sink_path=str(tmp_path / "t"), merge_keys="key", delete_when=RULE)
    if kind == "iceberg":
        return SinkOptions(sink="iceberg", iceberg_table="lake.t", iceberg_catalog_uri=f"sqlite:///{tmp_path}/c.db",
                           iceberg_warehouse=str(tmp_path / "wh"), merge_keys="key", delete_when=RULE)
    pg = request.getfixturevalue("postgres_db")
    request.getfixturevalue("monkeypatch").setenv(
        "CG_PG_DSN", f"postgresql://{pg.user}:{pg.password}@{pg.host}:{pg.port}/{pg.dbname}")
    return SinkOptions(sink="postgres", pg_table="current_orders", merge_keys="key", delete_when=RULE)


def _state(kind: str, options: SinkOptions, request) -> dict[str, int]:
    """key -> origin_seq of the table's row, as a reader that is not the sink sees it."""
    if kind == "delta":
        from tests.support.member_job import read_delta

        t = read_delta(options.sink_path, ["key", "origin_seq"])
    elif kind == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        t = SqlCatalog("default", uri=options.iceberg_catalog_uri).load_table("lake.t") \
            .scan(selected_fields=("key", "origin_seq")).to_arrow()
    else:
        import psycopg2

        pg = request.getfixturevalue("postgres_db")
        with psycopg2.connect(host=pg.host, port=pg.port, user=pg.user, password=pg.password,
                              dbname=pg.dbname) as conn, conn.cursor() as cur:
            cur.execute("SELECT key, origin_seq FROM current_orders")
            got = cur.fetchall()
        conn.close()
        assert len(got) == len({k for k, _ in got}), "a key has two rows"
        return dict(got)
    keys = t.column("key").to_pylist()
    assert len(keys) == len(set(keys)), "a key has two rows"
    return dict(zip(keys, t.column("origin_seq").to_pylist(), strict=True))


def _land(sink, events: list[tuple[int, str, str]], batch_seq: int, member: str = "m1"):
    """Land ``events`` ((origin_seq, key, payload_text)) as one batch of rows."""
    seqs = [e[0] for e in events]
    t = rows(seqs, member=member)
    t = t.set_column(t.schema.get_field_index("key"), "key", pa.array([e[1] for e in events]))
    t = t.set_column(t.schema.get_field_index("payload_text"), "payload_text", pa.array([e[2] for e in events]))
    p = sink.prepare(BatchId("ORDERS", "g", member, batch_seq), t, message_refs=refs_for(seqs))
    return sink.commit(sink.mark_acking(p))


def _last_state(events) -> dict[str, int]:
    state: dict[str, int] = {}
    for seq, key, text in sorted(events):
        if text == "deleted":
            state.pop(key, None)
        else:
            state[key] = seq
    return state


@pytest.mark.parametrize("kind", ["delta", "iceberg", "postgres"])
def test_a_random_change_stream_over_1000_keys_ends_as_the_last_state_per_key(kind, tmp_path, request):
    seed = chaos_seed(request)
    rnd = random.Random(seed)
    options = _options(kind, tmp_path, request)
    events, seq = [], 0
    for _ in range(6000):  # inserts, updates and deletes, about 1 in 8 a delete
        seq += 1
        events.append((seq, f"k{rnd.randrange(1000)}", "deleted" if rnd.random() < 0.125 else f"v{seq}"))
    sinks = [open_sink(options), open_sink(options)]  # two instances, as a member's successive jobs
    cuts = sorted(rnd.sample(range(1, len(events)), 9))
    batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]
    landed: list[list] = []
    for i, batch in enumerate(b for b in batches if b):
        _land(sinks[i % 2], batch, i + 1)
        landed.append(batch)
        if rnd.random() < 0.3:  # a replay of a landed batch (a reset, a redelivery): nothing changes
            again = landed[rnd.randrange(len(landed))]
            assert _land(sinks[(i + 1) % 2], again, 1000 + i).rows_written == 0, seed
    want = _last_state(events)
    assert _state(kind, options, request) == want, seed
    if kind != "postgres":  # DuckDB and Polars agree
        from tests.support.outside_readers import duckdb_rows, polars_rows

        location = options.sink_path if kind == "delta" else open_sink(options).load_table().metadata_location
        for read in (duckdb_rows, polars_rows):
            got = read(kind, location, ["key", "origin_seq"])
            assert len(got) == len(want) and dict(got) == want, (read.__name__, seed)


@pytest.mark.parametrize("kind", ["delta", "iceberg", "postgres"])
def test_an_older_record_landed_after_a_newer_one_never_replaces_it(kind, tmp_path, request):
    options = _options(kind, tmp_path, request)
    sink = open_sink(options)
    _land(sink, [(20, "a", "v20"), (21, "b", "v21"), (22, "c", "deleted")], 1)
    # a hole filled later (a backfill of messages the members passed): older than the table's rows
    _land(sink, [(15, "a", "v15"), (16, "b", "deleted"), (17, "d", "v17")], 2, member="backfill")
    assert _state(kind, options, request) == {"a": 20, "b": 21, "d": 17}
    with pytest.raises(SchemaMismatch, match="'key'.*merge key"):
        t = rows([30]).drop_columns(["key"])
        sink.prepare(BatchId("ORDERS", "g", "m1", 3), t, message_refs=refs_for([30]), input_keys={"ORDERS": [30]})


@pytest.mark.parametrize(("values", "field"), [
    ({"sink": "delta", "sink_path": "/x", "delete_when": RULE}, "delete_when"),
    ({"sink": "delta", "sink_path": "/x", "merge_keys": "a,,b"}, "merge_keys"),
    ({"sink": "delta", "sink_path": "/x", "merge_keys": "origin_seq"}, "merge_keys"),
    ({"sink": "delta", "sink_path": "/x", "merge_keys": "key", "delete_when": "op == 'd'"}, "delete_when"),
    ({"sink": "delta", "sink_path": "/x", "merge_keys": "key", "delete_when": "key = 'd'"}, "delete_when"),
    ({"sink": "parquet", "sink_path": "/x", "merge_keys": "key"}, "merge_keys"),
])
def test_bad_merge_options_are_refused_naming_the_field(values, field):
    with pytest.raises(ConfigError) as refused:
        SinkOptions.build(values)
    assert refused.value.field == field


def test_a_publisher_whose_staging_another_writer_published_meanwhile_reads_the_table_again(tmp_path):
    """Two writers of one Delta table with upserts: writer B reads the table, then writer A
    publishes the next committed record (its merge) and removes its staging before B reads the
    record's rows. B counts a lost race and reads the table again, where the record is: not
    ``staged rows ... are missing`` (exit 2 for a run that did nothing wrong)."""
    from airflow_provider_cg.core.landing.sinks.lake.tables import TableConflict

    options = SinkOptions(sink="delta", sink_path=str(tmp_path / "t"), merge_keys="key", delete_when=RULE)
    a, b = open_sink(options), open_sink(options)
    try:
        _land(a, [(1, "k1", "a"), (2, "k2", "b")], 1)
        stale = b._loaded()  # B plans on the table as it is now
        t = rows([3, 4], member="m2")
        t = t.set_column(t.schema.get_field_index("key"), "key", pa.array(["k1", "k3"]))
        prepared = b.prepare(BatchId("ORDERS", "g", "m2", 1), t, message_refs=refs_for([3, 4]))
        b.set_table_commit_interval(3600.0)  # B's own commit leaves the publish to a slot
        b._slot_tried = 1 << 62  # (and B has tried every slot: another writer publishes it)
        b.commit(b.mark_acking(prepared))
        b._log.refresh()
        record = b._log.commits[prepared.gid]
        a.publish(record)  # A publishes B's record, and removes its staging
        with pytest.raises(TableConflict, match="published by another writer"):
            b._staged_rows(record, stale)
        assert b._publish_ready() is False or b._loaded().position >= record["pos"]
        assert _state("delta", options, None) == {"k1": 3, "k2": 2, "k3": 4}
    finally:
        a.close()
        b.close()
