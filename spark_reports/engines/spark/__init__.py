"""The Spark engine: the reconciliation as Spark SQL over the Parquet history."""
