"""The GenericJoin kernel: compiled loops over numpy arrays — no Spark, no files, no threads
but its own parallel loops.

One implementation of the algorithm, deployed by `wcoj_core.deploy` on the driver or inside
Spark's executors. Its inner loops are C (`_native.c`, built by `pip install`; `native` loads
it, never stale): sorting and consolidating, lookups, counting, and one pass of propose and
validate per step, releasing the GIL and running on several threads when asked; with
reading ahead (``WCOJ_READ_AHEAD``, ``faults`` by default: see `native`), a loop over a
memory-mapped layer whose pages are not in memory asks the OS for all the pages its probes will
read at once before it runs: the one way a cold segment's pages are read (the store maps them,
`wcoj_core.store.segments`, and gives no advice of its own). The naive oracle
(`tests/oracle.py`) and the audit stay the independent checks.

* `native` — the compiled module, loaded (or built once into a cache when stale);
* `keys` — order-preserving search keys (packed integers, or bytes);
* `multiplicity` — checked products and sums of multiplicities (never a silent int64 wrap);
* `layer` — consolidated sorted rows and the lookups and key ranges a step makes on them
  (built in memory, or opened from memory-mapped arrays without a pass over them; a directory
  of the first column when a call probes many keys);
* `index` — a trace in memory as base + recent layers (`TraceIndex`), and what an epoch reads
  (`EpochLayers`: old state, new state, the epoch's changes);
* `step` — one step of a rule: count and pick in one pass, propose (narrowed by the order
  filters) and validate in another;
* `join` — one delta rule, attribute at a time, step by step; bounded memory; `RuleTally`
  counts what every step did;
* `changes` — Arrow changes in and out, counts maintenance, output changes.
"""
