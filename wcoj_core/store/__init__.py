"""A wcoj state on disk (format 5): every byte wcoj writes there.

See docs/state.md. `Store` opens, commits and prunes a state; `wcoj_core.store.manifest` holds
the values a manifest is made of; `wcoj_core.store.names` every name wcoj writes;
`wcoj_core.store.batches` the Parquet batches; `wcoj_core.store.segments` the arrangements'
files (`wcoj_core.check.verify`, above the store, reads a whole state back). Nothing here
imports pyspark: a state on a Hadoop file system is reached through a Spark session only when
one is opened.
"""
