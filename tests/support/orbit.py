"""orbit's own ``cg`` CLI and library (Synadia orbit.go ``pcgroups``), built for the interop tests.

v0.2.1, the current release, is built from its source in the workplace's ``shared/orbit/``
(``orbit-pcgroups-v0.2.1.tar.gz`` beside the checkout; ``$CG_ORBIT_SOURCE`` names another
copy): its ``cg`` CLI and ``orbit_library/main.go``, a consumer on its library at its defaults.
v0.1.0 comes from the Go module proxy:

The proxy here serves ``github.com/synadia-io/orbit.go/pcgroups`` at v0.1.0 only (v0.1.1 to
v0.2.x answer 403 "not available"), so that release is the one pinned. ``go install
...@v0.1.0`` itself fails (it looks up the module's version list for deprecations, which the
proxy refuses), so the command is built inside a throwaway module that requires the release.
The binary is cached per version under ``$CG_ORBIT_CACHE`` (default
``~/.cache/airflow-provider-cg``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.gobuild import cache_dir, fresh_dir, go_build, run_go
from tests.support.shared import build_lock

ORBIT_MODULE = "github.com/synadia-io/orbit.go/pcgroups"
ORBIT_VERSION = "v0.1.0"
ORBIT_SOURCE_VERSION = "v0.2.1"
LIBRARY_PROGRAM = Path(__file__).with_name("orbit_library") / "main.go"


def build_orbit_cg(version: str = ORBIT_VERSION) -> Path:
    """Path of orbit's ``cg`` binary at ``version``, built on first use (needs ``go``)."""
    return go_build("orbit-cg", ORBIT_MODULE, version, f"{ORBIT_MODULE}/cg", "cg")


def orbit_source_tarball() -> Path:
    given = os.environ.get("CG_ORBIT_SOURCE")
    path = Path(given) if given else (Path(__file__).resolve().parents[3] / "shared" / "orbit"
                                      / f"orbit-pcgroups-{ORBIT_SOURCE_VERSION}.tar.gz")
    if not path.is_file():
        raise RuntimeError(f"orbit {ORBIT_SOURCE_VERSION}'s source is not at {path} (set CG_ORBIT_SOURCE)")
    return path


def _orbit_source() -> Path:
    """orbit's ``pcgroups`` module folder, unpacked once into the cache."""
    tarball = orbit_source_tarball()
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    root = cache_dir() / f"orbit-src-{ORBIT_SOURCE_VERSION}-{digest}"
    module = root / "orbit.go" / "pcgroups"
    if not (module / "go.mod").is_file():
        with build_lock(root):
            if not (module / "go.mod").is_file():
                work = fresh_dir(f"orbit-src-unpack-{digest}")
                with tarfile.open(tarball) as tar:
                    tar.extractall(work, filter="data")
                (work / "orbit.go" / "pcgroups" / "go.work").unlink(missing_ok=True)
                work.rename(root) if not root.exists() else None
    return module


def build_orbit_cg_source() -> Path:
    """orbit v0.2.1's ``cg`` CLI built from its source (cached)."""
    src = _orbit_source()
    out = src.parents[1] / "bin" / "cg"
    if not out.is_file():
        with build_lock(out):
            if not out.is_file():
                run_go("orbit-cg", src, ["build", "-o", str(out), "./cg"])
    return out


def build_orbit_library_program() -> Path:
    """``orbit_library/main.go`` built against orbit v0.2.1's library (cached per source)."""
    src = _orbit_source()
    digest = hashlib.sha256(LIBRARY_PROGRAM.read_bytes()).hexdigest()[:12]
    out = cache_dir() / f"orbit-library-{ORBIT_SOURCE_VERSION}-{digest}" / "orbit-library"
    if out.is_file():
        return out
    with build_lock(out):
        if not out.is_file():
            work = fresh_dir(f"orbit-library-build-{digest}")
            (work / "main.go").write_text(LIBRARY_PROGRAM.read_text())
            (work / "go.mod").write_text(f"module orbitlibrary\n\ngo 1.25.0\n\nrequire {ORBIT_MODULE} "
                                         f"{ORBIT_SOURCE_VERSION}\n\nreplace {ORBIT_MODULE} => {src}\n")
            run_go("orbit-library", work, ["mod", "tidy"], ["build", "-o", str(out), "."])
    return out


@dataclass
class OrbitCli:
    """Runs orbit's ``cg`` against one server through a selected nats CLI context.

    v0.1.0 connects before it parses its arguments, so its ``--context`` flag has no effect:
    the context is selected the way the nats CLI does, in ``$XDG_CONFIG_HOME/nats/``.
    """

    binary: Path
    config_home: Path

    @classmethod
    def for_server(cls, binary: Path, url: str, workdir: Path) -> OrbitCli:
        home = (workdir / "orbit-config").resolve()
        (home / "nats" / "context").mkdir(parents=True, exist_ok=True)
        (home / "nats" / "context" / "cgtest.json").write_text(json.dumps({"url": url}))
        (home / "nats" / "context.txt").write_text("cgtest")
        return cls(binary, home)

    def argv(self, *args: str) -> list[str]:
        return [str(self.binary), *args]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "XDG_CONFIG_HOME": str(self.config_home)}

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env=self.env)
        if check and r.returncode != 0:
            raise AssertionError(f"orbit cg {' '.join(args)} exited {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        """A long-running command (``consume``); stop it with ``stop()``."""
        f = open(log, "wb")  # noqa: SIM115 - owned by the process
        return subprocess.Popen(self.argv(*args), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                start_new_session=True, env=self.env)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
