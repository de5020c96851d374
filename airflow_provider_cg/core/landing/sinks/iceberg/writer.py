"""Apache Iceberg tables through a SQL catalog (SQLite or PostgreSQL) or a REST catalog, exactly once.

Like the Delta sink (``delta/writer.py``): the lake protocol decides, and committed batches are
published together, one Iceberg commit (``pyiceberg``) for every record ready then
(``tables.py``'s group commit), adding their files and setting the table property
``airflow-provider-cg.position`` to the last record's log position (the snapshot summary
carries it too, with the gid). A table property is never expired, so the floor that says
which batches the table holds survives snapshot expiry. The catalog's commit is optimistic;
the sink sets ``commit.retry.num-retries=0`` on its table, because pyiceberg's automatic retry
would rebase a commit past the position check: a commit that loses a race fails, and the sink
re-reads the position and tries again.

A commit's cost stays flat as the table ages: the table is loaded once per publish, data file
entries are built from the footers the writer kept (no ``add_files`` scan of every manifest),
manifests are merged once 100 accumulate, old metadata files are deleted at commit, and each
commit expires the snapshots beyond the newest 10 (``snapshots_to_expire``; a table's own
``history.expire.*`` properties keep more).

The protocol's ``_cg_*`` objects live under the table's location (local or ``s3://``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.lake.storage import (
    ObjectStorage,
    ObjectStoreSettings,
    open_storage,
)
from airflow_provider_cg.core.landing.sinks.lake.tables import (
    APP_ID,
    DataFile,
    TableConflict,
    TableSink,
    TableState,
    new_columns,
)
from airflow_provider_cg.core.landing.sinks.shared.identifiers import parse_identifier
from airflow_provider_cg.core.landing.sinks.shared.merging import DELETE_FLAG, MergeSpec
from airflow_provider_cg.core.landing.sinks.shared.table_partitioning import PartitionField, Partitioning

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import numpy as np
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table, Transaction

log = logging.getLogger(__name__)

POSITION_PROPERTY = f"{APP_ID}.position"
#: the SQL catalog's default name (its rows are keyed by it): pyiceberg's default, what
#: ``load_catalog("default", uri=...)`` and a Spark ``spark.sql.catalog.default`` JDBC catalog read;
#: the ``iceberg_catalog_name`` option names another
CATALOG_NAME = "default"
NO_RETRIES = {"commit.retry.num-retries": "0"}
#: what keeps a table landed every second as fast to commit to on its second day as on its
#: first hour: each commit's manifests merged once 100 accumulate (pyiceberg merges only when
#: asked), and the previous metadata files beyond 10 deleted at each commit
FLAT_COMMITS = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "100",
                "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "10"}
MIN_SNAPSHOTS, MAX_SNAPSHOT_AGE = "history.expire.min-snapshots-to-keep", "history.expire.max-snapshot-age-ms"
#: snapshots a table keeps when it does not say (``history.expire.min-snapshots-to-keep``):
#: pyiceberg copies the whole table metadata a dozen times per commit, so a commit costs about
#: 4 ms more per snapshot kept (40 ms with 10 here, 200-400 ms with 100)
SNAPSHOTS_KEPT = 10


def iceberg_io_properties(settings: ObjectStoreSettings) -> dict[str, str]:
    out = {}
    if settings.endpoint:
        out["s3.endpoint"] = settings.endpoint
        out["s3.force-virtual-addressing"] = "false"
    if settings.region:
        out["s3.region"] = settings.region
    if settings.access_key_id:
        out["s3.access-key-id"] = settings.access_key_id
        out["s3.secret-access-key"] = settings.secret_access_key or ""
    if settings.session_token:
        out["s3.session-token"] = settings.session_token
    return out


#: where a REST catalog's credentials come from (never an option: see ``open_catalog``)
TOKEN_ENV, CREDENTIAL_ENV = "CG_ICEBERG_CATALOG_TOKEN", "CG_ICEBERG_CATALOG_CREDENTIAL"


def is_rest(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def open_catalog(uri: str, warehouse: str | None, settings: ObjectStoreSettings, name: str = CATALOG_NAME,
                 env: Mapping[str, str] | None = None) -> Catalog:
    """pyiceberg's SQL catalog (``sqlite:///``, ``postgresql://``) or REST catalog (``http(s)://``,
    its bearer token from ``CG_ICEBERG_CATALOG_TOKEN`` or OAuth2 client credentials
    ``client_id:client_secret`` from ``CG_ICEBERG_CATALOG_CREDENTIAL``); errors name the
    setting, never a password or a token."""
    if is_rest(uri):
        return _rest_catalog(uri, settings, name, os.environ if env is None else env)
    from pyiceberg.catalog.sql import SqlCatalog

    scheme = uri.split(":", 1)[0] if ":" in uri else ""
    if not (scheme.startswith("sqlite") or scheme.startswith("postgresql")):
        raise ConfigError("iceberg_catalog_uri", "must be a sqlite:/// or postgresql:// SQLAlchemy URI, "
                                                 "or a REST catalog's http(s):// URL")
    if scheme == "postgresql":
        uri = "postgresql+psycopg2" + uri[len("postgresql"):]
    if scheme.startswith("sqlite") and uri.startswith(("sqlite:////", "sqlite:///")):
        db = uri.split(":///", 1)[1].split("?", 1)[0]
        if db and db != ":memory:":  # SQLite creates the file, not its folder: as a table's folder, created
            try:
                os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
            except OSError as e:
                raise ConfigError("iceberg_catalog_uri", f"cannot create the folder of {db!r} ({e.strerror})") from None
    props = {"uri": uri, **iceberg_io_properties(settings)}
    if warehouse:
        props["warehouse"] = warehouse if "://" in warehouse else "file://" + os.path.abspath(warehouse)
    for attempt in range(20):
        try:
            return SqlCatalog(name, **props)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy's errors may quote the URI
            racing = _locked(e) or "already exists" in str(e)  # another process creates the catalog's tables
            if racing and attempt < 19:
                time.sleep(0.05 * (attempt + 1))
                continue
            if type(e).__name__ == "OperationalError" and scheme.startswith("postgresql"):
                raise ConnectionError(f"iceberg catalog database unreachable or refused ({type(e).__name__})") from None
            raise ConfigError("iceberg_catalog_uri", f"cannot open the catalog ({type(e).__name__})") from None
    raise AssertionError("unreachable")


def _rest_catalog(uri: str, settings: ObjectStoreSettings, name: str, env: Mapping[str, str]) -> Catalog:
    from pyiceberg.catalog.rest import RestCatalog

    props = {"uri": uri, **iceberg_io_properties(settings)}
    if env.get(TOKEN_ENV):
        props["token"] = env[TOKEN_ENV]
    if env.get(CREDENTIAL_ENV):
        props["credential"] = env[CREDENTIAL_ENV]
    try:
        return RestCatalog(name, **props)
    except Exception as e:  # noqa: BLE001 - classified below; the message may quote a request
        raise _rest_error(e) from None


def _rest_error(e: Exception) -> Exception:
    """A REST catalog's failure as the job's error: refused credentials are input (exit 1),
    an unreachable or failing server is transient (exit 2)."""
    kind = type(e).__name__
    if kind in ("UnauthorizedError", "ForbiddenError", "OAuthError"):
        return ConfigError("iceberg_catalog_uri", f"the REST catalog refused the credentials ({kind}; set "
                                                  f"{TOKEN_ENV} or {CREDENTIAL_ENV}, or the operator's iceberg_conn_id)")
    return ConnectionError(f"iceberg REST catalog unreachable or failing ({kind})")


def _locked(e: Exception) -> bool:
    """SQLite's 'database is locked' (a concurrent writer of the catalog): try again."""
    return type(e).__name__ == "OperationalError" and "locked" in str(e)


