"""Airflow triggers: GroupOverflowTrigger (usable by AssetWatcher)."""
