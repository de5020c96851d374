"""NATS connection settings: servers and auth, from code, the environment or a JSON file.

Secrets (password, token, nkey seed, creds, TLS key) are held in memory only, are never
part of ``repr()`` or ``redacted()``, and reach nats-py as values, never as command-line
arguments. A Spark driver gets them through environment variables (``CG_NATS_*``) or a
JSON file named by ``CG_NATS_CONFIG_FILE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import socket
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from airflow_provider_cg.core.errors import NatsConnectError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from nats.aio.client import Client as NATS

ENV_PREFIX = "CG_NATS_"
ENV_CONFIG_FILE = "CG_NATS_CONFIG_FILE"
SECRET_FIELDS = frozenset({"password", "token", "nkey_seed", "creds", "tls_key"})
DEFAULT_SERVER = "nats://127.0.0.1:4222"


URL_SCHEMES = ("nats", "tls", "ws", "wss")
MAX_CONNECT_TIMEOUT = 600.0


def _safe_url(url: str) -> str:
    """``url`` with anything before an ``@`` (credentials) replaced, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***@" + url.rsplit("@", 1)[1] if "@" in url else url
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


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


def _readable(field: str, path: str) -> str:
    if not os.path.isfile(path):
        raise ValueError(f"{field}: {path!r} is neither PEM text nor an existing file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{field}: cannot read {path!r} (permission denied)")
    return path


