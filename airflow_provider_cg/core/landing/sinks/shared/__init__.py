"""What every sink shares, beneath the families: the two-phase sink interface and its refusals, a
sink's declaration (``SinkKind``), table names, merges, ``partition_by`` and maintenance reports."""
