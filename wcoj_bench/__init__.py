"""wcoj's benchmarks, their report page and a local Spark cluster: the ``wcoj-bench`` command.

Not part of the product: `wcoj_core` and `wcoj_assets` never import this package. It uses their
public names only, and holds the baselines wcoj is measured against (recompute and binary-delta
epochs, Spark SQL, neighbour arrays, DuckDB, Kùzu, scipy), which the product does not need.

* `wcoj_bench.cli` — ``wcoj-bench epochs|static|curve|cold|idle|backfill|report|cluster``;
* `wcoj_bench.parts` — the benchmark parts, one module each: epochs, static, curves, cold,
  dagster_run, idle, scale, backfill;
* `wcoj_bench.infra` — what they measure with: metrics and processes (`measure`), the machine,
  workloads, prepared graphs and states, the probes run as fresh processes, the hollow asset
  graph, a local Spark cluster;
* `wcoj_bench.page` — ``docs/benchmarks.md``'s generated regions, rendered from each part's
  saved JSON; `wcoj_bench.report` (``make benchmarks``) runs the parts and renders the page.
"""