class IcebergSink(TableSink):
    """Two-phase sink into the Iceberg table ``table`` (``namespace.table``) of a SQL catalog,
    created from the first batch's schema (under ``warehouse``) if missing."""

    def __init__(self, catalog_uri: str, table: str, *, warehouse: str | None = None, fsync: bool = True,
                 compression: str = "snappy", checkpoint_interval: int = 100, catalog_name: str = CATALOG_NAME,
                 partitioning: Partitioning | None = None, merge: MergeSpec | None = None,
                 target_file_size: int | None = None) -> None:
        self.namespace, self.name = parse_identifier(table)
        self.identifier = f"{self.namespace}.{self.name}"
        self.settings = ObjectStoreSettings.from_env()
        self.catalog = open_catalog(catalog_uri, warehouse, self.settings, catalog_name)
        tbl = self._load()
        self.partitioning: Partitioning | None = partitioning
        self.merge = merge
        if tbl is not None:
            self.partitioning = _table_partitioning(tbl, partitioning, self.identifier)
            location = tbl.location()
            wanted = self._own_properties(target_file_size)
            if any(tbl.properties.get(k) != v for k, v in wanted.items()):
                with tbl.transaction() as tx:
                    tx.set_properties(wanted)
        elif warehouse:  # a SQL catalog's warehouse property, or (REST) the location asked for
            base = warehouse if "://" in warehouse else "file://" + os.path.abspath(warehouse)
            location = f"{base.rstrip('/')}/{self.namespace}.db/{self.name}"
        else:
            raise ConfigError("iceberg_warehouse", f"required to create table {self.identifier!r}")
        if location.startswith("file://"):
            location = location[len("file://"):]
        store = open_storage(location, fsync=fsync)
        if isinstance(store, ObjectStorage):
            store.check()
        super().__init__(store, compression=compression, checkpoint_interval=checkpoint_interval,
                         target_file_size=target_file_size)
        self.location = store.uri() if isinstance(store, ObjectStorage) else "file://" + store.location
        self.table_location = self.location

    @staticmethod
    def _own_properties(target_file_size: int | None) -> dict[str, str]:
        """The table properties the sink relies on: no automatic commit retry (see the module
        docstring) and, with ``target_file_size``, the size pyiceberg writes a merge's files at
        (the sink's own files are written at it by ``parquet_files.py``)."""
        if not target_file_size:
            return {**NO_RETRIES, **FLAT_COMMITS}
        return {**NO_RETRIES, **FLAT_COMMITS, "write.target-file-size-bytes": str(target_file_size)}

    def load_table(self) -> Table | None:
        """The table as pyiceberg loads it now (None if not created yet)."""
        return self._load()

    def _load(self) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        for attempt in range(20):
            try:
                return self.catalog.load_table(self.identifier)
            except NoSuchTableError:
                return None
            except Exception as e:  # noqa: BLE001 - the database is unreachable or refuses us
                if _locked(e) and attempt < 19:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if type(e).__name__ in ("UnauthorizedError", "ForbiddenError", "OAuthError"):
                    raise _rest_error(e) from None
                raise ConnectionError(f"iceberg catalog unreachable ({type(e).__name__})") from None
        raise AssertionError("unreachable")

    def load_state(self) -> TableState:
        tbl = self._load()
        if tbl is None:
            return TableState(0, None)
        return TableState(int(tbl.properties.get(POSITION_PROPERTY, 0)), tbl.schema().as_arrow(), tbl)

    def _create(self, schema: pa.Schema) -> Table:
        """Create the namespace and the table unless there. Two members' first batches may race
        here: pyiceberg checks, then inserts, and the loser's insert fails on the catalog's key
        (an IntegrityError on PostgreSQL, not its AlreadyExists error); whoever created it, it is
        there now."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except NamespaceAlreadyExistsError:
            pass
        except Exception:  # a lost race surfaces as the database's own error
            if not self._namespace_exists():
                raise
        try:
            properties = self._own_properties(self.target_file_size)
            if self.partitioning is None:
                return self.catalog.create_table(self.identifier, schema=schema, location=self.location,
                                                 properties=properties)
            tx = self.catalog.create_table_transaction(self.identifier, schema=schema, location=self.location,
                                                       properties=properties)
            with tx.update_spec() as spec:
                for f in self.partitioning.fields:
                    spec.add_field(f.column, f.iceberg_transform(), f.name)
            return tx.commit_transaction()
        except Exception:  # TableAlreadyExistsError, or a catalog's own error for the same race
            table = self._load()  # created by the other member meanwhile
            if table is None:
                raise
            return table

    def _namespace_exists(self) -> bool:
        try:
            return bool(self.catalog.namespace_exists(self.namespace))
        except Exception:  # noqa: BLE001 - cannot tell: let the original error stand
            return False

    def _publish(self, records: list[dict], schema: pa.Schema, state: TableState, what: str,
                 write: Callable[[Table, Transaction, dict[str, str]], None]) -> bool:
        """One Iceberg transaction for a run of committed records, on the table as ``state``
        loaded it: ``schema``'s new columns added, the last record's position set, and
        ``write(table, tx, snapshot_properties)``'s changes, committed together
        (``TableConflict`` when another writer committed first: the caller re-reads and
        retries). The table is created from ``schema`` if missing. False: the table already
        held the last record (another publisher committed it), nothing was committed."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table.update.snapshot import ExpireSnapshots

        tbl = state.handle or self._load() or self._create(schema)
        last = records[-1]
        if not self.as_loaded(int(tbl.properties.get(POSITION_PROPERTY, 0)), state, last["pos"]):
            return False  # another publisher committed it since we looked
        added = new_columns(tbl.schema().as_arrow(), schema)
        pos = str(last["pos"])
        try:
            with tbl.transaction() as tx:
                if added:
                    with tx.update_schema() as update:
                        update.union_by_name(pa.schema(added))
                tx.set_properties({POSITION_PROPERTY: pos})
                write(tbl, tx, {POSITION_PROPERTY: pos, f"{APP_ID}.gid": last["gid"],
                                f"{APP_ID}.records": str(len(records))})
                old = snapshots_to_expire(tbl, time.time(), adding=1)
                if old:  # in the same commit: no commit of its own
                    ExpireSnapshots(tx).by_ids(old).commit()
        except CommitFailedException as e:
            raise TableConflict(f"iceberg {what} of position {pos} lost a race ({e})") from None
        except Exception as e:
            if _locked(e):
                raise TableConflict(f"iceberg {what} of position {pos}: catalog busy") from None
            raise
        return True

    def merge_rows(self, records: list[dict], latest: pa.Table, state: TableState) -> bool:
        """The table's rows of the records' keys are read, the records not newer than them
        dropped, then the rows of tombstoned and replaced keys deleted (pyiceberg rewrites the
        files they touch) and the newer records appended: an upsert without a second scan."""
        latest = self.storable(latest)

        def write(tbl: Table, tx: Transaction, summary: dict[str, str]) -> None:
            keep, held = _newer_than_table(tbl, latest, self.merge.keys)
            replaced = latest.filter(pa.array(keep & held))  # tombstoned, or replaced by a newer record
            if replaced.num_rows:
                tx.delete(_keys_filter(replaced, self.merge.keys), snapshot_properties=summary)
            flags = latest.column(DELETE_FLAG).to_numpy(zero_copy_only=False)
            rows = latest.filter(pa.array(keep & ~flags)).drop_columns([DELETE_FLAG])
            if rows.num_rows:
                tx.append(rows.cast(_table_arrow_schema(tx, rows.schema)), snapshot_properties=summary)

        return self._publish(records, latest.drop_columns([DELETE_FLAG]).schema, state, "merge", write)

    def commit_files(self, records: list[dict], files: list[DataFile], schema: pa.Schema, state: TableState) -> bool:
        def write(tbl: Table, tx: Transaction, summary: dict[str, str]) -> None:
            _append_files(tx, [(self.store.uri(f.path), f) for f in files], summary)

        return self._publish(records, schema, state, "commit", write)


