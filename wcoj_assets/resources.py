"""The one resource every asset, check and sensor uses: the state, the landing location, Spark.

`WcojResource` is configuration only until a step asks for something. `engine(topology)` is the
`wcoj_core.engine.Engine` over the state serving every query of the code location (so
arrangements are shared across queries), planned as the asset graph is (no size statistics) and
keeping each delta rule's output (the rule assets show them). An epoch over a local state and
local landed files needs no Spark: the engine reads and writes with pyarrow and numpy.

Spark starts only when a step needs it — landed files on remote storage or too big for the
driver's reader, a state on remote storage, the executors deployment, the Spark SQL check, a
downstream asset reading an output as a DataFrame — through `starter()`, a
`wcoj_core.session.SparkStarter` that logs one line saying why. The resource owns the session it
starts: it stops it when the run ends (a session that was already running, such as a test's, is
left alone). Its settings are wcoj's defaults (`wcoj_core.spark.DEFAULT_CONF`), then the
``spark_config`` of the optional dagster-pyspark `LazyPySparkResource` given as ``pyspark`` (the
settings users already keep there; its ``spark.master`` picks the master), then ``spark_conf``.

Paths are resolved when used, never at import: a relative `storage` or `landing` is relative to
the working directory of the process that runs the step. Either may be set in Dagster run config
or from an `EnvVar` in `build_definitions`; `master` takes a cluster URL (``spark://host:7077``,
``yarn``) to run the same code on a cluster.
"""

from __future__ import annotations

import atexit
import gc
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr

from wcoj_assets.checks import CheckReporting
from wcoj_core.session import SparkStarter
from wcoj_core.store.location import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from wcoj_assets.specs import Topology
    from wcoj_core.engine import Engine

DEFAULT_STORAGE = ".wcoj/state"
DEFAULT_LANDING = ".wcoj/landing"
# The binary-join recomputation runs on one epoch in this many (a full Spark SQL recompute of the
# query: on a large graph it costs far more than the epoch it checks).
CHECK_EVERY = 30
LOG = logging.getLogger("wcoj")


def resolve(path: str) -> str:
    """An absolute local path for a local one (a ``file:`` URI's path); remote URIs unchanged.

    >>> resolve("s3a://bucket/state")
    's3a://bucket/state'
    >>> resolve("/data/state")
    '/data/state'
    """
    where = Location.of(path)
    return where.absolute() if where.local else path


def spark_settings(
    master: str, spark_conf: Mapping[str, str], pyspark_config: Mapping[str, Any] | None
) -> tuple[str, dict[str, str]]:
    """The master and settings of the session: dagster-pyspark's ``spark_config`` (nested keys
    flattened, its ``spark.master`` taking the master), then `spark_conf`.

    >>> spark_settings("local[*]", {"spark.a": "1"}, {"spark": {"master": "local[2]", "b": 2}})
    ('local[2]', {'spark.b': '2', 'spark.a': '1'})
    """
    conf: dict[str, str] = {}
    for key, value in _flatten(pyspark_config or {}):
        conf[key] = str(value)
    master = conf.pop("spark.master", master)
    conf.update(spark_conf)
    return master, conf


