"""orbit's own ``cg`` CLI (Synadia orbit.go ``pcgroups``), built from the Go module proxy.

The proxy here serves ``github.com/synadia-io/orbit.go/pcgroups`` at v0.1.0 only (v0.1.1 to
v0.2.x answer 403 "not available"), so that release is the one pinned. ``go install
...@v0.1.0`` itself fails (it looks up the module's version list for deprecations, which the
proxy refuses), so the command is built inside a throwaway module that requires the release.
The binary is cached per version under ``$CG_ORBIT_CACHE`` (default
``~/.cache/airflow-provider-cg``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.gobuild import go_build

ORBIT_MODULE = "github.com/synadia-io/orbit.go/pcgroups"
ORBIT_VERSION = "v0.1.0"


def build_orbit_cg(version: str = ORBIT_VERSION) -> Path:
    """Path of orbit's ``cg`` binary at ``version``, built on first use (needs ``go``)."""
    return go_build("orbit-cg", ORBIT_MODULE, version, f"{ORBIT_MODULE}/cg", "cg")


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
