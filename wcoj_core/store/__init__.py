"""A wcoj state on disk (format 4): every byte wcoj writes there.

See docs/state.md. `Store` opens, commits and prunes a state; `wcoj_core.store.manifest` holds
the values a manifest is made of; `wcoj_core.store.names` every name wcoj writes;
`wcoj_core.store.batches` the Parquet batches; `wcoj_core.store.segments` the arrangements'
files (`wcoj_core.check.verify`, above the store, reads a whole state back). Nothing here
imports pyspark: a state on a Hadoop file system is reached through a Spark session only when
one is opened.
"""

from __future__ import annotations

from wcoj_core.store.manifest import (
    Batch,
    FileRef,
    Index,
    Level,
    Manifest,
    Meaning,
    QueryPlan,
    RelationPlan,
    Segment,
    StatePlan,
    Trace,
)
from wcoj_core.store.names import trace_dir
from wcoj_core.store.store import KEEP_MANIFESTS, ORPHAN_AGE, Pruned, Store

__all__ = [
    "KEEP_MANIFESTS",
    "ORPHAN_AGE",
    "Batch",
    "FileRef",
    "Index",
    "Level",
    "Manifest",
    "Meaning",
    "Pruned",
    "QueryPlan",
    "RelationPlan",
    "Segment",
    "StatePlan",
    "Store",
    "Trace",
    "trace_dir",
]
