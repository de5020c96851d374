"""The `nats` connection form as users fill it in: multi-line secrets pasted into Airflow's
one-line password fields (which drop line breaks), PEM text in its text areas, or paths to
files on the workers; against real nats-servers with JWT (operator) auth and mutual TLS."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.tools.server import EmbeddedNatsServer
from tests.support.nats_auth import Operator, make_tls

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def _as_password_input(text: str) -> str:
    """What an HTML password input keeps of pasted text: its value sanitization strips line breaks."""
    return text.replace("\r", "").replace("\n", "")


@pytest.fixture
def operator_server(tmp_path):
    op = Operator.new()
    server = EmbeddedNatsServer(tmp_path / "jwt", config_extra=op.server_config()).start()
    yield op, server
    server.cleanup()


def test_a_creds_file_pasted_into_the_form_authenticates(airflow_env, operator_server, tmp_path):
    from airflow_provider_cg.hooks.nats import NatsHook

    op, server = operator_server
    creds = op.user_creds()
    path = tmp_path / "user.creds"
    path.write_text(creds)
    for conn_id, value in (("pasted", _as_password_input(creds)), ("intact", creds), ("path", str(path))):
        airflow_env.add_connection(f"nats_{conn_id}", "nats", host="127.0.0.1", port=server.port,
                                   extra={"creds": value, "connect_timeout": 3})
        ok, message = NatsHook(nats_conn_id=f"nats_{conn_id}").test_connection()
        assert ok, (conn_id, message)
    # a user of an account the server does not know: refused, and nothing of the creds shown
    stranger = op.user_creds(account=Operator.new().account)
    airflow_env.add_connection("nats_stranger", "nats", host="127.0.0.1", port=server.port,
                               extra={"creds": _as_password_input(stranger), "connect_timeout": 2})
    ok, message = NatsHook(nats_conn_id="nats_stranger").test_connection()
    assert not ok
    jwt = stranger.split("\n")[1]
    assert jwt[:20] not in message and "SU" not in message.replace("SUCCESS", "")


def test_mutual_tls_with_pem_text_from_the_form(airflow_env, tmp_path):
    from airflow_provider_cg.hooks.nats import NatsHook

    tls = make_tls(tmp_path / "tls")
    conf = (f'tls {{ cert_file: "{tls["server_cert"]}", key_file: "{tls["server_key"]}", '
            f'ca_file: "{tls["ca"]}", verify: true, timeout: 2 }}')
    server = EmbeddedNatsServer(tmp_path / "mtls", config_extra=conf).start()
    try:
        airflow_env.add_connection("nats_mtls", "nats", host="127.0.0.1", port=server.port, schema="tls", extra={
            "tls_ca": tls["ca"].read_text(),  # a text area keeps the lines
            "tls_cert": tls["client_cert"].read_text(),
            "tls_key": _as_password_input(tls["client_key"].read_text()),  # the one-line secret field
            "connect_timeout": 3,
        })
        ok, message = NatsHook(nats_conn_id="nats_mtls").test_connection()
        assert ok, message
        assert "PRIVATE KEY" not in message
    finally:
        server.cleanup()


def test_form_fields_render_as_intended():
    """What the API gives the connection form: secrets as password fields (sensitive), PEM
    fields as text areas, the timeout as a number, plain text inputs (no "examples": the new UI
    makes those an autocomplete) with the example in the description shown under them."""
    from airflow.providers_manager import ProvidersManager

    widgets = ProvidersManager().connection_form_widgets
    schema = {k.removeprefix("extra__nats__"): w.field["schema"] for k, w in widgets.items()
              if k.startswith("extra__nats__")}
    sensitive = {k.removeprefix("extra__nats__") for k, w in widgets.items()
                 if k.startswith("extra__nats__") and w.is_sensitive}
    assert sensitive == {"token", "nkey_seed", "creds", "tls_key"}
    assert schema["tls_ca"]["format"] == schema["tls_cert"]["format"] == "multiline"
    assert [t for t in schema["connect_timeout"]["type"] if t != "null"] == ["integer"]
    assert not any("examples" in s for s in schema.values())
    descriptions = {k.removeprefix("extra__nats__"): w.field.get("description") for k, w in widgets.items()
                    if k.startswith("extra__nats__")}
    assert "Example: nats://nats-1:4222" in descriptions["servers"] and "Example:" in descriptions["name"]
    assert schema["connect_timeout"]["title"] == "Connect timeout (s)"
    behaviour = ProvidersManager().field_behaviours["nats"]
    assert behaviour["placeholders"]["host"] and behaviour["relabeling"]["login"] == "User"
