"""synadia-io/orbit.java's ``pcgroups``, built from its source with Maven, and a member instance
on it (``java/orbit_java/CgJavaMember.java``). The source is not on Maven Central: give its
checkout (the repository's root, holding ``pcgroups/``) as ``$CG_ORBIT_JAVA_SOURCE``. The build
is cached by the source's content under ``~/.cache/airflow-provider-cg/orbit-java/``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent / "java" / "orbit_java"
CACHE = Path.home() / ".cache" / "airflow-provider-cg" / "orbit-java"


def source() -> Path | None:
    given = os.environ.get("CG_ORBIT_JAVA_SOURCE")
    root = Path(given) if given else None
    return root if root and (root / "pcgroups" / "src" / "main" / "java").is_dir() else None


def build(root: Path) -> list[str]:
    """The ``java`` command line that runs ``CgJavaMember`` (its classpath built once per source)."""
    src = root / "pcgroups" / "src" / "main" / "java"
    digest = hashlib.sha256()
    for f in sorted([*src.rglob("*.java"), HERE / "CgJavaMember.java", HERE / "pom.xml"]):
        digest.update(f.read_bytes())
    out = CACHE / digest.hexdigest()[:16]
    classpath = out / "classpath.txt"
    if not classpath.exists():
        work = out / "build"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work / "src" / "main" / "java")
        shutil.copy(HERE / "CgJavaMember.java", work / "src" / "main" / "java")
        shutil.copy(HERE / "pom.xml", work)
        r = subprocess.run(["mvn", "-q", "-B", "package", "-DskipTests", "dependency:build-classpath",
                            f"-Dmdep.outputFile={work / 'deps.txt'}"], cwd=work, capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"building orbit.java failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        classpath.write_text(f"{work / 'target' / 'classes'}{os.pathsep}{(work / 'deps.txt').read_text().strip()}")
    return ["java", "-cp", classpath.read_text(), "CgJavaMember"]
