"""Connection options, environment and every NATS auth mode, through the real ``cg`` process:
a right secret connects, a wrong one gets a distinct, secret-free error (exit 2), bad options
get exit 1 naming the option or variable, and nothing hangs."""

from __future__ import annotations

import socket
import time

import nkeys
import pytest

from airflow_provider_cg.core.tools.server import EmbeddedNatsServer, free_port
from tests.support.badinput import cg_process, report
from tests.support.nats_auth import Operator, make_tls, new_keypair

pytestmark = [pytest.mark.integration]

PASSWORD, TOKEN = "pa55-w0rd-s3cret-xyz", "t0ken-s3cret-0123456789"


@pytest.fixture(scope="module")
def auth(tmp_path_factory):
    """One nats-server per auth mode, with secrets made now."""
    d = tmp_path_factory.mktemp("auth")
    op = Operator.new()
    user = new_keypair(nkeys.PREFIX_BYTE_USER)
    tls = make_tls(d / "tls")
    tls_conf = f'cert_file: "{tls["server_cert"]}", key_file: "{tls["server_key"]}", timeout: 2'
    servers = {
        "user": EmbeddedNatsServer(d / "user", config_extra=f'authorization {{ user: alice, password: "{PASSWORD}" }}'),
        "token": EmbeddedNatsServer(d / "token", config_extra=f'authorization {{ token: "{TOKEN}" }}'),
        "nkey": EmbeddedNatsServer(d / "nkey", config_extra=f"authorization {{ users: [ {{ nkey: {user.public_key.decode()} }} ] }}"),
        "jwt": EmbeddedNatsServer(d / "jwt", config_extra=op.server_config()),
        "tls": EmbeddedNatsServer(d / "tls-srv", config_extra=f"tls {{ {tls_conf} }}"),
        "mtls": EmbeddedNatsServer(d / "mtls-srv", config_extra=f'tls {{ {tls_conf}, ca_file: "{tls["ca"]}", verify: true }}'),
    }
    for s in servers.values():
        s.start()
    files = {}

    def write(name: str, text: str) -> str:
        path = d / name
        path.write_text(text)
        path.chmod(0o600)
        files[name] = text
        return str(path)

    modes = {  # mode -> (server, right argv, wrong argv, secrets that must never show)
        "user": (servers["user"], ["--user", "alice", "--password-file", write("pw", PASSWORD)],
                 ["--user", "alice", "--password-file", write("pw-wrong", "not-the-password")], [PASSWORD, "not-the-password"]),
        "token": (servers["token"], ["--token-file", write("tok", TOKEN)],
                  ["--token-file", write("tok-wrong", "wrong-token-value-123")], [TOKEN, "wrong-token-value-123"]),
        "nkey": (servers["nkey"], ["--nkey", write("nk", user.seed.decode())],
                 ["--nkey", write("nk-wrong", new_keypair(nkeys.PREFIX_BYTE_USER).seed.decode())],
                 [user.seed.decode()[:20]]),
        "jwt": (servers["jwt"], ["--creds", write("creds", op.user_creds())],
                ["--creds", write("creds-wrong", op.user_creds(account=Operator.new().account))], ["SUA", "BEGIN NATS"]),
        "tls": (servers["tls"], ["--tlsca", str(tls["ca"])], ["--tlsca", str(tls["other_ca"])], []),
        "mtls": (servers["mtls"], ["--tlsca", str(tls["ca"]), "--tlscert", str(tls["client_cert"]),
                                   "--tlskey", str(tls["client_key"])], ["--tlsca", str(tls["ca"])], ["PRIVATE KEY"]),
    }
    yield modes, tls, d
    for s in servers.values():
        s.cleanup()


def _url(server, mode):
    return f"{'tls' if mode in ('tls', 'mtls') else 'nats'}://127.0.0.1:{server.port}"


def test_every_auth_mode_right_and_wrong_secret(auth):
    modes, _, _ = auth
    reasons = {"user": "authentication refused", "token": "authentication refused", "nkey": "authentication refused",
               "jwt": "authentication refused", "tls": "TLS verification", "mtls": "TLS verification"}
    failures = []
    for mode, (server, right, wrong, secrets) in modes.items():
        ok = cg_process("ls", "-s", _url(server, mode), "--timeout", "3", *right)
        if ok.rc != 0:
            failures.append(f"{mode} right secret: exit {ok.rc}: {ok.err.strip()[:200]}")
        started = time.monotonic()
        bad = cg_process("ls", "-s", _url(server, mode), "--timeout", "3", *wrong)
        failures += [f"{mode} wrong secret: {p}: {bad.err.strip()[:200]!r}" for p in bad.problems(2, "server", tuple(secrets))]
        if reasons[mode] not in bad.err:
            failures.append(f"{mode} wrong secret: does not say {reasons[mode]!r}: {bad.err.strip()[:200]!r}")
        if time.monotonic() - started > 12:
            failures.append(f"{mode} wrong secret: took {time.monotonic() - started:.0f}s")
    report(failures)


