"""An isolated Airflow for tests: temp AIRFLOW_HOME, migrated SQLite DB, env-var connections.

Airflow reads its configuration once, when ``airflow`` is first imported, so ``configure()``
must run before that: the pytest plugin ``tests.airflow_conftest`` calls it from
``pytest_configure``. Rules for test modules that touch Airflow:

- never import ``airflow`` (or ``airflow_provider_cg.hooks/operators/...``) at module level;
  import inside the test or a fixture, after the ``airflow_env`` fixture ran;
- core tests never import Airflow at all, so both kinds share one pytest run.

``activate()`` migrates the DB once per process (a copy of a cached, freshly migrated
template DB when one exists for this Airflow version) and imports Airflow.

DAGs defined inside a test run with ``AirflowEnv.run_dag(dag)``: ``dag.test()`` only runs
DAGs that are serialized in the DB, so the DAG is first synced into the ``dags-folder``
bundle, as the DAG processor would. ``fire_asset_watchers`` + ``run_asset_triggered`` replay
what the triggerer and the scheduler do for ``AssetWatcher``s, which ``dag.test()`` ignores.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_DEFAULTS = {
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    # Asset watchers of a paused DAG are not registered: new DAGs start unpaused.
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
}
CACHE_ENV = "CG_AIRFLOW_DB_CACHE"  # a directory for template DBs; "0" disables the cache
BUNDLE = "dags-folder"

_ENV: AirflowEnv | None = None
_SAVED_ENVIRON: dict[str, str | None] = {}


@dataclass
class DagRunResult:
    """Outcome of one DAG run: states and ``return_value`` XComs keyed by (task_id, map_index)."""

    dag_id: str
    run_id: str
    run_type: str
    state: str
    ti_states: dict[tuple[str, int], str] = field(default_factory=dict)
    xcoms: dict[tuple[str, int], Any] = field(default_factory=dict)

    def xcom(self, task_id: str, map_index: int = -1) -> Any:
        return self.xcoms.get((task_id, map_index))

    def state_of(self, task_id: str, map_index: int = -1) -> str | None:
        return self.ti_states.get((task_id, map_index))

    @classmethod
    def load(cls, dag_id: str, run_id: str) -> DagRunResult:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as s:
            dr = s.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).one()
            out = cls(dag_id, run_id, str(dr.run_type), str(dr.state))
            tis = s.scalars(
                select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
            )
            for ti in tis:
                out.ti_states[(ti.task_id, ti.map_index)] = str(ti.state)
            rows = s.scalars(
                select(XComModel).where(
                    XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == "return_value"
                )
            )
            for row in rows:
                out.xcoms[(row.task_id, row.map_index)] = XComModel.deserialize_value(row)
        return out


@dataclass
class AirflowEnv:
    home: Path
    fernet_key: str = field(default_factory=lambda: base64.urlsafe_b64encode(os.urandom(32)).decode())
    jwt_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    timings: dict[str, float] = field(default_factory=dict)
    activated: bool = False

    @property
    def dags_folder(self) -> Path:
        return self.home / "dags"

    @property
    def db_path(self) -> Path:
        return self.home / "airflow.db"

    def environ(self) -> dict[str, str]:
        return {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db_path}",
            # Trigger kwargs and connection secrets are encrypted as in production.
            "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            **ENV_DEFAULTS,
        }

    # --- connections (env-var secrets backend, read at every lookup) ---------------------

    @staticmethod
    def conn_env_var(conn_id: str) -> str:
        return f"AIRFLOW_CONN_{conn_id.upper()}"

    def add_connection(self, conn_id: str, conn_type: str, **fields: Any) -> str:
        """Define a connection as ``AIRFLOW_CONN_<ID>`` JSON; fields: host, port, login, password,
        schema, extra (dict). Returns the variable name."""
        body = {"conn_type": conn_type, **{k: v for k, v in fields.items() if v is not None}}
        name = self.conn_env_var(conn_id)
        os.environ[name] = json.dumps(body)
        return name

    def remove_connection(self, conn_id: str) -> None:
        os.environ.pop(self.conn_env_var(conn_id), None)

    @contextmanager
    def connection(self, conn_id: str, conn_type: str, **fields: Any) -> Iterator[str]:
        self.add_connection(conn_id, conn_type, **fields)
        try:
            yield conn_id
        finally:
            self.remove_connection(conn_id)

    # --- DAGs ---------------------------------------------------------------------------

    def sync_dag(self, dag: Any) -> None:
        """Serialize ``dag`` into the DB as the DAG processor would (bundle ``dags-folder``)."""
        from airflow.dag_processing.bundles.manager import DagBundlesManager
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

        DagBundlesManager().sync_bundles_to_db()
        bag = DagBag(dag_folder=self.dags_folder, collect_dags=False)
        bag.bag_dag(dag)
        sync_bag_to_db(bag, BUNDLE, None)

    def run_dag(self, dag: Any, **test_kwargs: Any) -> DagRunResult:
        """``dag.test(**test_kwargs)`` (deferred tasks run their trigger inline) and its outcome."""
        self.sync_dag(dag)
        started = time.perf_counter()
        dr = dag.test(**test_kwargs)
        self.timings.setdefault("first_dag_test", time.perf_counter() - started)
        return DagRunResult.load(dr.dag_id, dr.run_id)

    def fire_asset_watchers(self, dag: Any, timeout: float = 30.0, max_events: int = 1) -> list[Any]:
        """Run the watcher triggers of the assets ``dag`` is scheduled on, as the triggerer does.

        Each trigger is rebuilt from its DB row (classpath + decrypted kwargs), run until it
        yields ``max_events`` events (or ``timeout`` s pass: ``TimeoutError``), and each event is
        submitted with ``Trigger.submit_event``: an asset event and a queued DAG-run request.
        Returns the event payloads.
        """
        from airflow.models.asset import DagScheduleAssetReference
        from airflow.models.trigger import Trigger
        from airflow.serialization.decoders import smart_decode_trigger_kwargs
        from airflow.utils.session import create_session
        from sqlalchemy import select

        self.sync_dag(dag)
        with create_session() as s:
            refs = s.scalars(
                select(DagScheduleAssetReference).where(DagScheduleAssetReference.dag_id == dag.dag_id)
            ).all()
            rows = {t.id: (t.classpath, t.encrypted_kwargs) for ref in refs for t in ref.asset.triggers}
        if not rows:
            raise AssertionError(f"no asset watcher is registered for DAG {dag.dag_id!r}")

        async def _collect(agen: Any, events: list[Any]) -> None:
            async for event in agen:
                events.append(event)
                if len(events) >= max_events:
                    return

        async def _events(trigger: Any) -> list[Any]:
            events: list[Any] = []
            agen = trigger.run()
            try:
                await asyncio.wait_for(_collect(agen, events), timeout)
            finally:
                await agen.aclose()
                await trigger.cleanup()
            return events

        payloads = []
        for trigger_id, (classpath, encrypted) in sorted(rows.items()):
            kwargs = {
                k: smart_decode_trigger_kwargs(v) for k, v in Trigger._decrypt_kwargs(encrypted).items()
            }
            module, _, name = classpath.rpartition(".")
            trigger = getattr(importlib.import_module(module), name)(**kwargs)
            trigger.trigger_id = trigger_id
            for event in asyncio.run(_events(trigger)):
                Trigger.submit_event(trigger_id, event)
                payloads.append(event.payload)
        return payloads

    def run_asset_triggered(self, dag: Any) -> DagRunResult | None:
        """Create the asset-triggered run the scheduler would (None if none is due) and run it.

        Uses the scheduler's and ``dag.test()``'s own (private) steps, so it follows Airflow 3.3.
        """
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
        from airflow.models.dag import DagModel
        from airflow.models.dagbag import DBDagBag
        from airflow.models.dagrun import DagRun
        from airflow.sdk.definitions.dag import _run_task
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState, TaskInstanceState
        from sqlalchemy import select

        with create_session() as s:
            query, triggered = DagModel.dags_needing_dagruns(s)
            due = [m for m in query.all() if m.dag_id == dag.dag_id and m.dag_id in triggered]
            if not due:
                return None
            SchedulerJobRunner(job=Job(), executors=[])._create_dag_runs_asset_triggered(
                dag_models=due, session=s
            )
            s.commit()
            dr = s.scalars(
                select(DagRun)
                .where(DagRun.dag_id == dag.dag_id, DagRun.state == DagRunState.QUEUED)
                .order_by(DagRun.id.desc())
            ).first()
            if dr is None:
                return None
            dr.state = DagRunState.RUNNING
            s.commit()
            while dr.state == DagRunState.RUNNING:
                s.expire_all()
                dr.dag = DBDagBag().get_dag_for_run(dr, session=s)
                schedulable, _ = dr.update_state(session=s)
                for ti in schedulable:
                    ti.try_number += 1
                    ti.state = TaskInstanceState.SCHEDULED
                s.commit()
                for ti in schedulable:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
            dag_id, run_id = dr.dag_id, dr.run_id
        return DagRunResult.load(dag_id, run_id)


# --- process-wide setup -----------------------------------------------------------------


def configure(base_dir: str | os.PathLike | None = None) -> AirflowEnv:
    """Point this process's Airflow at a new temp home. Idempotent; imports nothing."""
    global _ENV
    if _ENV is not None:
        return _ENV
    if "airflow" in sys.modules:
        raise RuntimeError(
            "airflow was imported before the test Airflow environment was configured: import airflow "
            "inside tests/fixtures only, and load the pytest plugin tests.airflow_conftest"
        )
    home = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="cg-airflow-"))
    env = AirflowEnv(home=home)
    env.dags_folder.mkdir(parents=True, exist_ok=True)
    for name, value in env.environ().items():
        _SAVED_ENVIRON.setdefault(name, os.environ.get(name))
        os.environ[name] = value
    _ENV = env
    return env


