"""NATS connection settings: servers and auth, from code, the environment or a JSON file.

Secrets (password, token, nkey seed, creds, TLS key) are held in memory only, are never
part of ``repr()`` or ``redacted()``, and reach nats-py as values, never as command-line
arguments. A Spark driver gets them through environment variables (``CG_NATS_*``) or a
JSON file named by ``CG_NATS_CONFIG_FILE``.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "CG_NATS_"
ENV_CONFIG_FILE = "CG_NATS_CONFIG_FILE"
SECRET_FIELDS = frozenset({"password", "token", "nkey_seed", "creds", "tls_key"})
DEFAULT_SERVER = "nats://127.0.0.1:4222"


def _is_pem(value: str) -> bool:
    return value.lstrip().startswith("-----BEGIN")


_PEM_BLOCK = re.compile(r"-----\s*BEGIN ([A-Z0-9 ]+?)\s*-----(.*?)-----\s*END \1\s*-----", re.S)
_CREDS_JWT = re.compile(r"-----BEGIN NATS USER JWT-----(.*?)------END NATS USER JWT------", re.S)
_SEED = re.compile(r"S[UAO][A-Z2-7]{56}")


def restore_pem(text: str) -> str:
    """PEM text whose line breaks a single-line form field removed (or turned into spaces),
    rebuilt block by block (base64 bodies rewrapped at 64 columns). Text with its line breaks,
    or without PEM blocks (a file path), is returned as it is."""
    if "\n" in text.strip():
        return text
    blocks = []
    for m in _PEM_BLOCK.finditer(text):
        label, body = m.group(1).strip(), "".join(m.group(2).split())
        if ":" in body:  # RFC 1421 headers (encrypted legacy keys): leave such text alone
            return text
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        blocks.append("\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"]))
    return "\n".join(blocks) + "\n" if blocks else text


def restore_creds(text: str) -> str:
    """A ``.creds`` file's content, also when a single-line form field removed its line
    breaks: the user JWT and the seed are taken out and written back in nsc's layout."""
    if "\n" in text.strip():
        return text
    jwt = _CREDS_JWT.search(text)
    seed = _SEED.search(_CREDS_JWT.sub("", text))
    if not jwt or not seed:
        return text
    return (f"-----BEGIN NATS USER JWT-----\n{''.join(jwt.group(1).split())}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed.group(0)}\n------END USER NKEY SEED------\n")


def _content_or_file(field: str, value: str, marker: str) -> str:
    """``value`` itself, or the content of the file it names (a path on the workers, e.g. a
    mounted secret): a form field can hold either."""
    if marker in value or "\n" in value.strip():
        return value
    path = os.path.expanduser(value.strip())
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{field}: cannot read the file it names ({type(e).__name__})") from None
    return value


