"""A real Iceberg REST catalog for the tests: Apache Iceberg's REST adapter and servlet (the ones
Iceberg's own REST tests and its ``iceberg-rest-fixture`` image serve), from Maven Central,
behind ``java/CgIcebergRestCatalog.java``: a JDBC catalog in SQLite, Jetty on 127.0.0.1 only,
every request checked for a bearer token, which OAuth2 client credentials also obtain (both given
in the environment, never an argument).

The jars (Iceberg 1.10.0, Jetty 11, the servlet API, sqlite-jdbc; their SHA-1 checked against
Maven Central's) are cached in ``~/.cache/airflow-provider-cg/iceberg-rest/``; Hadoop, Jackson,
Avro and SLF4J come from the installed PySpark's jars. The launcher is compiled there once
(``javac`` of Java 17). Stopped by its PID.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.shared import build_lock

MAVEN = "https://repo1.maven.org/maven2"
ICEBERG, JETTY = "1.10.0", "11.0.25"
JARS = [
    *(f"org.apache.iceberg:{a}:{ICEBERG}" for a in ("iceberg-core", "iceberg-api", "iceberg-common",
                                                   "iceberg-bundled-guava")),
    f"org.apache.iceberg:iceberg-core:{ICEBERG}:tests",  # RESTCatalogAdapter, RESTCatalogServlet
    *(f"org.eclipse.jetty:{a}:{JETTY}" for a in ("jetty-server", "jetty-servlet", "jetty-http", "jetty-io",
                                                 "jetty-util", "jetty-security")),
    "jakarta.servlet:jakarta.servlet-api:5.0.0",
    "org.xerial:sqlite-jdbc:3.46.1.3",
    "com.github.ben-manes.caffeine:caffeine:2.9.3",
    "org.apache.httpcomponents.client5:httpclient5:5.4.4",
    "org.apache.httpcomponents.core5:httpcore5:5.3.4",
    "org.apache.httpcomponents.core5:httpcore5-h2:5.3.4",
]
LAUNCHER = Path(__file__).parent / "java" / "CgIcebergRestCatalog.java"


def _cache() -> Path:
    d = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-provider-cg" / "iceberg-rest"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _fetch(coordinate: str, into: Path) -> Path:
    group, artifact, version, *classifier = coordinate.split(":")
    name = f"{artifact}-{version}{'-' + classifier[0] if classifier else ''}.jar"
    target = into / name
    if target.exists():
        return target
    url = f"{MAVEN}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read()
    with urllib.request.urlopen(url + ".sha1", timeout=60) as r:
        want = r.read().decode().split()[0]
    if hashlib.sha1(data).hexdigest() != want:  # noqa: S324 - Maven Central's published checksum
        raise RuntimeError(f"{name}: checksum mismatch")
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.rename(target)
    return target


def classpath() -> str:
    """The server's classpath (jars fetched and the launcher compiled on first use)."""
    import pyspark

    cache = _cache()
    spark_jars = str(Path(pyspark.__file__).parent / "jars" / "*")
    classes = cache / "classes"
    compiled = classes / "CgIcebergRestCatalog.class"
    with build_lock(classes):  # another worker of the run may be fetching or compiling them
        jars = [str(_fetch(c, cache)) for c in JARS]
        if not compiled.exists() or compiled.stat().st_mtime < LAUNCHER.stat().st_mtime:
            classes.mkdir(exist_ok=True)
            subprocess.run(["javac", "-d", str(classes), "-cp", ":".join([*jars, spark_jars]), str(LAUNCHER)],
                           check=True, capture_output=True)
    return ":".join([str(classes), *jars, spark_jars])


@dataclass
class RestCatalogServer:
    url: str
    token: str
    warehouse: str
    process: subprocess.Popen
    client_id: str = "cg-tests"
    client_secret: str = ""

    def env(self) -> dict[str, str]:
        """What a job needs to reach it: the token in the environment."""
        return {"CG_ICEBERG_CATALOG_TOKEN": self.token}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start(root: Path) -> RestCatalogServer:
    warehouse = root / "rest-warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    token, client_secret = secrets.token_hex(16), secrets.token_hex(16)
    log = open(root / "rest-catalog.log", "wb")  # noqa: SIM115 - the server's, until it stops
    proc = subprocess.Popen(["java", "-cp", classpath(), "CgIcebergRestCatalog", str(root / "rest-catalog.db"),
                             f"file://{warehouse}"], stdout=subprocess.PIPE, stderr=log,
                            env={**os.environ, "CG_REST_TOKEN": token, "CG_REST_CLIENT": f"cg-tests:{client_secret}"})
    deadline = time.monotonic() + 60
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(b"PORT ") or proc.poll() is not None:
            break
    if not line.startswith(b"PORT "):
        proc.kill()
        raise RuntimeError(f"the REST catalog did not start: {(root / 'rest-catalog.log').read_text()[-2000:]}")

    def drain() -> None:  # its log lines (Spark's log4j on the classpath writes to stdout): never a full pipe
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):
            log.write(chunk)

    threading.Thread(target=drain, daemon=True).start()
    return RestCatalogServer(f"http://127.0.0.1:{int(line.split()[1])}", token, str(warehouse), proc,
                             client_secret=client_secret)


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory):
    """One REST catalog server for the session (tests use their own namespaces)."""
    server = start(tmp_path_factory.mktemp("iceberg-rest"))
    yield server
    server.stop()
