"""Consumer-group core on NATS JetStream. Imports nothing from Airflow.

A Spark driver on a cluster without Airflow runs this package (shipped with --py-files):

- ``jetstream``: the protocol client (JS API requests, pulls with priority groups, direct gets,
  connection settings, publishing);
- ``groups``: orbit-compatible group configs, partitioning and group administration;
- ``landing``: the member job's contract and its landing engine (two-phase steps, live
  batches and backfills, rows, decoding, transformations, sinks);
- ``tools``: what runs beside it, never on a driver (the ``cg`` CLI, the embedded
  nats-server, packaging for spark-submit).
"""
