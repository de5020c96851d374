"""Example pipelines shipped with the package: copy one into your own folder to start from it."""
