"""The Dagster code location of wcoj: epoch partitions, one step per epoch range, every asset.

* `definitions` — `build_definitions(specs, name=...)` and the default `defs`, loaded lazily
  (``wcoj_epoch_job``, the landing, rebuild and automation sensors, the ``wcoj`` resource and
  ``wcoj_outputs`` IO manager; with a name, each named after it); `component` — the same as the
  Dagster component `WcojComponent`, configured by a ``defs.yaml`` and named after its folder;
* `specs` — `QuerySpec`, the default spec (``triangles`` over ``edge``), the relations' meanings
  and the arrangements the plans imply; `graph` — every asset, its lineage and its spec;
  `epochs` — epoch numbers as daily partition keys from a first day;
* `pipeline` — the one step: read, check, apply each epoch in one engine pass, report;
  `report` — each asset's figures per epoch; `checks` — the checks and how their per-partition
  results reach Dagster; `provenance` — `current_history`, the sensor rebuilding what a
  correction left stale, and the automation of assets of yours; `schemas` — pandera schemas;
* `outputs` — a query's output or change for downstream assets, in the type they annotate
  (Arrow, pandas, polars with no JVM; Spark);
* `landing_read` — finding and reading landing folders; `sensors` — the landing sensor;
* `resources` — `WcojResource` (state, landing, Spark when needed); `landing_write` and
  `demo` — writing a landing zone and running the demo; `instance` — the SQLite and Postgres instances,
  and the Dagster settings every process creating or executing runs needs.

Importing this package does no I/O, reads no environment and starts no Spark.
"""
