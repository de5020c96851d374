"""The PostgreSQL sink: its declaration, its writer (``PREPARE TRANSACTION``), its connection,
columns, tables and the statements of a batch."""
