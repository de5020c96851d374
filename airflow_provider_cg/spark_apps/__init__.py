"""spark-submit applications shipped inside the package (resolved with ``importlib.resources``)."""
