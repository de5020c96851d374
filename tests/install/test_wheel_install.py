"""The provider as users install it: a wheel, installed (not editable) with its dependencies
into a fresh virtual environment, outside the checkout; example DAG 1 then runs end to end
from that install (``python -m airflow_provider_cg.demo``: a real nats-server from the
``nats-server`` extra, ``airflow dags test`` on SQLite, real ``spark-submit`` in local mode).

Slow (a venv, an Airflow DB migration and the demo, all in the background: conftest.py): one
test, marked ``install``, run last."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.install, pytest.mark.integration, pytest.mark.spark]


def test_wheel_installs_into_a_fresh_venv_and_runs_example_dag_1(installed_wheel):
    wheel, venv = installed_wheel.wheel, installed_wheel.venv  # built and probed by conftest.py, in the background
    names = set(zipfile.ZipFile(wheel).namelist())
    # every source of the checkout ships (setup.cfg lists the packages; dags/ and spark_apps/
    # sit at the repository's top and go into the package as example_dags and spark_apps)
    top = {"dags": "airflow_provider_cg/example_dags", "spark_apps": "airflow_provider_cg/spark_apps",
           "airflow_provider_cg": "airflow_provider_cg"}
    for folder, inside in top.items():
        for src in (ROOT / folder).rglob("*.py"):
            needed = f"{inside}/{src.relative_to(ROOT / folder).as_posix()}"
            assert needed in names, f"{needed} is not in {wheel.name}"

    # installed, not the checkout; one PySpark: pyspark and the Spark provider's pyspark-client
    # are one release and no file of one was replaced by another version's
    probe = installed_wheel.probe
    assert str(venv) in probe and str(ROOT) not in probe.split("\n")[0], probe

    # The documented way to get the example DAGs: Airflow's own provider example bundle (one
    # bundle, every shipped DAG parsing in the stock Airflow), and the UI plugin registered.
    found = json.loads(installed_wheel.bundles.strip().splitlines()[-1])
    assert found["ours"] == [str(venv)] and found["errors"] == {}, found
    assert {"cg_scheduled_consumption", "cg_backfill", "cg_overflow_scaleout", "cg_paid_orders_report",
            "cg_table_maintenance", "cg_stream_windows"} <= set(
        found["dags"]), found
    assert "nats_consumer_groups" in found["plugins"], found

    # the README's demo, run from the install (in the background too: conftest.DEMO_ARGS)
    demo = installed_wheel.demo
    assert "[demo] OK" in demo, demo[-3000:]
    assert "(published 5000, paid " in demo, demo[-3000:]


_ONE_PYSPARK = r"""
import base64, csv, hashlib, importlib.metadata as md, os, sys
import airflow_provider_cg, pyspark
print(airflow_provider_cg.__file__)
from airflow_provider_cg.core.tools.packaging import member_job_path, spark_app_path
assert member_job_path().is_file(), member_job_path()
assert spark_app_path("cg_stream_windows.py").is_file()  # example DAG 7's application
from airflow_provider_cg.core.streaming import SOURCE_NAME, register  # the streaming source, installed
versions = {d: md.version(d) for d in ("pyspark", "pyspark-client")}
assert pyspark.__version__ == versions["pyspark"] == versions["pyspark-client"], (pyspark.__version__, versions)
# every file both distributions install has the content pyspark's own RECORD says
rec = {r[0]: r[1] for r in csv.reader(md.distribution("pyspark").read_text("RECORD").splitlines()) if len(r) > 1}
site = md.distribution("pyspark").locate_file("")
changed = []
for row in csv.reader(md.distribution("pyspark-client").read_text("RECORD").splitlines()):
    path = row[0]
    if path in rec and rec[path] and path.endswith(".py"):
        algo, digest = rec[path].split("=", 1)
        data = open(os.path.join(site, path), "rb").read()
        got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if got != digest:
            changed.append(path)
assert not changed, f"{len(changed)} pyspark files replaced by another version: {changed[:5]}"
print("one pyspark", pyspark.__version__)
"""


_BUNDLES = r"""
import json, sys
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import DagBag
from airflow import plugins_manager
bundles = {b.name: str(b.path) for b in DagBundlesManager().get_all_dag_bundles()}
ours = [n for n, p in bundles.items() if "airflow_provider_cg" in p]
assert ours == ["airflow-provider-cg-example-dags"], bundles
bag = DagBag(dag_folder=bundles[ours[0]])
names = [p["name"] for p in plugins_manager.get_plugin_info()]
print(json.dumps({"ours": [sys.prefix], "errors": bag.import_errors, "dags": sorted(bag.dags), "plugins": names}))
"""
