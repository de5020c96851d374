"""Tools beside the core, never shipped to a Spark driver: the cg CLI, the embedded nats-server, packaging."""
