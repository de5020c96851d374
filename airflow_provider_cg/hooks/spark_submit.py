"""How a member job reaches spark-submit without its secrets showing anywhere.

The NATS connection's secrets and the PostgreSQL DSN never appear in the spark-submit command
line, the rendered template fields or XCom: in local and client mode they reach the driver as
process environment (``CG_NATS_*``, ``CG_PG_DSN``); for YARN and Kubernetes masters they go
into a 0600 properties file (``spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``)
deleted after the submit (a ``properties_file`` you pass is copied into it: Spark then skips
``spark-defaults.conf``, as with any ``--properties-file``). Standalone cluster deploy mode is
refused (no private channel). Built on the Spark provider's public ``SparkSubmitHook`` only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.sinks.registry import sink_kind

#: Spark's default ``spark.redaction.regex``, spelled so that the Spark provider's masking of the
#: logged command (it hides the value after any word "secret" or "password") leaves it readable
SPARK_DEFAULT_REDACTION = r"(?i)secre[t]|passwor[d]|token|access[.]key"
#: the names the member job's secrets travel under (spark.*Env.CG_NATS_CREDS, ..._NKEY_SEED,
#: ..._TLS_KEY, CG_PG_DSN, AWS_SECRET_ACCESS_KEY, ...): Spark's default pattern matches none of
#: them. Spelled, like the default, without the words the Spark provider masks after
CG_REDACTION = r"(?i)CG_NATS_|CG_PG_DSN|CG_ICEBERG_CATALOG_|AWS_SECRE[T]|AWS_SESSION|AWS_ACCESS"
#: quiet and private unless the user's ``conf`` says otherwise: no driver UI listening on every
#: interface of a worker, and Spark's own INFO lines out of the task log (the job's stay)
QUIET_DEFAULTS = {"spark.ui.enabled": "false", "spark.log.level": "WARN"}
#: a local-mode driver (and its block manager) listens on loopback only: Spark otherwise binds
#: every interface and advertises the machine's external address, which nothing needs here
LOCAL_LOOPBACK = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
#: a local-mode follower's JVM (the driver, running the tasks too) compiles with C1 only. Its
#: batches are small and many: most of its JVM's CPU was the C2 compiler's, not the batches'
#: (at 7,000 msg/s over 120 s, 13.5 of 24.9 µs per message), and C1's code costs its tasks 2 µs
#: more a message: 0.72x the CPU, the same freshness, a start 9 % sooner
#: (``benchmarks/profile_spark_follower.py``). As Spark's ``defaultJavaOptions``, so the options a
#: user or ``spark-defaults.conf`` gives in ``extraJavaOptions`` still apply, and come after.
LOCAL_FOLLOWER_JVM = {"spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}


def with_redaction(conf: dict[str, Any] | None) -> dict[str, Any]:
    """``conf`` with ``spark.redaction.regex`` extended so the Spark UI, event logs and
    ``spark-submit --verbose`` redact the member job's secret properties too."""
    out = dict(conf or {})
    base = out.get("spark.redaction.regex") or SPARK_DEFAULT_REDACTION
    if CG_REDACTION not in base:
        out["spark.redaction.regex"] = f"(?:{base})|{CG_REDACTION}"
    return out


def spark_master(conn_id: str, deploy_mode: str | None = None) -> tuple[str, str]:
    """``(master, deploy mode)`` of a Spark connection, as the Spark provider reads them: the
    host (plus ``:port``) is the master, ``deploy-mode`` in the extras unless given here."""
    conn = BaseHook.get_connection(conn_id)
    master = conn.host or "yarn"
    if conn.port:
        master = f"{master}:{conn.port}"
    mode = deploy_mode or (conn.extra_dejson or {}).get("deploy-mode") or "client"
    return master, mode


def pg_dsn(pg_conn_id: str) -> str:
    """A libpq DSN from an Airflow postgres connection (masked in logs)."""
    conn = BaseHook.get_connection(pg_conn_id)
    auth = quote(conn.login or "", safe="")
    if conn.password:
        auth += ":" + quote(conn.password, safe="")
    host = conn.host or "localhost"
    dsn = f"postgresql://{auth + '@' if auth else ''}{host}:{conn.port or 5432}/{quote(conn.schema or '', safe='')}"
    if conn.password:
        mask_secret(conn.password)
        mask_secret(dsn)
    return dsn


def iceberg_env(iceberg_conn_id: str) -> dict[str, str]:
    """A REST catalog from an Airflow ``iceberg`` connection (the Iceberg provider's fields: host
    = the catalog's URL, login / password = OAuth2 client id / secret; extra ``token`` = a bearer
    token instead) as ``CG_ICEBERG_CATALOG_*`` environment; the secrets are masked in logs."""
    conn = BaseHook.get_connection(iceberg_conn_id)
    extra = conn.extra_dejson or {}
    host = (conn.host or "").rstrip("/")
    if not host.startswith(("http://", "https://")):
        host = f"https://{host}" if host else ""
    env = {"CG_ICEBERG_CATALOG_URI": host + (f":{conn.port}" if conn.port and f":{conn.port}" not in host else "")}
    if conn.login and conn.password:
        mask_secret(conn.password)
        env["CG_ICEBERG_CATALOG_CREDENTIAL"] = f"{conn.login}:{conn.password}"
        mask_secret(env["CG_ICEBERG_CATALOG_CREDENTIAL"])
    if extra.get("token"):
        mask_secret(extra["token"])
        env["CG_ICEBERG_CATALOG_TOKEN"] = extra["token"]
    return env