def snapshots_to_expire(tbl: Table, now: float, adding: int = 0) -> list[int]:
    """Snapshot ids beyond the newest ``history.expire.min-snapshots-to-keep`` (default
    ``SNAPSHOTS_KEPT``; ``adding``: snapshots the commit at hand adds) that are also older
    than ``history.expire.max-snapshot-age-ms`` if the table sets it; never the current one
    nor a branch's or tag's head."""
    props = tbl.properties
    keep = max(int(props.get(MIN_SNAPSHOTS, SNAPSHOTS_KEPT)) - adding, 1)
    max_age = props.get(MAX_SNAPSHOT_AGE)
    heads = {ref.snapshot_id for ref in tbl.metadata.refs.values()}
    snapshots = sorted(tbl.snapshots(), key=lambda s: s.timestamp_ms, reverse=True)
    out = []
    for s in snapshots[keep:]:
        if s.snapshot_id in heads:
            continue
        if max_age is not None and s.timestamp_ms > (now * 1000 - int(max_age)):
            continue
        out.append(s.snapshot_id)
    return out


def _table_partitioning(tbl: Table, asked: Partitioning | None, identifier: str) -> Partitioning | None:
    """The existing table's partition spec as a ``Partitioning`` (``asked`` must be the same)."""
    schema = tbl.schema()
    fields = []
    for pf in tbl.spec().fields:
        kind, _, width = str(pf.transform).partition("[")
        column = schema.find_column_name(pf.source_id)
        if column is None:
            raise ConfigError("iceberg_table", f"{identifier} has a partition field ({pf.name}) without a source column")
        fields.append(PartitionField(column, kind,
                                     int(width.rstrip("]")) if width else None))
    found = Partitioning(tuple(fields), "iceberg", transforms=True) if fields else None
    if asked is not None and (found is None or found.fields != asked.fields):
        raise ConfigError("partition_by", f"the table {identifier!r} exists partitioned by "
                                          f"({found or 'nothing'}), not ({asked})")
    return found


