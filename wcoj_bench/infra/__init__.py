"""What the benchmark parts (`wcoj_bench.parts`) measure with.

* `measure` — Spark's metrics, memory, whole processes, exact agreement between methods;
* `machine` — facts about the machine and the Spark session a part ran on;
* `workload` — an initial state and epochs of changes, from any input;
* `prepared` — graphs, epoch files and built states the process parts run on, cached; `probes` —
  the small programs they run as fresh processes (``python -m wcoj_bench.infra.probes``);
* `hollow` — the pipeline's asset graph with empty bodies: what Dagster itself costs;
* `cluster` — a Spark standalone cluster on 127.0.0.1 from the installed pyspark (``wcoj-bench
  cluster up|status|down``; the cluster parts and the cluster tests run on it).
"""