def _template_db() -> Path | None:
    cache = os.environ.get(CACHE_ENV, os.path.join(tempfile.gettempdir(), "cg-airflow-db-cache"))
    if cache == "0":
        return None
    key = "-".join(metadata.version(d) for d in ("apache-airflow-core", "apache-airflow-task-sdk"))
    return Path(cache) / f"airflow-{key}.db"


_MIGRATION: subprocess.Popen | None = None


def _migrate_command(env: AirflowEnv) -> subprocess.Popen:
    log = open(env.home / "db-migrate.log", "w")  # a file: a pipe nobody reads would fill and block
    try:
        return subprocess.Popen([sys.executable, "-m", "airflow", "db", "migrate"], env={**os.environ, **env.environ()},
                                stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def start_migration() -> None:
    """Start ``airflow db migrate`` now, in the background, when no template DB saves it: the
    tests before the first one that needs Airflow run meanwhile (``migrate()`` waits for it)."""
    global _MIGRATION
    env = configure()
    template = _template_db()
    if _MIGRATION is None and not env.db_path.exists() and not (template is not None and template.exists()):
        _MIGRATION = _migrate_command(env)


def migrate(env: AirflowEnv) -> None:
    """Create the metadata DB: copy the cached template, or ``airflow db migrate`` (and cache it)."""
    global _MIGRATION
    if env.db_path.exists() and _MIGRATION is None:
        return
    started = time.perf_counter()
    template = _template_db()
    if _MIGRATION is None and template is not None and template.exists():
        shutil.copyfile(template, env.db_path)
        env.timings["db_copy"] = time.perf_counter() - started
        return
    proc, _MIGRATION = _MIGRATION or _migrate_command(env), None
    try:
        returncode = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if returncode != 0:
        raise RuntimeError(f"airflow db migrate failed ({returncode}):\n"
                           f"{(env.home / 'db-migrate.log').read_text()[-3000:]}")
    env.timings["db_migrate"] = time.perf_counter() - started
    if template is not None:
        template.parent.mkdir(parents=True, exist_ok=True)
        tmp = template.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(env.db_path, tmp)
        os.replace(tmp, template)  # atomic: parallel sessions never see half a file


def activate() -> AirflowEnv:
    """``configure()``, ``migrate()``, then import Airflow in this process and check its DB."""
    env = configure()
    if env.activated:
        return env
    migrate(env)
    started = time.perf_counter()
    from airflow import settings

    env.timings["import_airflow"] = time.perf_counter() - started
    if str(env.db_path) not in str(settings.SQL_ALCHEMY_CONN):
        raise RuntimeError(f"Airflow uses {settings.SQL_ALCHEMY_CONN}, not the test DB {env.db_path}")
    env.activated = True
    return env


def cleanup() -> None:
    """Restore the environment and delete the temp home (end of the pytest session)."""
    global _ENV, _MIGRATION
    env, _ENV = _ENV, None
    if _MIGRATION is not None:  # started, never waited for (the tests that needed it did not run)
        _MIGRATION.kill()
        _MIGRATION.wait()
        _MIGRATION = None
    for name, value in _SAVED_ENVIRON.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _SAVED_ENVIRON.clear()
    if env is not None:
        shutil.rmtree(env.home, ignore_errors=True)
