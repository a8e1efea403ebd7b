"""The benchmark parts: each one measurement, checked before it is timed, one ``wcoj-bench``
command, one region of ``docs/benchmarks.md`` (`wcoj_bench.report` runs them all).

* `epochs` — the same epochs through recompute, binary-delta and wcoj (its relation a set, and
  a bag);
* `static` — one whole graph counted by wcoj and the usual alternatives;
* `curves` — seconds per epoch against graph size and against epoch size;
* `cold` — whole processes, exec to exit: ``wcoj apply``, a Spark SQL recompute, opening the
  state;
* `dagster_run` — one epoch partition of the quick start per fresh ``dagster job execute``;
* `idle` — epochs back to back, then minutes apart, with the kernel in Spark's executors;
* `scale` — one memory budget at 20-40 M edges, whole processes;
* `backfill` (and its three sides, `backfill_sides`) — a single-run Dagster backfill against
  the CLI's engine.
"""
