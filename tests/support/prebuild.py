"""What the selected tests run beside the project and build or install on first use (MinIO,
orbit's CLI and library program, Debian's chromium), made in the background from collection
on, one after another, niced in one process (``shared.background_niceness``): on a machine whose
cache is empty that takes minutes (MinIO alone about 5 on 2 cores), which the tests before each
one's first user then overlap. Under xdist one worker builds each (``shared.build_lock``). Their
fixtures take the result from here (``built``); a build that failed fails them as it would have
failed building there. Cached builds return at once.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.shared import background_niceness

_PENDING: dict[Callable[[], Any], concurrent.futures.Future] = {}


def _builds() -> dict[str, Callable[[], Any]]:
    """Fixture name -> the build it needs."""
    from tests.support.airflow_ui import ensure_chromium
    from tests.support.minio import build_minio
    from tests.support.orbit import build_orbit_cg, build_orbit_cg_source, build_orbit_library_program

    return {"minio_server": build_minio, "orbit_binary": build_orbit_cg, "orbit_cli_binary": build_orbit_cg_source,
            "orbit_library_binary": build_orbit_library_program, "chromium": ensure_chromium}


def _nice() -> None:
    os.nice(background_niceness())  # this thread's (Linux: per thread), and the processes it starts inherit it


def start_for(items: Iterable) -> None:
    """Start the builds the collected ``items`` use: by fixture, or by ``request.getfixturevalue``
    of it in their module."""
    builds, sources = _builds(), {}
    wanted: list[Callable[[], Any]] = []
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ not in sources:
            try:
                sources[module.__name__] = inspect.getsource(module)
            except (OSError, TypeError):
                sources[module.__name__] = ""
        text = sources.get(module.__name__, "") if module is not None else ""
        for fixture, build in builds.items():
            if build not in wanted and (fixture in getattr(item, "fixturenames", ()) or f'"{fixture}"' in text):
                wanted.append(build)
    if not wanted:
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cg-prebuild", initializer=_nice)
    for build in wanted:
        _PENDING.setdefault(build, pool.submit(build))
    pool.shutdown(wait=False)


def built(build: Callable[[], Any]) -> Any:
    """The path ``build`` makes: from the background build when one was started, else built now."""
    pending = _PENDING.get(build)
    return pending.result() if pending is not None else build()
