"""NATS servers with authentication for tests: every auth mode nats-server has, with secrets
made at test time (nkeys, operator/account/user JWTs signed here, a throwaway CA and
certificates from ``openssl``). Nothing here is used by the package itself."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys


def new_keypair(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey pair (``nkeys.PREFIX_BYTE_USER`` / ``_ACCOUNT`` / ``_OPERATOR``)."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict) -> str:
    """A nats JWT (v2 claims) for ``subject`` signed by ``issuer``."""
    header = {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = {"jti": "", "iat": int(time.time()), "iss": issuer.public_key.decode(), "name": name,
              "sub": subject, "nats": {**nats, "version": 2}}
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    claims["jti"] = base64.b32encode(hashlib.new("sha512_256", body).digest()).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def creds_file_text(user_jwt: str, user_seed: str) -> str:
    """A ``.creds`` file as ``nsc`` writes it."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


@dataclass
class Operator:
    """Decentralized (JWT) auth: an operator, one JetStream-enabled account, helpers for users."""

    operator: nkeys.KeyPair
    account: nkeys.KeyPair
    system: nkeys.KeyPair

    @classmethod
    def new(cls) -> Operator:
        return cls(new_keypair(nkeys.PREFIX_BYTE_OPERATOR), new_keypair(nkeys.PREFIX_BYTE_ACCOUNT),
                   new_keypair(nkeys.PREFIX_BYTE_ACCOUNT))

    def server_config(self) -> str:
        op = self.operator.public_key.decode()
        acc, sys_acc = self.account.public_key.decode(), self.system.public_key.decode()
        unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                     "conn": -1, "leaf": -1}
        js = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
        op_jwt = sign_jwt(self.operator, op, "cg-test-operator", {"type": "operator", "system_account": sys_acc})
        acc_jwt = sign_jwt(self.operator, acc, "CG", {"type": "account", "limits": {**unlimited, **js}})
        sys_jwt = sign_jwt(self.operator, sys_acc, "SYS", {"type": "account", "limits": unlimited})
        return (f"operator: {op_jwt}\nsystem_account: {sys_acc}\nresolver: MEMORY\n"
                f"resolver_preload: {{\n  {acc}: {acc_jwt}\n  {sys_acc}: {sys_jwt}\n}}\n")

    def user_creds(self, name: str = "cg-user", account: nkeys.KeyPair | None = None) -> str:
        """A creds file for a new user of the account (or of ``account``: e.g. an unknown one)."""
        user = new_keypair(nkeys.PREFIX_BYTE_USER)
        jwt = sign_jwt(account or self.account, user.public_key.decode(), name,
                       {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})
        return creds_file_text(jwt, user.seed.decode())


def make_tls(dirpath: Path, *, client: bool = True) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and (``client``) a client certificate,
    all made with ``openssl``; returns their paths (``ca``, ``server_cert``, ``server_key``,
    ``client_cert``, ``client_key``, and ``other_ca``: a CA that signed none of them)."""
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other_ca"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{ca}-key.pem", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=cg-test-{ca}")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    names = ["server"] + (["client"] if client else [])
    for who in names:
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{who}-key.pem", "-out", f"{who}.csr", "-subj", f"/CN=cg-test-{who}")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-out", f"{who}.pem", "-days", "2", "-extfile", "san.ext")
    out = {"ca": d / "ca.pem", "other_ca": d / "other_ca.pem", "server_cert": d / "server.pem",
           "server_key": d / "server-key.pem"}
    if client:
        out.update(client_cert=d / "client.pem", client_key=d / "client-key.pem")
    return out
