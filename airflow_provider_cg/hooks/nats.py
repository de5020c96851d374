"""NatsHook: an Airflow connection of type ``nats`` turned into core ``NatsConnectionSettings``.

Connection fields: Host (one host or several, comma-separated, each optionally ``:port``),
Port, URL scheme (the Schema field: ``nats``, ``tls``, ``ws``, ``wss``), User/Password; or
the extra ``servers`` (comma-separated URLs), which replaces Host/Port/Scheme. Other extras:
``token``, ``nkey_seed``, ``creds`` (file content), ``tls_ca``, ``tls_cert``, ``tls_key``
(PEM text or a path), ``name``, ``connect_timeout``. Example::

    AIRFLOW_CONN_NATS_DEFAULT='{"conn_type": "nats", "host": "127.0.0.1", "port": 4222}'

Two ways to talk to NATS: ``run(async_fn)`` for sync code (operators) opens a connection on
a fresh event loop in the calling thread; ``aconnect()`` / ``aclient()`` for async code
(triggers), which fetch the Airflow connection without blocking the loop. Secret values are
registered with Airflow's secrets masker as soon as the hook reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_cg._provider_info import CONN_FIELDS, CONN_TYPE, UI_FIELD_BEHAVIOUR
from airflow_provider_cg.core.jetstream.connection import SECRET_FIELDS, NatsConnectionSettings

__all__ = ["NatsHook"]

try:
    from airflow.sdk import BaseHook
except ImportError:  # Airflow 3.0
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef,attr-defined]

if TYPE_CHECKING:
    from nats.aio.client import Client

T = TypeVar("T")

_EXTRA_PREFIX = f"extra__{CONN_TYPE}__"
_URL_USERINFO = re.compile(r"[^\s/@'\",]+@")  # "user:pass@" in a URL
_MIN_KEY_LINE = 16  # a line of a creds file or PEM key at least this long is key material


def _normalise_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """Accept both ``token`` and the legacy form-prefixed ``extra__nats__token``."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        out[key[len(_EXTRA_PREFIX) :] if key.startswith(_EXTRA_PREFIX) else key] = value
    return out


