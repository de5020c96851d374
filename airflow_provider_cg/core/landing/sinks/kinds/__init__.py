"""The built-in sinks' declarations (``kind.SinkKind``), one module each; ``registry.py``
lists them."""
