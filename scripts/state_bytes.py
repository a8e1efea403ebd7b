"""What a state of format 5 holds per undirected edge besides its outputs, file by file, written
by wcoj's own writers from a prepared graph (the scale part's cache, `wcoj_bench.infra.prepared`):
the relation's segment (both orientations), its counts' segment, the relation's batch and the two
counts traces' batches — a one-epoch load's files but its manifest, without running the load.

Usage: ``python scripts/state_bytes.py GRAPH_FOLDER`` (the folder holding ``edges.parquet``).
"""

import shutil
import sys
import tempfile

import numpy as np
import pyarrow.parquet as pq

from wcoj_core.kernel.layer import Layer
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import Level
from wcoj_core.store.segments import write_segment

G = sys.argv[1]
edges = pq.read_table(f"{G}/edges.parquet")
a, b = edges.column(0).to_numpy(), edges.column(1).to_numpy()
m = len(a)
rows = [np.concatenate([a, b]), np.concatenate([b, a])]
rel = Layer.build(rows, np.ones(2 * m, dtype=np.int64))
del rows
root = tempfile.mkdtemp()
seg = write_segment(
    root,
    "arrangements/rel-x/s-0000000000000001.seg",
    rel,
    level=Level.BASE,
    view=None,
    order=(0, 1),
)
first = rel.col(0)
keys, counts = np.unique(first, return_counts=True)
cl = Layer.build([keys], counts.astype(np.int64))
cseg = write_segment(
    root,
    "arrangements/counts-x/s-0000000000000002.seg",
    cl,
    level=Level.BASE,
    view=None,
    order=(0,),
)
files = Batches(root)
rb = files.write(
    "traces/rel-x/b-k-0-000000000001",
    ["c0", "c1"],
    np.asarray(rel.rows),
    np.asarray(rel.diff),
    0,
    threads=True,
)
cb = files.write(
    "traces/counts-x/b-k-0-000000000002", ["c0"], np.asarray(cl.rows), np.asarray(cl.diff), 0
)
sizes = {
    "rel segment": seg.files["layer"].size,
    "counts segment": cseg.files["layer"].size,
    "rel batch": sum(f.size for f in rb),
    "counts batches (two)": 2 * sum(f.size for f in cb),
}
for k, v in sizes.items():
    print(f"{k}: {v:,} B = {v / m:.2f} B/edge")
print(
    f"total {sum(sizes.values()):,} B = {sum(sizes.values()) / m:.2f} B/edge over {m:,} edges, {len(keys):,} vertices"
)
shutil.rmtree(root)
