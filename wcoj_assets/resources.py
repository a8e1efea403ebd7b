"""The one resource every asset, check and sensor uses: Spark, the state and the landing location.

`WcojResource` is configuration only until a step asks for something: `spark()` returns the
process's SparkSession (the active one if there is one — tests and the in-process executor share
a single JVM per process — else one built for `master` with `spark_conf`), and `history()` an
epoch-addressed `History` over ONE `Engine` serving every query, so arrangements are shared across
queries. Paths are resolved when used, never at import: a relative `storage` or `landing` is
relative to the working directory of the process that runs the step.

`storage` and `landing` may be set in Dagster run config or from an `EnvVar` in
`build_definitions`; `master` takes a cluster URL (``spark://host:7077``, ``yarn``) to run the same
code on a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field, PrivateAttr

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from wcoj_core.history import History
    from wcoj_core.query.ir import Query

DEFAULT_STORAGE = ".wcoj/state"
DEFAULT_LANDING = ".wcoj/landing"


def resolve(path: str) -> str:
    """An absolute local path for a path without a URL scheme; URLs unchanged.

    >>> resolve("s3a://bucket/state")
    's3a://bucket/state'
    >>> resolve("/data/state")
    '/data/state'
    """
    if "://" in path:
        return path
    return os.path.abspath(path)


class WcojResource(ConfigurableResource):
    """Spark session, state directory and landing location of the wcoj pipeline."""

    master: str = Field(
        default="local[*]", description="Spark master URL: local[*] or a cluster's URL."
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark settings (key -> value)."
    )
    storage: str = Field(
        default=DEFAULT_STORAGE,
        description="State directory (traces, manifests): a local path (relative to the working "
        "directory) or any URI Spark can write, e.g. hdfs://... or s3a://...",
    )
    landing: str = Field(
        default=DEFAULT_LANDING,
        description="Where incoming changes land: <landing>/<relation>/<epoch key>/<files>.",
    )
    check_every: int = Field(
        default=1,
        ge=1,
        description="Run the binary-join correctness check on epochs divisible by this.",
    )

    deployment: str = Field(
        default="auto",
        description="Where the join kernel runs each step: auto (the driver when the state is "
        "local and the epoch fits its limits, else Spark's executors), driver, or executors.",
    )

    _histories: dict[Any, Any] = PrivateAttr(default_factory=dict)

    def spark(self) -> SparkSession:
        """The process's SparkSession (created on first use)."""
        from wcoj_core import spark as wspark

        return wspark.session(self.master, self.spark_conf, app_name="wcoj-dagster")

    def storage_path(self) -> str:
        return resolve(self.storage)

    def landing_path(self) -> str:
        return resolve(self.landing)

    def history(self, queries: Sequence[Query]) -> History:
        """A `History` over one Engine serving all `queries` (cached for this resource)."""
        from wcoj_core.engine import Engine
        from wcoj_core.history import History

        key = (self.storage_path(), tuple(queries), self.deployment)
        if key not in self._histories:
            engine = Engine(
                self.spark(),
                self.storage_path(),
                list(queries),
                sizes={},
                deployment=self.deployment,
            )
            self._histories[key] = History(engine)
        return self._histories[key]


def wcoj_resource(**values: Any) -> WcojResource:
    """A `WcojResource` whose field *defaults* are `values`.

    Dagster applies the values given to a resource's constructor as one default for its whole
    config: run config naming any field (``check_every`` in the launchpad, say) would send every
    other field back to the class default — ``storage`` to ``.wcoj/state`` of whatever directory
    the run starts in. Making the values field defaults keeps them under partial run config.
    An `EnvVar` is passed to the constructor instead (Dagster resolves it at run time).
    """
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__annotations__": annotations}
    env: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, EnvVar):
            env[name] = value
            continue
        field = WcojResource.model_fields[name]
        annotations[name] = field.annotation
        namespace[name] = Field(default=value, description=field.description)
    cls = type("WcojResource", (WcojResource,), namespace)
    return cls(**env)
