"""Problems a group's jobs found that no server state shows, where the tools read them.

A member job that refuses because the group's origin went back (``landing/protocol/
origin_guard.py``) is the only one that knows: the origin, its work queue and the consumers all
rolled back together and look healthy. So the job writes what it found into the JetStream KV
bucket ``cg-group-problems`` (file storage, ours: orbit's tools never see it), one key per
group, and ``cg status``, ``cg lag``, the consumer-groups page, the sensors and the metrics show
it until a job of the group finds its origin whole again (the way forward taken) and deletes it.

Best effort: a server that refuses the write costs a warning, never the job's own answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

log = logging.getLogger("airflow_provider_cg.groups")

BUCKET = "cg-group-problems"
WRITE_TIMEOUT = 2.0
ORIGIN_WENT_BACK = "origin_went_back"
_KEY_SAFE = re.compile(r"[-_a-zA-Z0-9]+")


def problem_key(stream: str, group: str) -> str:
    """``<stream>.<group>``; a name with other characters (a KV key cannot hold most) is written
    as ``=`` and its UTF-8 hex."""
    return ".".join(p if _KEY_SAFE.fullmatch(p) else "=" + p.encode().hex() for p in (stream, group))


async def _bucket(nc: Any, js_prefix: str, *, create: bool) -> Any:
    import nats.js.errors
    from nats.js.api import StorageType

    js = nc.jetstream(prefix=js_prefix, timeout=WRITE_TIMEOUT)
    try:
        return await js.key_value(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            return None
        try:
            return await js.create_key_value(bucket=BUCKET, history=1, storage=StorageType.FILE, direct=True)
        except nats.js.errors.APIError:
            return await js.key_value(BUCKET)  # created meanwhile by another job


async def post(nc: Any, js_prefix: str, stream: str, group: str, kind: str, found: dict[str, Any]) -> None:
    """Record ``found`` as the group's ``kind`` of problem (``found_at`` added)."""
    try:
        kv = await _bucket(nc, js_prefix, create=True)
        value = {kind: {**found, "found_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        await kv.put(problem_key(stream, group), json.dumps(value, separators=(",", ":")).encode())
    except Exception as e:  # noqa: BLE001 - best effort: the job's refusal says it anyway
        log.warning("cg %s/%s: problem not recorded in %s (%s)", stream, group, BUCKET, str(e)[:160])


async def clear(nc: Any, js_prefix: str, stream: str, group: str) -> None:
    """The group's problems are gone (a job found its origin whole)."""
    import nats.js.errors

    try:
        kv = await _bucket(nc, js_prefix, create=False)
        if kv is None:
            return
        try:
            await kv.get(problem_key(stream, group))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return
        await kv.purge(problem_key(stream, group))
    except Exception as e:  # noqa: BLE001 - best effort, as ``post``
        log.warning("cg %s/%s: problem record in %s not cleared (%s)", stream, group, BUCKET, str(e)[:160])


async def read(nc: Any, js_prefix: str, stream: str, group: str) -> dict[str, Any]:
    """The group's recorded problems (``{kind: what was found}``; empty when none)."""
    import nats.js.errors

    try:
        kv = await _bucket(nc, js_prefix, create=False)
        if kv is None:
            return {}
        entry = await kv.get(problem_key(stream, group))
        data = json.loads(entry.value or b"{}")
        return data if isinstance(data, dict) else {}
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, ValueError):
        return {}
    except Exception as e:  # noqa: BLE001 - a status must not fail for want of this
        log.debug("cg %s/%s: problems not read (%s)", stream, group, e)
        return {}


def describe(kind: str, found: dict[str, Any]) -> str:
    """One line for a recorded problem, as ``cg status``, ``cg lag`` and the page say it."""
    if kind != ORIGIN_WENT_BACK:
        return f"{kind}: {json.dumps(found, sort_keys=True)}"
    to, lost = found.get("went_back_to"), found.get("lost_messages")
    if to is None:
        what = "went back (where: unknown, see the jobs' error)"
    else:
        what = f"went back to sequence {to}: the table landed up to {found.get('table_position')}"
        if lost is not None:
            what += f", {lost:,} landed message{'s' if lost != 1 else ''} no longer in the stream"
    forward = f"; its jobs refuse until {found['way_forward']}" if found.get("way_forward") else ""
    return f"ORIGIN WENT BACK: {found.get('stream')} {what}{forward}"
