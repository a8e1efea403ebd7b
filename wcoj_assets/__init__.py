"""The Dagster code location of wcoj: epoch partitions, shared arrangements, delta-rule assets.

* `definitions` — `build_definitions(specs, ...)` and the default `defs` (``wcoj_epoch_job``, the
  landing sensor, a stopped daily schedule, the ``wcoj`` resource, the in-process executor);
* `specs` — `QuerySpec`, the default spec (``triangles`` over ``edge``) and the asset graph the
  plans imply; `epochs` — epoch numbers as daily partition keys;
* `relations`, `arrangements`, `queries` — the asset factories; `steps` — what their steps share;
* `checks` and `reference` — the binary-join correctness check; `schemas` — pandera schemas;
* `intake` — finding and reading landing folders; `sensors` — sensor and schedule;
* `resources` — `WcojResource` (Spark, state, landing); `landing` and `demo` — writing a landing
  zone and running the demo.

Importing this package does no I/O, reads no environment and starts no Spark.
"""
