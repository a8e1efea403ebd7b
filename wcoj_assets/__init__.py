"""The Dagster code location of wcoj (filled in by the pipeline issue).

Importing this package does no I/O, reads no environment and starts no Spark.
"""