@contextlib.contextmanager
def _tls_errors(field: str, what: str) -> Iterator[None]:
    try:
        yield
    except ValueError:
        raise
    except (ssl.SSLError, OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        raise ValueError(f"{field}: not {what} ({reason})") from None


def _content_or_file(field: str, value: str, is_content: bool) -> str:
    """``value`` itself, or the content of the file it names (a path on the workers, e.g. a
    mounted secret): a form field can hold either."""
    if is_content or "\n" in value.strip():
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
        if not isinstance(self.servers, list | tuple):
            raise ValueError(f"servers: must be a list of URLs or one comma-separated string "
                             f"(got {type(self.servers).__name__})")
        if not self.servers:
            raise ValueError("servers: at least one NATS server URL is required")
        self.servers = [self._take_url_credentials(url) for url in self.servers]
        if isinstance(self.connect_timeout, bool) or not isinstance(self.connect_timeout, int | float):
            raise ValueError("connect_timeout: must be a number of seconds")
        if not (0 < self.connect_timeout <= MAX_CONNECT_TIMEOUT):
            raise ValueError(f"connect_timeout: must be > 0 and at most {MAX_CONNECT_TIMEOUT} seconds")
        for name in ("user", "password", "token", "nkey_seed", "creds", "tls_ca", "tls_cert", "tls_key", "name"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: must be a string")
        if self.creds:
            self.creds = restore_creds(_content_or_file("creds", self.creds, "BEGIN NATS USER JWT" in self.creds))
            if not (_CREDS_JWT.search(self.creds.replace("\n", "")) and _SEED.search(self.creds)):
                raise ValueError("creds: not a NATS credentials file (a user JWT block and an nkey seed)")
        if self.nkey_seed:
            seed = _content_or_file("nkey_seed", self.nkey_seed, bool(_SEED.search(self.nkey_seed))).strip()
            m = _SEED.search(seed)
            if not m:
                raise ValueError("nkey_seed: not an nkey seed (58 characters starting with SU)")
            self.nkey_seed = m.group(0)
        for name in ("tls_ca", "tls_cert", "tls_key"):
            value = getattr(self, name)
            if value and "BEGIN" in value:
                setattr(self, name, restore_pem(value))
        self._tls_context()  # bad PEM or files fail here, naming the field, not at connect time

    def _take_url_credentials(self, url: str) -> str:
        """``url`` without credentials; ``user:password@`` or ``token@`` in it become settings
        (secrets: never echoed, and registered with Airflow's masker by the hook)."""
        if not isinstance(url, str) or not url.strip():
            raise ValueError("servers: a server URL must be a non-empty string")
        url = url.strip()
        if "://" not in url:
            raise ValueError(f"servers: {_safe_url(url)!r} is not a URL (expected nats://host:port)")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(f"servers: {_safe_url(url)!r} has an invalid port (1-65535)") from None
        if parts.scheme not in URL_SCHEMES:
            raise ValueError(f"servers: {_safe_url(url)!r}: the scheme must be one of {', '.join(URL_SCHEMES)}")
        if not parts.hostname:
            raise ValueError(f"servers: {_safe_url(url)!r} has no host")
        if parts.username is not None or parts.password is not None:
            user, password = unquote(parts.username or ""), unquote(parts.password or "")
            if password:
                if (self.user and self.user != user) or (self.password and self.password != password):
                    raise ValueError("servers: the URL's user and password differ from the connection's")
                self.user, self.password = user, password
            elif user:
                if self.token and self.token != user:
                    raise ValueError("servers: the URL's token differs from the connection's")
                self.token = user
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return f"{parts.scheme}://{host}" + (f":{port}" if port else "")

    # --- conversions -------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> NatsConnectionSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"connection settings: unknown field(s) {', '.join(unknown)}")
        kwargs = {k: v for k, v in values.items() if v is not None and not (isinstance(v, str) and v == "")}
        if "connect_timeout" in kwargs:
            try:
                timeout = float(kwargs["connect_timeout"])
            except (TypeError, ValueError):
                raise ValueError("connect_timeout: must be a number of seconds") from None
            if not math.isfinite(timeout):
                raise ValueError("connect_timeout: must be a finite number of seconds")
            kwargs["connect_timeout"] = timeout
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NatsConnectionSettings:
        """Read ``CG_NATS_CONFIG_FILE`` (JSON) if set, then let ``CG_NATS_<FIELD>`` override."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        path = environ.get(ENV_CONFIG_FILE)
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    loaded = json.load(fh)
            except OSError as e:
                raise ValueError(f"{ENV_CONFIG_FILE}: cannot read the file it names ({e.strerror})") from None
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ValueError(f"{ENV_CONFIG_FILE}: the file it names is not JSON") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"{ENV_CONFIG_FILE}: the file must hold a JSON object of connection settings")
            values.update(loaded)
        from_file = set(values)
        for f in fields(cls):
            v = environ.get(ENV_PREFIX + f.name.upper())
            if v:
                values[f.name] = v
                from_file.discard(f.name)
        try:
            return cls.from_mapping(values)
        except ValueError as e:  # a value the file gave: name the file and its key
            key, sep, rule = str(e).partition(": ")
            if sep and key in from_file:
                raise ValueError(f"{ENV_CONFIG_FILE}: {key}: {rule}") from None
            raise

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

    def portable(self) -> NatsConnectionSettings:
        """These settings with TLS files replaced by their PEM text (creds and nkey seeds are
        held as content already): usable where the files are not, e.g. on Spark executors."""
        out = NatsConnectionSettings(**self.to_dict())
        for name in ("tls_ca", "tls_cert", "tls_key"):
            value = getattr(out, name)
            if value and not _is_pem(value):
                with open(os.path.expanduser(value), encoding="utf-8") as f:
                    setattr(out, name, f.read())
        return out

    def redacted(self) -> dict[str, Any]:
        """The settings with every secret replaced by ``***`` (safe to log)."""
        out = self.to_dict(include_secrets=False)
        for name in SECRET_FIELDS:
            if getattr(self, name):
                out[name] = "***"
        return out

    # --- connecting ---------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext | None:
        """The client's TLS context, or ``ValueError`` naming the field whose PEM or file is bad."""
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        if self.tls_key and not self.tls_cert:
            raise ValueError("tls_key: a client key needs its client certificate (tls_cert)")
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.tls_ca:
            with _tls_errors("tls_ca", "a PEM CA certificate"):
                if _is_pem(self.tls_ca):
                    ctx.load_verify_locations(cadata=self.tls_ca)
                else:
                    ctx.load_verify_locations(cafile=_readable("tls_ca", self.tls_ca))
        if self.tls_cert:
            with _tls_errors("tls_cert", "a PEM client certificate with its key (tls_key)"):
                # ssl only loads a chain from files: write PEM text to a private temp dir, load, remove.
                with tempfile.TemporaryDirectory(prefix="cg-tls-") as d:
                    cert = self._pem_file(d, "cert.pem", self.tls_cert) if _is_pem(self.tls_cert) else \
                        _readable("tls_cert", self.tls_cert)
                    key = self.tls_key
                    if key:
                        key = self._pem_file(d, "key.pem", key) if _is_pem(key) else _readable("tls_key", key)
                    ctx.load_cert_chain(cert, key)
        return ctx

    @staticmethod
    def _pem_file(d: str, name: str, text: str) -> str:
        path = os.path.join(d, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(text)
        return path

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

    async def connect(self, **overrides: Any) -> NATS:
        """Open a nats-py connection, or raise :class:`NatsConnectError` saying why not
        (authentication, TLS, unreachable, timeout) within a bounded time. Errors never carry
        secrets."""
        from nats.aio.client import Client

        opts = self.connect_options()
        opts.update(overrides)
        seen: list[BaseException] = []
        connecting = [True]

        async def _record(e: Exception) -> None:  # nats-py reports each failed attempt here
            if connecting[0]:  # later (reconnect) errors are not kept: nats-py retries them itself
                seen.append(e)

        opts["error_cb"] = _record
        attempts = max(1, int(opts.get("max_reconnect_attempts") or 1) + 1)
        # nats-py bounds the INFO wait but not every step (a TLS handshake with a server that
        # never answers it): bound the whole first connect.
        limit = attempts * len(self.servers) * (self.connect_timeout + opts.get("reconnect_time_wait", 0.5)) + 1
        nc = Client()
        where = ", ".join(self.servers)
        attempt = asyncio.ensure_future(nc.connect(**opts))
        deadline = asyncio.get_running_loop().time() + limit
        try:
            while True:
                done, _ = await asyncio.wait({attempt}, timeout=0.05)
                if done:
                    attempt.result()
                    break
                # refused credentials or certificates do not get better on the next attempt
                verdict = classify_connect_error(seen, where) if seen else None
                if verdict is not None and verdict.reason in ("auth", "tls"):
                    raise verdict
                if asyncio.get_running_loop().time() > deadline:
                    raise classify_connect_error(seen, where, timed_out=True)
        except NatsConnectError:
            attempt.cancel()
            await _close_quietly(nc)
            raise
        except asyncio.CancelledError:
            attempt.cancel()
            await _close_quietly(nc)
            raise
        except Exception as e:
            await _close_quietly(nc)
            raise classify_connect_error([*seen, e], where) from None
        connecting[0] = False
        nc.options["max_reconnect_attempts"] = overrides.get("max_reconnect_attempts", -1)
        return nc


async def _close_quietly(nc: NATS) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 2)


def classify_connect_error(errors: list[BaseException], where: str, *, timed_out: bool = False) -> NatsConnectError:
    """The most telling reason among the errors of a failed connect (authentication beats
    TLS beats unreachable beats timeout: the later attempts often only time out)."""
    import nats.errors

    reasons: dict[str, str] = {}
    for e in errors:
        text = str(e).lower()
        if isinstance(e, nats.errors.AuthorizationError) or "authorization" in text or "authentication" in text:
            reasons.setdefault("auth", "authorization violation")
        elif isinstance(e, ssl.SSLCertVerificationError):
            reasons.setdefault("tls", f"certificate verify failed: {e.verify_message}")
        elif isinstance(e, ssl.SSLError) or "tls" in text or "ssl" in text:
            reasons.setdefault("tls", type(e).__name__)
        elif isinstance(e, ConnectionRefusedError):
            reasons.setdefault("unreachable", "connection refused")
        elif isinstance(e, socket.gaierror):
            reasons.setdefault("unreachable", "unknown host")
        elif isinstance(e, ConnectionResetError | BrokenPipeError) and "tls" not in reasons:
            reasons.setdefault("reset", "connection reset")
        elif isinstance(e, OSError) and not isinstance(e, TimeoutError):
            reasons.setdefault("unreachable", e.strerror or type(e).__name__)
        elif isinstance(e, asyncio.TimeoutError | nats.errors.TimeoutError | TimeoutError):
            reasons.setdefault("timeout", "no answer within the connect timeout")
    if "reset" in reasons:  # a server that drops the connection during the TLS handshake (mTLS)
        reasons.setdefault("tls", "connection reset during the handshake (client certificate required?)")
    for reason in ("auth", "tls", "unreachable", "timeout"):
        if reason in reasons:
            return NatsConnectError(reason, where, reasons[reason])
    return NatsConnectError("timeout" if timed_out else "unreachable", where)