def _server_urls(host: str | None, port: int | None, scheme: str | None) -> list[str]:
    scheme = (scheme or "").strip().rstrip(":/") or "nats"
    urls = []
    for part in (host or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "://" in part:
            urls.append(part)
            continue
        has_port = re.search(r":\d+$", part) and (not part.startswith("[") or "]:" in part)
        if port and not has_port:
            part = f"{part}:{port}"
        urls.append(f"{scheme}://{part}")
    return urls


def settings_from_connection(conn: Any, extra: Mapping[str, Any]) -> NatsConnectionSettings:
    """Map an Airflow connection (and its parsed extra) to ``NatsConnectionSettings``.

    Unknown extra keys are ignored; ``ValueError`` for a malformed server URL.
    """
    extra = _normalise_extra(extra)
    values: dict[str, Any] = {k: extra.get(k) for k in CONN_FIELDS if k != "servers"}
    servers = extra.get("servers")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    if not servers:
        servers = _server_urls(conn.host, conn.port, conn.schema)
    if servers:
        values["servers"] = list(servers)
    values["user"] = conn.login
    values["password"] = conn.password
    return NatsConnectionSettings.from_mapping(values)


def _secret_pieces(settings: NatsConnectionSettings) -> list[str]:
    """Every secret value, plus each key-material line of multi-line ones (creds, PEM keys)."""
    pieces = []
    for name in sorted(SECRET_FIELDS):
        value = getattr(settings, name, None)
        if not value:
            continue
        pieces.append(value)
        for line in value.splitlines():
            line = line.strip()
            if len(line) >= _MIN_KEY_LINE and " " not in line and line[0] not in "-*":
                pieces.append(line)
    return pieces


def _mask_functions() -> tuple[Callable[[str], None], Callable[[str], Awaitable[None]] | None]:
    try:
        from airflow.sdk.log import amask_secret, mask_secret
    except ImportError:
        try:
            from airflow.sdk.log import mask_secret
        except ImportError:  # Airflow 3.0
            from airflow.sdk.execution_time.secrets_masker import mask_secret  # type: ignore[no-redef]
        return mask_secret, None
    return mask_secret, amask_secret


def scrub(text: str, settings: NatsConnectionSettings | None = None) -> str:
    """``text`` without URL credentials and without any secret value of ``settings``."""
    text = _URL_USERINFO.sub("***@", text)
    if settings is not None:
        for piece in sorted(_secret_pieces(settings), key=len, reverse=True):
            text = text.replace(piece, "***")
    return text


class NatsHook(BaseHook):
    """Connection of type ``nats`` (NATS JetStream); see the module docstring for its fields.

    :param nats_conn_id: the Airflow connection id (default ``nats_default``).
    """

    conn_name_attr = "nats_conn_id"
    default_conn_name = "nats_default"
    conn_type = CONN_TYPE
    hook_name = "NATS JetStream"

    def __init__(self, nats_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nats_conn_id = nats_conn_id
        self._settings: NatsConnectionSettings | None = None

    # --- connection form (Airflow 3.1; 3.2+ reads the same data from provider info) -----

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Relabeling and placeholders of the connection form."""
        return {
            "hidden_fields": list(UI_FIELD_BEHAVIOUR["hidden-fields"]),
            "relabeling": dict(UI_FIELD_BEHAVIOUR["relabeling"]),
            "placeholders": dict(UI_FIELD_BEHAVIOUR["placeholders"]),
        }

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Extra fields of the connection form as wtforms fields (Airflow < 3.2 only)."""
        from flask_appbuilder.fieldwidgets import (
            BS3PasswordFieldWidget,
            BS3TextAreaFieldWidget,
            BS3TextFieldWidget,
        )
        from wtforms import IntegerField, PasswordField, StringField, TextAreaField

        widgets: dict[str, Any] = {}
        for name, field in CONN_FIELDS.items():
            schema = field["schema"]
            if schema.get("format") == "password":
                widgets[name] = PasswordField(field["label"], widget=BS3PasswordFieldWidget())
            elif schema.get("format") == "multiline":
                widgets[name] = TextAreaField(field["label"], widget=BS3TextAreaFieldWidget())
            elif "integer" in schema.get("type", ()):
                widgets[name] = IntegerField(field["label"], widget=BS3TextFieldWidget())
            else:
                widgets[name] = StringField(field["label"], widget=BS3TextFieldWidget())
        return widgets

    # --- settings -----------------------------------------------------------------------

    def get_settings(self) -> NatsConnectionSettings:
        """Settings of the connection (sync; fetched once per hook, secrets masked)."""
        if self._settings is None:
            conn = self.get_connection(self.nats_conn_id)
            settings = settings_from_connection(conn, conn.extra_dejson)
            mask_secret, _ = _mask_functions()
            for piece in _secret_pieces(settings):
                mask_secret(piece)
            self._settings = settings
        return self._settings

    async def aget_settings(self) -> NatsConnectionSettings:
        """Settings of the connection, fetched without blocking the event loop (triggers)."""
        if self._settings is None:
            conn, extra = await self._aget_connection_and_extra()
            settings = settings_from_connection(conn, extra)
            mask_secret, amask_secret = _mask_functions()
            for piece in _secret_pieces(settings):
                if amask_secret is not None:
                    await amask_secret(piece)
                else:
                    mask_secret(piece)
            self._settings = settings
        return self._settings

    async def _aget_connection_and_extra(self) -> tuple[Any, dict[str, Any]]:
        try:  # the helpers providers use: they pick the deadlock-free path per Airflow version
            from airflow.providers.common.compat.connection import (
                get_async_connection,
                get_async_extra_dejson,
            )
        except ImportError:
            from asgiref.sync import sync_to_async

            conn = await sync_to_async(self.get_connection)(self.nats_conn_id)
            return conn, await sync_to_async(lambda: conn.extra_dejson)()
        conn = await get_async_connection(self.nats_conn_id, hook=type(self))
        return conn, await get_async_extra_dejson(conn)

    def get_conn(self) -> NatsConnectionSettings:
        """The connection settings (a NATS client is async: use ``run`` or ``aconnect``)."""
        return self.get_settings()

    # --- async access (triggers) ----------------------------------------------------------

    async def aconnect(self, **overrides: Any) -> Client:
        """A connected nats-py client; the caller closes it. For async code such as triggers."""
        settings = await self.aget_settings()
        self.log.debug("Connecting to NATS %s", scrub(", ".join(settings.servers)))
        return await settings.connect(**overrides)

    @contextlib.asynccontextmanager
    async def aclient(self, **overrides: Any) -> AsyncIterator[Client]:
        """``async with hook.aclient() as nc:`` -- connect, then close however the block ends."""
        nc = await self.aconnect(**overrides)
        try:
            yield nc
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    # --- sync layer (operators) -----------------------------------------------------------

    def run(self, async_fn: Callable[[Client], Awaitable[T]]) -> T:
        """Run ``await async_fn(nc)`` on a fresh event loop in this thread and return its result.

        The connection is opened before and closed after. For sync code only (operators, the
        connection test); a trigger must use ``aconnect``/``aclient`` instead.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("NatsHook.run() blocks; in async code use `async with hook.aclient()`")
        settings = self.get_settings()

        async def _main() -> T:
            nc = await settings.connect()
            try:
                result = await async_fn(nc)
            except BaseException:
                with contextlib.suppress(Exception):
                    await nc.close()
                raise
            await nc.close()
            return result

        return asyncio.run(_main())

    def test_connection(self) -> tuple[bool, str]:
        """Connect and ask JetStream for the account info. The message never holds a secret."""
        from airflow_provider_cg.core.jetstream.api import JsApi

        settings: NatsConnectionSettings | None = None

        async def _probe(nc: Client) -> str:
            info = await JsApi(nc).request("INFO")
            server = nc.connected_url.netloc if nc.connected_url else "?"
            v = nc.connected_server_version
            return (
                f"Connected to {server} (nats-server {v.major}.{v.minor}.{v.patch}); JetStream "
                f"account: {info.get('streams', 0)} streams, {info.get('consumers', 0)} consumers"
            )

        try:
            settings = self.get_settings()
            return True, scrub(self.run(_probe), settings)
        except Exception as e:
            return False, scrub(f"{type(e).__name__}: {e}", settings)
