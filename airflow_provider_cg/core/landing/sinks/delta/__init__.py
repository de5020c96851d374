"""The Delta Lake sink: its declaration, its writer (delta-rs) and its maintenance."""
