"""The checking engines: the Spark engine and its pure-Python twin, and what they share, by subject."""
