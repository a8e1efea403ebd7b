"""Helpers for the Dagster pipeline tests: random update streams, landing files, a test pipeline.

Imported by the test modules of this folder (``from wcoj_support import ...``); it defines no
fixtures.

`Pipeline` is the code location built for temporary folders and the test SparkSession, a Dagster
instance (ephemeral unless one is given), and the `Engine` over the same state, so a test can
run epochs the way the sensor or a backfill does and then read every output directly. Its runs
have the settings every process that runs the pipeline has (`wcoj_assets.instance.dagster_env`).
`updates` makes epochs of undirected edge changes that never delete an absent edge; `oracle`
evaluates a query on the accumulated edges with the pure-Python `naive_eval`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterInstance, ExecuteInProcessResult
from oracle import naive_eval
from pyspark.sql import DataFrame, SparkSession

from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.epochs import EPOCH_START, Epochs, epoch_key
from wcoj_assets.instance import dagster_settings
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import DEFAULT_SPECS, QuerySpec, Topology
from wcoj_core.engine import Engine

Changes = list[tuple[tuple[int, int], int]]
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def updates(
    seed: int, epochs: int, nodes: int = 9, inserts: int = 9, deletes: int = 2
) -> list[Changes]:
    """Epochs of undirected edge changes (both directions), deleting only present edges.

    The first epoch only inserts, so it can be landed as a SNAP edge list.
    """
    rng = random.Random(seed)
    present: Counter[tuple[int, int]] = Counter()
    out: list[Changes] = []
    for epoch in range(epochs):
        ups: Changes = []
        for _ in range(inserts):
            a, b = sorted(rng.sample(range(nodes), 2))
            present[(a, b)] += 1
            ups += [((a, b), 1), ((b, a), 1)]
        live = sorted(e for e, m in present.items() if m > 0)
        for a, b in rng.sample(live, deletes if epoch else 0):
            present[(a, b)] -= 1
            ups += [((a, b), -1), ((b, a), -1)]
        out.append(ups)
    return out


def accumulated(history: Sequence[Changes], upto: int) -> dict[tuple[int, ...], int]:
    edge: Counter[tuple[int, ...]] = Counter()
    for ups in history[: upto + 1]:
        for t, d in ups:
            edge[t] += d
    return {t: m for t, m in edge.items() if m}


def oracle(topo: Topology, query: str, history: Sequence[Changes], upto: int) -> Counter:
    return naive_eval(topo.query(query), {"edge": accumulated(history, upto)})


def set_edges(history: Sequence[Changes], upto: int) -> dict[tuple[int, ...], int]:
    """An undirected set relation after epochs ``0..upto`` of landed edge changes: per epoch, an
    edge named in either direction, any number of times, is present after it when its summed
    diff is positive, absent when negative, unchanged at zero; self-loops are dropped."""
    present: set[tuple[int, ...]] = set()
    for ups in history[: upto + 1]:
        summed: Counter[tuple[int, ...]] = Counter()
        for (a, b), d in ups:
            if a != b:
                summed[(a, b)] += d
                summed[(b, a)] += d
        for edge, total in summed.items():
            if total > 0:
                present.add(edge)
            elif total < 0:
                present.discard(edge)
    return {e: 1 for e in present}


def set_oracle(topo: Topology, query: str, history: Sequence[Changes], upto: int) -> Counter:
    """`query` over the undirected set relation `edge` (`set_edges`), from scratch."""
    return naive_eval(topo.query(query), {"edge": set_edges(history, upto)})


def symmetric(history: Sequence[Changes]) -> list[Changes]:
    """Edge changes landed in one direction as the undirected relation holds them: each also
    reversed, self-loops dropped."""
    return [[(e, d) for (a, b), d in ups if a != b for e in ((a, b), (b, a))] for ups in history]


def multiset(df: DataFrame) -> Counter:
    out: Counter = Counter()
    for row in df.collect():
        out[tuple(row[:-1])] += row[-1]
    return Counter({k: v for k, v in out.items() if v})


def write_landing(
    landing: Path,
    n: int,
    changes: Changes,
    fmt: str,
    name: str = "part",
    clear: bool = True,
    start: str = EPOCH_START,
) -> Path:
    """Write one epoch's edge changes as ``<landing>/edge/<key>/<name>.<fmt>``; return the file.

    With `clear`, the epoch folder's other files are removed first (a corrected epoch). Epoch
    ``n`` is the day ``n`` days after `start`. The file is written beside the landing folder,
    then moved in, as a producer lands files: a sensor never sees it half written.
    """
    folder = landing / "edge" / epoch_key(n, start)
    folder.mkdir(parents=True, exist_ok=True)
    if clear:
        for old in folder.iterdir():
            if old.name != f"{name}.{fmt}":
                old.unlink()
    final = folder / f"{name}.{fmt}"
    path = landing.parent / f".{landing.name}-{final.name}.writing"
    if fmt == "csv":
        lines = ["src,dst,diff"] + [f"{a},{b},{d}" for (a, b), d in changes]
        path.write_text("\n".join(lines) + "\n")
    elif fmt == "txt":
        assert all(d == 1 for _, d in changes), "a SNAP edge list carries insertions only"
        path.write_text("# edges\n" + "".join(f"{a}\t{b}\n" for (a, b), _ in changes))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "src": pa.array([a for (a, _), _ in changes], pa.int64()),
                "dst": pa.array([b for (_, b), _ in changes], pa.int64()),
                "diff": pa.array([d for _, d in changes], pa.int64()),
            }
        )
        pq.write_table(table, path)
    else:  # pragma: no cover
        raise ValueError(fmt)
    return path.replace(final)


@dataclass(frozen=True)
class Check:
    asset: str
    name: str
    passed: bool
    partition: str | None
    metadata: dict[str, Any]
    description: str | None = None


class Pipeline:
    """The code location over temporary folders, with an ephemeral instance and an Engine."""

    def __init__(
        self,
        spark: SparkSession | None,
        root: Path,
        specs: Sequence[QuerySpec] = DEFAULT_SPECS,
        deployment: str = "auto",
        instance: DagsterInstance | None = None,
        undirected: Sequence[str] = (),
        start: str = EPOCH_START,
        sets: Sequence[str] = (),
        bags: Sequence[str] = (),
        check_every: int | None = None,
        **options: Any,
    ):
        self.spark = spark
        self.deployment = deployment
        self.landing = root / "landing"
        self.storage = root / "state"
        self.topology = Topology.of(specs, undirected, sets, bags)
        self.epochs = Epochs(start)
        master = spark.sparkContext.master if spark is not None else "local[2]"
        self.defs = build_definitions(
            specs,
            storage=str(self.storage),
            landing=str(self.landing),
            spark_master=master,
            start=start,
            undirected=undirected,
            sets=sets,
            bags=bags,
            check_every=check_every,
            **options,
        )
        self.job = self.defs.resolve_job_def(JOB_NAME)
        self.instance = instance if instance is not None else DagsterInstance.ephemeral()
        self.resource = WcojResource(
            master=master,
            storage=str(self.storage),
            landing=str(self.landing),
            deployment=deployment,
        )

    @property
    def engine(self) -> Engine:
        """The engine over the pipeline's state (a new one each time: it reads what is there)."""
        return WcojResource(
            master=self.resource.master,
            storage=self.resource.storage,
            landing=self.resource.landing,
            deployment=self.deployment,
        ).engine(self.topology)

    def land(
        self, n: int, changes: Changes, fmt: str = "csv", name: str = "part", clear: bool = True
    ) -> Path:
        return write_landing(self.landing, n, changes, fmt, name, clear, self.epochs.start)

    def run(
        self,
        epochs: int | tuple[int, int],
        assets: Sequence[str] | None = None,
        run_config: dict[str, Any] | None = None,
        job: Any = None,
    ) -> ExecuteInProcessResult:
        """Run the epoch job (or `job`) for one epoch or, for ``(first, last)``, a range in one
        run.

        A pipeline built with a `deployment` other than ``auto`` sets it in every run's resource
        config.
        """
        selection = None if assets is None else [AssetKey(a) for a in assets]
        if self.deployment != "auto":
            config = dict(run_config or {})
            resources = dict(config.get("resources", {}))
            wcoj = dict(resources.get("wcoj", {}))
            wcoj["config"] = {**wcoj.get("config", {}), "deployment": self.deployment}
            config["resources"] = {**resources, "wcoj": wcoj}
            run_config = config
        key = self.epochs.key
        if isinstance(epochs, int):
            scope: dict[str, Any] = {"partition_key": key(epochs)}
        else:
            first, last = epochs
            scope = {"tags": {RANGE_START: key(first), RANGE_END: key(last)}}
        with dagster_settings():
            return (job or self.job).execute_in_process(
                instance=self.instance,
                raise_on_error=False,
                asset_selection=selection,
                run_config=run_config,
                **scope,
            )

    def output(self, query: str, epoch: int) -> Counter:
        return multiset(self.engine.output(query, epoch))

    def traces(self) -> dict[str, Any]:
        """Every trace's batches in the current manifest (what a failed run must not change)."""
        return dict(self.engine.store.current().traces)

    def generation(self) -> int:
        """The state's manifest generation: each commit adds one."""
        return self.engine.store.current().generation


def checks(result: ExecuteInProcessResult) -> list[Check]:
    out = []
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            e = event.event_specific_data
            out.append(
                Check(
                    e.asset_key.to_user_string(),
                    e.check_name,
                    e.passed,
                    e.partition,
                    {k: v.value for k, v in e.metadata.items()},
                    e.description,
                )
            )
    return out


def materializations(result: ExecuteInProcessResult) -> list[Any]:
    return [
        event.event_specific_data.materialization
        for event in result.all_events
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION
    ]


def failures(result: ExecuteInProcessResult) -> list[str]:
    return [
        f"{event.step_key}: {event.event_specific_data.error.message}"
        for event in result.all_events
        if event.event_type == DagsterEventType.STEP_FAILURE
    ]


__all__ = [
    "Changes",
    "Check",
    "Pipeline",
    "accumulated",
    "checks",
    "failures",
    "materializations",
    "multiset",
    "oracle",
    "set_edges",
    "set_oracle",
    "symmetric",
    "updates",
    "write_landing",
]