def _flatten(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out += _flatten(value, name)
        else:
            out.append((name, value))
    return out


_EXIT_FREEZE: list[bool] = []


def freeze_heap_at_exit() -> None:
    """Make this process's exit skip the collector's last pass over the whole heap (once per
    process; at exit only, so a long-lived process collects as before).

    A run process holds Dagster, pandas, pyarrow and pandera: at exit CPython's last garbage
    collection walks every object they made, a large share of a one-epoch run (measured by
    ``wcoj-bench dagster-run``). ``gc.freeze()`` in an exit handler moves the heap out of the
    collector's reach just before that pass; the operating system frees the memory. Exit
    handlers run last registered first: this one, registered when the step starts, runs after
    those registered later and before those registered earlier (the logging's flush), which
    still run as usual.
    """
    if not _EXIT_FREEZE:
        _EXIT_FREEZE.append(True)
        atexit.register(gc.freeze)


class OwnedStarter(SparkStarter):
    """A `SparkStarter` that remembers whether it started the session itself (then its owner
    stops it), and sends its one line to whichever log is current."""

    def __init__(self, master: str, conf: Mapping[str, str]) -> None:
        super().__init__(master, conf, app_name="wcoj-dagster", announce=self._say)
        self.owned = False
        self.log: Callable[[str], None] = LOG.info

    def _say(self, line: str) -> None:
        self.log(line)

    def __call__(self, reason: str) -> SparkSession:
        if not self.started:
            from pyspark.sql import SparkSession

            self.owned = SparkSession.getActiveSession() is None
        return super().__call__(reason)

    def stop(self) -> None:
        """Stop the session if this starter started it."""
        if self.started and self.owned:
            self.log("stopping the Spark session this run started")
            self("stopping").stop()
            self._session = None
            self.owned = False


class WcojResource(ConfigurableResource):
    """The state directory, the landing location and Spark (when needed) of the wcoj pipeline."""

    master: str = Field(
        default="local[*]", description="Spark master URL: local[*] or a cluster's URL."
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark settings (key -> value)."
    )
    storage: str = Field(
        default=DEFAULT_STORAGE,
        description="State directory (manifests, batches, arrangements): a local path (relative "
        "to the working directory) or any URI Spark can write, e.g. hdfs://... or s3a://...",
    )
    landing: str = Field(
        default=DEFAULT_LANDING,
        description="Where incoming changes land: <landing>/<relation>/<epoch key>/<files>.",
    )
    check_every: int = Field(
        default=CHECK_EVERY,
        ge=1,
        description="Run the full binary-join recomputation (matches_binary_join) on one "
        "epoch in every check_every (epochs check_every - 1, 2 * check_every - 1, ...); a "
        "run's op config `binary_join: true` checks its last epoch whatever the cadence.",
    )
    check_reporting: CheckReporting = Field(
        default=CheckReporting.AUTO,
        description="Which partitions of a run over a range get a check evaluation of their "
        "own: auto (every partition its own status for ranges of at most 100 epochs, news "
        "beyond), every (each evaluated partition: one event per check and partition) or news "
        "(failures, and recoveries of partitions whose latest evaluation failed; the range's "
        "result summarizes the rest, which Dagster shows SKIPPED).",
    )
    empty_epochs: bool = Field(
        default=False,
        description="Whether an epoch with nothing landed is normal: applied as an epoch "
        "without changes. By default its update_triples check fails, naming the folder, and "
        "nothing is applied.",
    )
    deployment: str = Field(
        default="auto",
        description="Where the join kernel runs: auto (the driver, within the memory budget, "
        "when the state is local; else Spark's executors), driver, or executors.",
    )
    memory: str | None = Field(
        default=None,
        description="The memory budget of the process running a step, e.g. 4g: every stage of "
        "an epoch streams in pieces that fit it and spills the rest to the state's scratch "
        "folder (default: a quarter of the machine's memory).",
    )
    # A dagster-pyspark `LazyPySparkResource` (or anything with a ``spark_config``). Typed by its
    # base class so that loading the code location imports no pyspark: pandera, for one, imports
    # pyspark.pandas whenever pyspark is loaded, a cost an epoch on the driver need not pay.
    pyspark: ConfigurableResource | None = Field(
        default=None,
        description="dagster-pyspark's LazyPySparkResource, whose spark_config supplies Spark "
        "settings (this resource still owns and stops the session).",
    )

    _starter: OwnedStarter | None = PrivateAttr(default=None)
    _engines: dict[Any, Any] = PrivateAttr(default_factory=dict)

    def storage_path(self) -> str:
        return resolve(self.storage)

    def landing_path(self) -> str:
        return resolve(self.landing)

    def starter(self) -> OwnedStarter:
        """The run's Spark starter: the session is made on its first use, with a reason."""
        if self._starter is None:
            config = getattr(self.pyspark, "spark_config", None) if self.pyspark else None
            master, conf = spark_settings(self.master, self.spark_conf, config)
            self._starter = OwnedStarter(master, conf)
        return self._starter

    def spark(self, reason: str = "a Spark session was asked for") -> SparkSession:
        """The process's SparkSession, started now (logged with `reason`) if need be."""
        return self.starter()(reason)

    def engine(self, topology: Topology, *, create: bool = True) -> Engine:
        """The engine over the state serving every query of `topology` (one per resource)."""
        from wcoj_core.engine import Engine

        key = (
            self.storage_path(),
            topology.specs,
            tuple(topology.meanings.items()),
            self.deployment,
            self.memory,
        )
        if key not in self._engines:
            self._engines[key] = Engine(
                self.starter(),
                self.storage_path(),
                list(topology.queries),
                relations=topology.meanings,
                sizes={},
                keep_rules=True,
                deployment=self.deployment,
                create=create,
                memory=self.memory,
            )
        return self._engines[key]

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._starter is not None:
            self._starter.stop()


def wcoj_resource(**values: Any) -> WcojResource:
    """A `WcojResource` whose field *defaults* are `values`.

    Dagster applies the values given to a resource's constructor as one default for its whole
    config: run config naming any field (``check_every`` in the launchpad, say) would send every
    other field back to the class default — ``storage`` to ``.wcoj/state`` of whatever directory
    the run starts in. Making the values field defaults keeps them under partial run config.
    An `EnvVar` is passed to the constructor instead (Dagster resolves it at run time), and so is
    a nested resource (``pyspark``).
    """
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__annotations__": annotations}
    direct: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, EnvVar | ConfigurableResource):
            direct[name] = value
            continue
        field = WcojResource.model_fields[name]
        annotations[name] = field.annotation
        namespace[name] = Field(default=value, description=field.description)
    cls = type("WcojResource", (WcojResource,), namespace)
    return cls(**direct)
