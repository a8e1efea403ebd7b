"""wcoj's benchmarks, their report page and a local Spark cluster: the ``wcoj-bench`` command.

Not part of the product: `wcoj_core` and `wcoj_assets` never import this package. It uses their
public names only, and holds the baselines wcoj is measured against (recompute and binary-delta
epochs, Spark SQL, neighbour arrays, DuckDB, Kùzu, scipy), which the product does not need.

* `wcoj_bench.cli` — ``wcoj-bench epochs|static|curve|cold|idle|backfill|report|cluster``;
* `wcoj_bench.workload` and `wcoj_bench.epochs` — the same epochs through recompute,
  binary-delta and wcoj (its relation a set, and a bag);
* `wcoj_bench.static` — one whole graph counted by wcoj and the alternatives;
* `wcoj_bench.curves` — seconds per epoch against graph size and epoch size;
* `wcoj_bench.cold` — whole processes, exec to exit: ``wcoj apply``, a Spark SQL recompute,
  opening the state; `wcoj_bench.idle` — epochs back to back and minutes apart on the
  executors; both on graphs and states `wcoj_bench.prepared` makes and caches, with the small
  programs of `wcoj_bench.probes`;
* `wcoj_bench.measure` — Spark's metrics, memory, whole processes, exact agreement;
* `wcoj_bench.backfill` and `wcoj_bench.hollow` — a Dagster backfill against the CLI's engine,
  and the same asset graph with empty bodies;
* `wcoj_bench.report`, `wcoj_bench.page`, `wcoj_bench.page_processes`, `wcoj_bench.machine` —
  ``docs/benchmarks.md`` from the saved JSON of each run, with the machine it ran on;
* `wcoj_bench.cluster` — a Spark standalone cluster on 127.0.0.1 from the installed pyspark.
"""
