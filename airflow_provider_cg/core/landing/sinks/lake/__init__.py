"""The lake family: tables kept as files beside a protocol log (``lake_sink.LakeSink``): the
Parquet dataset (declared here), and beneath Delta and Iceberg the log, staging and data files
they share (``tables.TableSink``)."""