def _append_files(tx: Transaction, files: list[tuple[str, DataFile]], summary: dict[str, str]) -> None:
    """Add data files, each with the partition of its rows, in one merge append. Not
    pyiceberg's ``add_files``: it opens every manifest of the table to refuse duplicates (a
    commit's cost then grows with the table; the protocol log already guarantees a file is
    added once), reads each file's footer again, and infers a partition from column bounds,
    which a bucket transform has none of. This builds the same data file entries from the
    footers the writer kept, through pyiceberg's public statistics functions, with the same
    name mapping for files without field ids."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
    from pyiceberg.table import TableProperties

    md = tx.table_metadata
    if md.name_mapping() is None:
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: md.schema().name_mapping.model_dump_json()})
        md = tx.table_metadata
    schema, spec = md.schema(), md.spec()
    plan, mapping = compute_statistics_plan(schema, md.properties), parquet_path_to_id_mapping(schema)
    with tx.update_snapshot(snapshot_properties=summary).merge_append() as append:
        for uri, f in files:
            stats = data_file_statistics_from_parquet_metadata(f.metadata, plan, mapping)
            key = PartitionKey(field_values=[PartitionFieldValue(field=pf, value=v)
                                             for pf, v in zip(spec.fields, f.partition or [], strict=True)],
                               partition_spec=spec, schema=schema)
            append.append_data_file(IcebergDataFile.from_args(
                content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
                partition=key.partition, file_size_in_bytes=f.size, sort_order_id=None,
                spec_id=md.default_spec_id, equality_ids=None, key_metadata=None, **stats.to_serialized_dict()))


def _keys_filter(rows: pa.Table, keys: tuple[str, ...]) -> BooleanExpression:
    """A pyiceberg row filter matching the keys of ``rows``."""
    from functools import reduce

    import pyiceberg.expressions

    ex: Any = pyiceberg.expressions  # (their classes take (term, value) positionally; the types say keywords)
    if len(keys) == 1:
        return ex.In(keys[0], set(rows.column(keys[0]).to_pylist()))
    each = [reduce(ex.And, [ex.EqualTo(k, r[k]) for k in keys]) for r in rows.select(list(keys)).to_pylist()]
    return reduce(ex.Or, each)


def _newer_than_table(tbl: Table, latest: pa.Table, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per record of ``latest``: whether the table has no row of its key or an older one, and
    whether it has a row of its key."""
    import numpy as np

    if latest.num_rows == 0 or tbl.current_snapshot() is None:
        return np.ones(latest.num_rows, dtype=bool), np.zeros(latest.num_rows, dtype=bool)
    held = tbl.scan(row_filter=_keys_filter(latest, keys),
                    selected_fields=(*keys, "origin_stream", "origin_seq")).to_arrow()
    have = {tuple(r[k] for k in keys): (r["origin_stream"], r["origin_seq"]) for r in held.to_pylist()}
    out, held_mask = np.ones(latest.num_rows, dtype=bool), np.zeros(latest.num_rows, dtype=bool)
    for i, r in enumerate(latest.select([*keys, "origin_stream", "origin_seq"]).to_pylist()):
        old = have.get(tuple(r[k] for k in keys))
        held_mask[i] = old is not None
        if old is not None and old[0] == r["origin_stream"] and old[1] >= r["origin_seq"]:
            out[i] = False
    return out, held_mask


def _table_arrow_schema(tx: Transaction, schema: pa.Schema) -> pa.Schema:
    """``schema`` with each column typed as the table holds it (pyiceberg's upsert compares them)."""
    table = tx.table_metadata.schema().as_arrow()
    return pa.schema([table.field(f.name) if table.get_field_index(f.name) >= 0 else f for f in schema])
