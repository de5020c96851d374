"""NatsHook against real Airflow connections (AIRFLOW_CONN_* env vars) and a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_cg.core.tools.server import free_port

pytest_plugins = ["tests.airflow_conftest"]
pytestmark = [pytest.mark.airflow, pytest.mark.integration]

PASSWORD = "s3cret-pa55word-xyz"
TOKEN = "tok-0123456789abcdef"
CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJBQkNERUZHSElKS0wifQ.c2lnbmF0dXJl
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.

-----BEGIN USER NKEY SEED-----
SUAGMJH5XLGZKQQWAWKRZJIGMOU4HPFUYLXJMXOO5NLFEO2OOQJ5LPRDPM
------END USER NKEY SEED------
"""


def test_settings_from_connection_fields(airflow_env):
    from airflow_provider_cg.hooks.nats import NatsHook

    airflow_env.add_connection(
        "nats_fields",
        "nats",
        host="n1, n2:4223,[::1]",
        port=4222,
        schema="tls",
        login="alice",
        password=PASSWORD,
        extra={"token": TOKEN, "name": "airflow", "connect_timeout": "2.5", "extra__nats__creds": CREDS},
    )
    s = NatsHook(nats_conn_id="nats_fields").get_settings()
    assert s.servers == ["tls://n1:4222", "tls://n2:4223", "tls://[::1]:4222"]
    assert (s.user, s.password, s.token, s.name, s.creds) == ("alice", PASSWORD, TOKEN, "airflow", CREDS)
    assert s.connect_timeout == 2.5


def test_servers_extra_replaces_host_and_defaults(airflow_env):
    from airflow_provider_cg.hooks.nats import NatsHook

    airflow_env.add_connection(
        "nats_servers", "nats", host="ignored", extra={"servers": "nats://a:1, nats://b:2", "unknown": 1}
    )
    assert NatsHook(nats_conn_id="nats_servers").get_settings().servers == ["nats://a:1", "nats://b:2"]

    airflow_env.add_connection("nats_empty", "nats")
    assert NatsHook(nats_conn_id="nats_empty").get_settings().servers == ["nats://127.0.0.1:4222"]


def test_secrets_are_registered_with_the_masker(airflow_env):
    from airflow.sdk.log import redact

    from airflow_provider_cg.hooks.nats import NatsHook

    seed = "SUAK5P2JYKQ4VNLVGU7TKHQGVNSWWTLSNG3LVCOLEFBGNNTSQ7M5OQRA6A"
    airflow_env.add_connection(
        "nats_masked", "nats", host="h", extra={"nkey_seed": seed, "creds": CREDS, "token": TOKEN}
    )
    NatsHook(nats_conn_id="nats_masked").get_settings()
    line = f"seed={seed} token={TOKEN} creds-seed=SUAGMJH5XLGZKQQWAWKRZJIGMOU4HPFUYLXJMXOO5NLFEO2OOQJ5LPRDPM"
    redacted = redact(line)
    assert seed not in redacted and TOKEN not in redacted and "SUAGMJH5" not in redacted
    assert "NKEY Seed printed below" in redact(CREDS.splitlines()[5])  # prose is not masked


def test_url_credentials_are_secrets_too(airflow_env):
    """``nats://user:password@host`` / ``nats://token@host`` in the servers extra or the host:
    taken out of the URL, registered with the masker, never in the settings' servers."""
    from airflow.sdk.log import redact

    from airflow_provider_cg.hooks.nats import NatsHook

    url_pw, url_token = "url-pa55word-abcdef", "url-t0ken-abcdef0123"
    airflow_env.add_connection("nats_url_pw", "nats", extra={"servers": f"nats://bob:{url_pw}@h1:4222,nats://h2:4222"})
    airflow_env.add_connection("nats_url_tok", "nats", extra={"servers": f"tls://{url_token}@h3:4443"})
    s1 = NatsHook(nats_conn_id="nats_url_pw").get_settings()
    s2 = NatsHook(nats_conn_id="nats_url_tok").get_settings()
    assert s1.servers == ["nats://h1:4222", "nats://h2:4222"] and (s1.user, s1.password) == ("bob", url_pw)
    assert s2.servers == ["tls://h3:4443"] and s2.token == url_token
    line = redact(f"connecting with {url_pw} and {url_token}")
    assert url_pw not in line and url_token not in line
    assert url_pw not in repr(s1) and url_token not in repr(s2)


def test_test_connection_true_against_the_real_server(airflow_env, nats_conn_id):
    from airflow_provider_cg.hooks.nats import NatsHook

    ok, message = NatsHook(nats_conn_id=nats_conn_id).test_connection()
    assert ok, message
    assert "JetStream account: 0 streams" in message


def test_test_connection_false_with_a_clean_message_on_a_closed_port(airflow_env):
    from airflow_provider_cg.hooks.nats import NatsHook

    port = free_port()
    airflow_env.add_connection(
        "nats_closed",
        "nats",
        host="127.0.0.1",
        port=port,
        login="bob",
        password=PASSWORD,
        extra={"token": TOKEN, "connect_timeout": 1},
    )
    ok, message = NatsHook(nats_conn_id="nats_closed").test_connection()
    assert not ok
    assert f"127.0.0.1:{port}" in message
    assert PASSWORD not in message and TOKEN not in message
    assert "Traceback" not in message and "\n" not in message


def test_test_connection_never_echoes_url_credentials(airflow_env):
    from airflow_provider_cg.hooks.nats import NatsHook

    airflow_env.add_connection(
        "nats_url_creds",
        "nats",
        extra={"servers": f"nats://bob:{PASSWORD}@127.0.0.1:{free_port()}", "connect_timeout": 1},
    )
    ok, message = NatsHook(nats_conn_id="nats_url_creds").test_connection()
    assert not ok
    assert PASSWORD not in message and "bob" not in message


def test_run_opens_and_closes_a_connection(airflow_env, nats_conn_id):
    from airflow_provider_cg.hooks.nats import NatsHook

    seen = []

    async def publish(nc):
        seen.append(nc)
        await nc.jetstream().add_stream(name="HOOK", subjects=["hook.>"])
        ack = await nc.jetstream().publish("hook.a", b"1")
        return ack.seq

    hook = NatsHook(nats_conn_id=nats_conn_id)
    assert hook.run(publish) == 1
    assert seen[0].is_closed

    async def fail(nc):
        seen.append(nc)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        hook.run(fail)
    assert seen[1].is_closed


async def test_run_refuses_a_running_loop_and_aclient_works(airflow_env, nats_conn_id):
    from airflow_provider_cg.hooks.nats import NatsHook

    hook = NatsHook(nats_conn_id=nats_conn_id)

    async def noop(nc):
        return None

    with pytest.raises(RuntimeError, match="aclient"):
        hook.run(noop)

    async with hook.aclient() as nc:
        await nc.flush()
        assert nc.is_connected
    assert nc.is_closed

    nc = await NatsHook(nats_conn_id=nats_conn_id).aconnect()
    try:
        reply = await asyncio.wait_for(nc.request("$JS.API.INFO", b""), 5)
        assert b"streams" in reply.data
    finally:
        await nc.close()