def test_unreachable_refused_and_silent_servers_are_told_apart_and_bounded(auth):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        failures = []
        for url, says in ((f"nats://127.0.0.1:{free_port()}", "connection refused"),
                          ("nats://no-such-host.invalid:4222", "unknown host"),
                          (f"nats://127.0.0.1:{silent.getsockname()[1]}", "timed out")):
            started = time.monotonic()
            a = cg_process("ls", "-s", url, "--timeout", "1")
            failures += [f"{url}: {p}: {a.err.strip()[:200]!r}" for p in a.problems(2, "server")]
            if says not in a.err:
                failures.append(f"{url}: does not say {says!r}: {a.err.strip()[:200]!r}")
            if time.monotonic() - started > 10:
                failures.append(f"{url}: took {time.monotonic() - started:.0f}s")
        report(failures)
    finally:
        silent.close()


def test_bad_connection_options_and_environment(auth):
    _, tls, d = auth
    binary = d / "binary"
    binary.write_bytes(b"\xff\xfe\x00\x01" * 10)
    empty = d / "empty"
    empty.write_text("")
    not_pem = d / "not.pem"
    not_pem.write_text("hello\n")
    json_list = d / "list.json"
    json_list.write_text("[1, 2]")
    not_json = d / "bad.json"
    not_json.write_text("{oops")
    closed = f"127.0.0.1:{free_port()}"
    cases = [  # (argv, env, exit, field)
        (["-s", "notaurl"], {}, 1, "server"),
        (["-s", "nats://127.0.0.1:99999"], {}, 1, "server"),
        (["-s", "http://127.0.0.1:4222"], {}, 1, "server"),
        (["-s", "nats://"], {}, 1, "server"),
        (["-s", "nats://:4222"], {}, 1, "server"),
        (["--timeout", "0"], {}, 1, "timeout"),
        (["--timeout", "-1"], {}, 1, "timeout"),
        (["--timeout", "nan"], {}, 1, "timeout"),
        (["--timeout", "1e9"], {}, 1, "timeout"),
        (["--timeout", "abc"], {}, 1, "timeout"),
        (["--tlsca", "/nonexistent/ca.pem"], {}, 1, "tlsca"),
        (["--tlsca", str(d)], {}, 1, "tlsca"),
        (["--tlsca", str(not_pem)], {}, 1, "tlsca"),
        (["--tlsca", str(binary)], {}, 1, "tlsca"),
        (["--tlscert", str(tls["client_cert"])], {}, 1, "tlscert"),
        (["--tlskey", str(tls["client_key"])], {}, 1, "tlskey"),
        (["--tlscert", str(not_pem), "--tlskey", str(tls["client_key"])], {}, 1, "tlscert"),
        (["--token-file", str(binary)], {}, 1, "token-file"),
        (["--token-file", str(empty)], {}, 1, "token-file"),
        (["--token-file", "/nonexistent"], {}, 1, "token-file"),
        (["--password-file", str(d)], {}, 1, "password-file"),
        (["--creds", str(not_pem)], {}, 1, "creds"),
        (["--nkey", str(not_pem)], {}, 1, "nkey"),
        ([], {"CG_NATS_CONFIG_FILE": str(json_list)}, 1, "CG_NATS_CONFIG_FILE"),
        ([], {"CG_NATS_CONFIG_FILE": str(not_json)}, 1, "CG_NATS_CONFIG_FILE"),
        ([], {"CG_NATS_CONFIG_FILE": "/nonexistent.json"}, 1, "CG_NATS_CONFIG_FILE"),
        ([], {"CG_NATS_TLS_CA": "/nonexistent"}, 1, "CG_NATS_TLS_CA"),
        ([], {"CG_NATS_CONNECT_TIMEOUT": "abc"}, 1, "CG_NATS_CONNECT_TIMEOUT"),
        ([], {"CG_NATS_SERVERS": "nats://u:p@"}, 1, "CG_NATS_SERVERS"),
        ([], {"CG_NATS_NKEY_SEED": "SUnotaseed"}, 1, "CG_NATS_NKEY_SEED"),
        ([], {"CG_NATS_SERVERS": f"nats://alice:{PASSWORD}@{closed}"}, 2, "server"),
        (["-s", f"nats://alice:{PASSWORD}@{closed}"], {}, 2, "server"),
        (["-s", f"nats://{TOKEN}@{closed}"], {}, 2, "server"),
    ]
    failures = []
    for argv, env, code, field in cases:
        a = cg_process("ls", *argv, *([] if any(x in argv for x in ("-s",)) or "CG_NATS_SERVERS" in env
                                       else ["-s", f"nats://{closed}"]), "--timeout", "2" if "--timeout" not in argv
                       else argv[argv.index("--timeout") + 1], env=env)
        failures += [f"{argv} {env}: {p}: {a.err.strip()[:200]!r}"
                     for p in a.problems(code, field, (PASSWORD, TOKEN, "\xff"))]
    report(failures)
