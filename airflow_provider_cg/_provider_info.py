"""The dict behind ``get_provider_info`` (kept apart so importing the package stays cheap).

Airflow >= 3.2 reads the connection form (``conn-fields``, ``ui-field-behaviour``) from here
without importing the hook; ``NatsHook`` derives its legacy form methods (Airflow 3.1) from
the same constants, so there is one definition of the form.
"""

from __future__ import annotations

import copy
from typing import Any

INTEGRATION = "NATS JetStream consumer groups"
CONN_TYPE = "nats"
HOOK_CLASS = "airflow_provider_cg.hooks.nats.NatsHook"
QUEUE_SCHEME = "nats-cg"
QUEUE_CLASS = "airflow_provider_cg.queues.nats.NatsCgMessageQueueProvider"


def _text(label: str, description: str | None = None, *, secret: bool = False, multiline: bool = False,
          example: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if secret:
        # Airflow treats only "password" fields as sensitive, and renders them as one line:
        # pasted multi-line secrets lose their line breaks there, which the settings restore.
        schema["format"] = "password"
    elif multiline:
        schema["format"] = "multiline"  # a text area: PEM text keeps its lines
    # No "examples" in the schema: Airflow's form turns a field that has them into an
    # autocomplete ("Start typing to see options") offering only those values. The example
    # goes into the description, shown under the plain text input.
    if example:
        description = f"{description} Example: {example}" if description else f"Example: {example}"
    field: dict[str, Any] = {"label": label, "schema": schema}
    if description:
        field["description"] = description
    return field


# Extra fields of a `nats` connection, stored unprefixed in the connection's extra JSON.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "servers": _text(
        "Servers",
        "Comma-separated NATS URLs; replaces Host, Port and URL scheme.",
        example="nats://nats-1:4222,tls://nats-2:4222",
    ),
    "token": _text("Token", "Authentication token.", secret=True),
    "nkey_seed": _text("NKey seed", "The user's NKey seed (SU...), or the path of a file holding it.", secret=True),
    "creds": _text(
        "Credentials",
        "Paste the whole .creds file (user JWT and NKey seed; line breaks lost in this one-line field are "
        "restored), or give the path of the file on the workers.",
        secret=True,
    ),
    "tls_ca": _text("TLS CA", "CA certificate: PEM text or a file path.", multiline=True),
    "tls_cert": _text("TLS client certificate", "PEM text or a file path.", multiline=True),
    "tls_key": _text(
        "TLS client key",
        "Paste the PEM key (line breaks lost in this one-line field are restored), or a file path.",
        secret=True,
    ),
    "name": _text("Client name", "Connection name shown by the server (monitoring).", example="airflow-prod"),
    "connect_timeout": {
        "label": "Connect timeout (s)",
        "schema": {"type": ["integer", "null"], "default": 5, "minimum": 1},
    },
}

UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {"host": "Host(s)", "schema": "URL scheme", "login": "User"},
    "placeholders": {
        "host": "127.0.0.1 or nats-1,nats-2:4223",
        "port": "4222",
        "schema": "nats (or tls, ws, wss)",
        "login": "user (optional)",
        "password": "password (optional)",
        # Airflow 3.1's form; the new UI shows placeholders for the standard fields only
        # (extra fields: the example in their description)
        "servers": "nats://nats-1:4222,nats://nats-2:4222",
        "tls_ca": "/etc/nats/ca.pem or -----BEGIN CERTIFICATE-----...",
        "tls_cert": "/etc/nats/client.pem or -----BEGIN CERTIFICATE-----...",
        "tls_key": "/etc/nats/client-key.pem or -----BEGIN PRIVATE KEY-----...",
        "creds": "/var/run/secrets/nats/user.creds or the file's content",
        "nkey_seed": "SU... or /var/run/secrets/nats/user.nk",
        "name": "airflow",
    },
}


#: the provider's section of Airflow's configuration, declared so ``airflow config list`` shows it
CONFIG_SECTION = "nats_consumer_groups"
CONFIG: dict[str, Any] = {
    CONFIG_SECTION: {
        "description": "The consumer-groups page and consumer lag as metrics (the API server's backlog sampler).",
        "options": {
            "backlog_sample_seconds": {
                "description": "How often the API server reads every nats connection's groups for the page's "
                               "backlog charts and sends consumer lag as metrics (StatsD, OpenTelemetry); 0 turns "
                               "the scheduled sampling off (a page view still samples).",
                "version_added": "0.1.0",
                "type": "float",
                "example": "15",
                "default": "60",
            },
        },
    },
}


def provider_info(version: str) -> dict:
    def modules(*names: str) -> list[dict[str, Any]]:
        return [
            {"integration-name": INTEGRATION, "python-modules": [f"airflow_provider_cg.{n}" for n in names]}
        ]

    return {
        "package-name": "airflow-provider-cg",
        "name": "NATS JetStream consumer groups",
        "description": "Partitioned consumer groups on NATS JetStream, consumed in bounded, "
        "exactly-once batches by Apache Spark.",
        "versions": [version],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://docs.nats.io/nats-concepts/jetstream",
                "tags": ["protocol"],
            }
        ],
        "connection-types": [
            {
                "connection-type": CONN_TYPE,
                "hook-class-name": HOOK_CLASS,
                "hook-name": "NATS JetStream",
                "conn-fields": copy.deepcopy(CONN_FIELDS),
                "ui-field-behaviour": copy.deepcopy(UI_FIELD_BEHAVIOUR),
            }
        ],
        "hooks": modules("hooks.nats", "hooks.spark_submit"),
        "operators": modules("operators.groups", "operators.members", "operators.spark", "operators.maintenance",
                             "operators.streaming"),
        "sensors": modules("sensors.overflow"),
        "triggers": modules("triggers.overflow"),
        # A list of class paths (not python-modules): MessageQueueTrigger(scheme="nats-cg").
        "queues": [QUEUE_CLASS],
        "config": copy.deepcopy(CONFIG),
    }