def aws_env(aws_conn_id: str) -> dict[str, str]:
    """``AWS_*`` environment from an Airflow ``aws`` connection (the Amazon provider's field
    names: login = access key id, password = secret key, extras ``endpoint_url`` and
    ``region_name``); the secret is masked in logs."""
    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson or {}
    env = {}
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        mask_secret(conn.password)
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    token = extra.get("aws_session_token")
    if token:
        mask_secret(token)
        env["AWS_SESSION_TOKEN"] = token
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url")
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    if extra.get("region_name"):
        env["AWS_REGION"] = extra["region_name"]
    return env


def sink_env(sinks: str | Iterable[str], *, pg_conn_id: str | None, iceberg_conn_id: str | None,
             aws_conn_id: str | None) -> dict[str, str]:
    """The credentials of a landing's sinks (one, or a routed landing's several) from the
    Airflow connections each sink declares (``SinkKind.connections``, the first given one per
    sink), as the environment the member job and ``cg`` read (``CG_PG_DSN``,
    ``CG_ICEBERG_CATALOG_*``): a DSN (PostgreSQL's, or an Iceberg catalog's in PostgreSQL), a
    REST catalog's URI and token; and the object store's keys (``AWS_*``) for any of them."""
    given = {"pg_conn_id": pg_conn_id, "iceberg_conn_id": iceberg_conn_id}
    env: dict[str, str] = {}
    for name in sorted({sinks} if isinstance(sinks, str) else set(sinks)):
        found = next(((c, conn_id) for c in sink_kind(name).connections if (conn_id := given.get(c.param))), None)
        if found is None:
            continue
        connection, conn_id = found
        if connection.gives == "dsn" and connection.env:
            env[connection.env] = pg_dsn(conn_id)
        else:
            env.update(iceberg_env(conn_id))
    if aws_conn_id:
        env.update(aws_env(aws_conn_id))
    return env


def submit_hook(*, conn_id: str, deploy_mode: str | None, secrets: dict[str, str], env_vars: dict[str, str] | None,
                properties_file: str | None, follower: bool = False, **options: Any) -> tuple[SparkSubmitHook, str | None]:
    """A ``SparkSubmitHook`` (public constructor only) that carries ``secrets`` privately (see
    the module docstring). ``options``: the hook's other keyword arguments; ``follower``: the
    job follows (``LOCAL_FOLLOWER_JVM`` in local mode). Returns the hook and the properties file
    to delete after the submit (None when there is none)."""
    master, mode = spark_master(conn_id, deploy_mode)
    env = dict(env_vars or {})
    props = None
    if master.startswith(("yarn", "k8s://")):
        prefix = "spark.yarn.appMasterEnv." if master.startswith("yarn") else "spark.kubernetes.driverEnv."
        props = write_properties(properties_file, {prefix + k: v for k, v in secrets.items()})
    elif mode == "cluster":
        raise ConfigError("deploy_mode", "Spark standalone cluster mode cannot pass the NATS credentials privately; "
                                         "use client mode")
    else:  # Popen environment of spark-submit, inherited by the driver it starts here
        env.update(secrets)
    user_conf = options.get("conf") or {}
    local = master.startswith("local") and not (env.get("SPARK_LOCAL_IP") or os.environ.get("SPARK_LOCAL_IP")) \
        and not any(k in user_conf for k in LOCAL_LOOPBACK)
    defaults = {**QUIET_DEFAULTS, **(LOCAL_LOOPBACK if local else {}),
                **(LOCAL_FOLLOWER_JVM if follower and master.startswith("local") else {})}
    options["conf"] = with_redaction({**defaults, **user_conf})
    if deploy_mode is not None:
        options["deploy_mode"] = deploy_mode
    hook = SparkSubmitHook(conn_id=conn_id, env_vars=env or None, properties_file=props or properties_file,
                           **options)
    return hook, props


def write_properties(base: str | None, extra: dict[str, str]) -> str:
    """A 0600 properties file: ``base``'s content (if any) plus ``extra``. Returns its path."""
    fd, path = tempfile.mkstemp(prefix="cg-spark-", suffix=".conf")
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if base:
            f.write(Path(base).read_text(encoding="utf-8").rstrip("\n") + "\n")
        for k, v in extra.items():
            f.write(f"{k} {_escape_property(v)}\n")
    return path


def _escape_property(value: str) -> str:
    """Escape a value for a Java properties file (backslashes, newlines)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
