"""Airflow's own authentication for the page (the one place that imports its API server).

``airflow.api_fastapi`` is Airflow's API server, not a provider API: this module checks the
Airflow version it was written against (3.1 to 3.x) and, when the import fails, refuses
every request (503) rather than serve the page without authentication.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request

try:  # Airflow >= 3.1: the cookie/bearer user and the auth manager of the API server
    from airflow import __version__ as _AIRFLOW_VERSION
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails
    from airflow.api_fastapi.core_api.security import get_user as _get_user

    _MAJOR_MINOR = tuple(int(x) for x in _AIRFLOW_VERSION.split(".")[:2])
    AVAILABLE = (3, 1) <= _MAJOR_MINOR < (4, 0)
except ImportError:  # pragma: no cover - exercised by test_ui's fallback test
    AVAILABLE = False


async def current_user(request: Request) -> Any:
    """The signed-in Airflow user (401 when there is none; 503 when Airflow's auth is unknown)."""
    if not AVAILABLE:
        raise HTTPException(503, "this Airflow's authentication is not supported by the consumer-groups page")
    from fastapi.security import HTTPAuthorizationCredentials

    header = request.headers.get("authorization", "")
    bearer = None
    if header.lower().startswith("bearer "):
        bearer = HTTPAuthorizationCredentials(scheme="bearer", credentials=header[7:])
    try:
        return await _get_user(request, None, bearer)
    except HTTPException:
        raise
    except Exception as e:  # an invalid or expired token
        raise HTTPException(401, "not signed in to Airflow") from e


def may_read_connection(user: Any, conn_id: str) -> bool:
    """Whether ``user`` may read connection ``conn_id`` (the page shows what it reaches)."""
    if not AVAILABLE:
        return False
    return bool(get_auth_manager().is_authorized_connection(
        method="GET", details=ConnectionDetails(conn_id=conn_id), user=user))
