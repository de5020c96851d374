"""Consumer groups as orbit pcgroups stores them: configs, partitioning, administration."""
