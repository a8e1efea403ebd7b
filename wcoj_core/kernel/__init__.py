"""The GenericJoin kernel: numpy and Arrow only — no Spark, no files, no threads.

One implementation of the algorithm, deployed by `wcoj_core.deploy` on the driver or inside
Spark's executors:

* `keys` — order-preserving search keys (packed integers, or bytes);
* `multiplicity` — checked products and sums of multiplicities (never a silent int64 wrap);
* `layer` — consolidated sorted rows and the lookups and key ranges a step makes on them
  (built in memory, or opened from memory-mapped arrays without a pass over them);
* `index` — a trace in memory as base + recent layers (`TraceIndex`), and what an epoch reads
  (`EpochLayers`: old state, new state, the epoch's changes);
* `join` — one delta rule, attribute at a time: count, pick the fewest, propose (narrowed by
  the order filters), validate; bounded memory; `RuleTally` counts what every step did;
* `changes` — Arrow changes in and out, counts maintenance, output changes.
"""
