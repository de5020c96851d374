"""The Iceberg sink: its declaration, its writer (pyiceberg, SQL or REST catalog) and its maintenance."""
