"""Provider metadata: valid for Airflow's schema, registered as an entry point, discovered by
Airflow's ProvidersManager. Only the last test imports Airflow (after the harness set it up)."""

from __future__ import annotations

import importlib.util
import json
from importlib import metadata
from pathlib import Path

import pytest

from airflow_provider_cg import __version__, get_provider_info
from airflow_provider_cg.core.jetstream.connection import SECRET_FIELDS

pytest_plugins = ["tests.airflow_conftest"]


def _airflow_schema(name: str) -> dict:
    # find_spec locates the package without importing (and so configuring) Airflow.
    spec = importlib.util.find_spec("airflow")
    assert spec is not None and spec.submodule_search_locations
    for location in spec.submodule_search_locations:
        path = Path(location) / name
        if path.exists():
            return json.loads(path.read_text())
    raise AssertionError(f"{name} not found in the installed Airflow")


def test_provider_info_matches_airflow_schema_and_architecture():
    import jsonschema

    info = get_provider_info()
    jsonschema.validate(info, _airflow_schema("provider_info.schema.json"))
    assert info["package-name"] == "airflow-provider-cg"
    assert info["versions"] == [__version__]
    (conn,) = info["connection-types"]
    assert conn["connection-type"] == "nats"
    assert conn["hook-class-name"] == "airflow_provider_cg.hooks.nats.NatsHook"

    def modules(key):
        return [m for entry in info[key] for m in entry["python-modules"]]

    assert modules("hooks") == ["airflow_provider_cg.hooks.nats", "airflow_provider_cg.hooks.spark_submit"]
    assert modules("operators") == [
        "airflow_provider_cg.operators.groups",
        "airflow_provider_cg.operators.members",
        "airflow_provider_cg.operators.spark",
        "airflow_provider_cg.operators.maintenance",
        "airflow_provider_cg.operators.streaming",
    ]
    assert modules("sensors") == ["airflow_provider_cg.sensors.overflow"]
    assert modules("triggers") == ["airflow_provider_cg.triggers.overflow"]
    assert info["queues"] == ["airflow_provider_cg.queues.nats.NatsCgMessageQueueProvider"]


def test_connection_form_marks_every_secret_and_fits_the_behaviour_schema():
    import jsonschema

    conn = get_provider_info()["connection-types"][0]
    secret = {name for name, f in conn["conn-fields"].items() if f["schema"].get("format") == "password"}
    assert secret == SECRET_FIELDS - {"password"}  # password is the connection's own field
    behaviour = conn["ui-field-behaviour"]
    as_hook_dict = {
        "hidden_fields": behaviour["hidden-fields"],
        "relabeling": behaviour["relabeling"],
        "placeholders": behaviour["placeholders"],
    }
    jsonschema.validate(as_hook_dict, _airflow_schema("customized_form_field_behaviours.schema.json"))


def test_entry_point_is_registered():
    eps = metadata.entry_points(group="apache_airflow_provider")
    ours = [ep for ep in eps if ep.value == "airflow_provider_cg:get_provider_info"]
    assert len(ours) == 1
    assert ours[0].load()()["package-name"] == "airflow-provider-cg"


@pytest.mark.airflow
def test_providers_manager_discovers_the_provider(airflow_env):
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_provider_cg.hooks.nats import NatsHook

    pm = ProvidersManager()
    assert pm.providers["airflow-provider-cg"].version == __version__
    hook = ProvidersManagerTaskRuntime().hooks["nats"]
    assert hook.hook_class_name == "airflow_provider_cg.hooks.nats.NatsHook"
    assert hook.connection_testable
    assert pm.field_behaviours["nats"]["relabeling"]["host"] == "Host(s)"
    assert pm.field_behaviours["nats"]["placeholders"]["extra__nats__servers"].startswith("nats://")
    widgets = pm.connection_form_widgets
    assert widgets["extra__nats__token"].is_sensitive
    assert not widgets["extra__nats__servers"].is_sensitive
    # The hook's own (Airflow 3.1) form data is the same as the provider info's.
    assert NatsHook.get_ui_field_behaviour()["relabeling"] == pm.field_behaviours["nats"]["relabeling"]


def test_the_providers_configuration_is_declared_and_listed(airflow_env, tmp_path):
    """``[nats_consumer_groups]`` as Airflow's own CLI lists it (``airflow config``): the
    sampler's interval with its default, description and example; a value set in the
    environment is what the page's sampler reads."""
    import os
    import subprocess
    import sys

    from airflow_provider_cg.ui.history import sample_seconds

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    airflow = [sys.executable, "-m", "airflow"]
    listed = subprocess.run([*airflow, "config", "list", "--section", "nats_consumer_groups", "--show-values",
                             "--include-descriptions", "--include-examples"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "backlog_sample_seconds = 60" in listed.stdout and "Example: backlog_sample_seconds = 15" in listed.stdout
    got = subprocess.run([*airflow, "config", "get-value", "nats_consumer_groups", "backlog_sample_seconds"],
                         env={**env, "AIRFLOW__NATS_CONSUMER_GROUPS__BACKLOG_SAMPLE_SECONDS": "15"},
                         capture_output=True, text=True, timeout=120)
    assert got.stdout.strip().splitlines()[-1] == "15", got.stderr[-2000:]
    assert sample_seconds() == 60.0