@dataclass
class NatsConnectionSettings:
    """Where a NATS server is and how to authenticate to it.

    ``tls_ca``, ``tls_cert`` and ``tls_key`` take a file path or the PEM text itself;
    ``creds`` and ``nkey_seed`` the file content or a file path. Pasted text whose line
    breaks were lost (a single-line form field) is restored (PEM blocks, ``.creds`` layout).
    """

    servers: list[str] = field(default_factory=lambda: [DEFAULT_SERVER])
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed: str | None = field(default=None, repr=False)
    creds: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = field(default=None, repr=False)
    name: str | None = None
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.servers, str):
            self.servers = [s.strip() for s in self.servers.split(",") if s.strip()]
        if not self.servers:
            raise ValueError("servers: at least one NATS server URL is required")
        for url in self.servers:
            if "://" not in url:
                raise ValueError(f"servers: {url!r} is not a URL (expected nats://host:port)")
        if self.creds:
            self.creds = restore_creds(_content_or_file("creds", self.creds, "BEGIN NATS USER JWT"))
        if self.nkey_seed:
            seed = _content_or_file("nkey_seed", self.nkey_seed, "SU").strip()
            self.nkey_seed = m.group(0) if (m := _SEED.search(seed)) else seed
        for name in ("tls_ca", "tls_cert", "tls_key"):
            value = getattr(self, name)
            if value and "BEGIN" in value:
                setattr(self, name, restore_pem(value))

    # --- conversions -------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> NatsConnectionSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"connection settings: unknown field(s) {', '.join(unknown)}")
        kwargs = {k: v for k, v in values.items() if v not in (None, "")}
        if "connect_timeout" in kwargs:
            kwargs["connect_timeout"] = float(kwargs["connect_timeout"])
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NatsConnectionSettings:
        """Read ``CG_NATS_CONFIG_FILE`` (JSON) if set, then let ``CG_NATS_<FIELD>`` override."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        path = environ.get(ENV_CONFIG_FILE)
        if path:
            with open(path, encoding="utf-8") as f:
                values.update(json.load(f))
        for f in fields(cls):
            v = environ.get(ENV_PREFIX + f.name.upper())
            if v:
                values[f.name] = v
        return cls.from_mapping(values)

    def to_dict(self, include_secrets: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name in SECRET_FIELDS and not include_secrets):
                continue
            out[f.name] = v
        return out

    def to_env(self) -> dict[str, str]:
        """Environment variables that ``from_env`` reads back (secrets included)."""
        env = {}
        for k, v in self.to_dict().items():
            env[ENV_PREFIX + k.upper()] = ",".join(v) if isinstance(v, list) else str(v)
        return env

    def redacted(self) -> dict[str, Any]:
        """The settings with every secret replaced by ``***`` (safe to log)."""
        out = self.to_dict(include_secrets=False)
        for name in SECRET_FIELDS:
            if getattr(self, name):
                out[name] = "***"
        return out

    # --- connecting ---------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.tls_ca:
            if _is_pem(self.tls_ca):
                ctx.load_verify_locations(cadata=self.tls_ca)
            else:
                ctx.load_verify_locations(cafile=self.tls_ca)
        if self.tls_cert:
            if _is_pem(self.tls_cert) or (self.tls_key and _is_pem(self.tls_key)):
                # ssl only loads a chain from files: write them to a private temp dir, load, remove.
                with tempfile.TemporaryDirectory(prefix="cg-tls-") as d:
                    cert = self.tls_cert
                    if _is_pem(cert):
                        cert = os.path.join(d, "cert.pem")
                        with open(os.open(cert, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                            f.write(self.tls_cert)
                    key = self.tls_key
                    if key and _is_pem(key):
                        key = os.path.join(d, "key.pem")
                        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                            f.write(self.tls_key or "")
                    ctx.load_cert_chain(cert, key)
            else:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        from nats.aio.client import RawCredentials

        opts: dict[str, Any] = {
            "servers": list(self.servers),
            "connect_timeout": self.connect_timeout,
            "allow_reconnect": True,
            # nats-py uses one limit for the first connect and for reconnects: bound the first
            # (see connect()), then reconnect without limit once connected.
            "max_reconnect_attempts": 2,
            "reconnect_time_wait": 0.5,
        }
        if self.name:
            opts["name"] = self.name
        if self.user:
            opts["user"] = self.user
        if self.password:
            opts["password"] = self.password
        if self.token:
            opts["token"] = self.token
        if self.nkey_seed:
            opts["nkeys_seed_str"] = self.nkey_seed
        if self.creds:
            opts["user_credentials"] = RawCredentials(self.creds)
        tls = self._tls_context()
        if tls is not None:
            opts["tls"] = tls
        return opts

    async def connect(self, **overrides: Any):
        """Open a nats-py connection. Errors never carry secrets."""
        import nats

        opts = self.connect_options()
        opts.update(overrides)

        async def _quiet(_e: Exception) -> None:  # nats-py logs every reconnect error otherwise
            return None

        opts.setdefault("error_cb", _quiet)
        try:
            nc = await nats.connect(**opts)
        except Exception as e:  # re-raise without the options (which hold secrets)
            raise ConnectionError(
                f"cannot connect to NATS at {', '.join(self.servers)}: {type(e).__name__}: {e}"
            ) from None
        nc.options["max_reconnect_attempts"] = overrides.get("max_reconnect_attempts", -1)
        return nc
