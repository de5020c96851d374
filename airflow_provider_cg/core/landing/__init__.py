"""Landing a member's messages into a sink exactly once: the job's contract, the two-phase steps, live batches and backfills."""
