"""The JetStream protocol client: JS API requests, pulls with priority groups and pins, direct gets, connections."""
