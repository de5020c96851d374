"""Go programs the tests run beside the project (orbit's ``cg`` CLI, MinIO), built from the Go
module proxy inside a throwaway module and cached per version under ``$CG_ORBIT_CACHE``
(default ``~/.cache/airflow-provider-cg``). ``go install pkg@version`` is not used: it looks up
the module's version list for deprecations, which the proxy here refuses for some modules."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.shared import build_lock


def cache_dir() -> Path:
    return Path(os.environ.get("CG_ORBIT_CACHE") or Path.home() / ".cache" / "airflow-provider-cg")


def go_build(name: str, module: str, version: str, package: str, binary: str, *, timeout: float = 600) -> Path:
    """Path of ``package``'s binary from ``module@version``, built on first use (needs ``go``)."""
    out = cache_dir() / f"{name}-{version}" / binary
    if out.is_file():
        return out
    with build_lock(out):
        if not out.is_file():
            work = fresh_dir(f"{name}-build-{version}")
            run_go(name, work, ["mod", "init", f"{name}build"], ["get", f"{module}@{version}"],
                   ["build", "-o", str(out), package], timeout=timeout)
            shutil.rmtree(work, ignore_errors=True)
    return out


def fresh_dir(name: str) -> Path:
    work = cache_dir() / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def run_go(name: str, cwd: Path, *commands: list[str], timeout: float = 600) -> None:
    """Run ``go <command>`` for each of ``commands`` in ``cwd``, modules from the proxy into the cache."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        raise RuntimeError(f"the Go toolchain (go) is needed to build {name} for the tests")
    cache = cache_dir()
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod", "GOPATH": str(cache / "gopath"),
           "GOMODCACHE": str(cache / "gopath" / "pkg" / "mod"), "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    if os.getpriority(os.PRIO_PROCESS, 0) > 0:  # this thread is niced: a background build (``prebuild.py``)
        env["GOMAXPROCS"] = "1"  # one compile at a time, the other core for the tests meanwhile
    for cmd in commands:
        r = subprocess.run([go, *cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"building {name} failed at go {' '.join(cmd)}: {r.stderr[-2000:]}")
