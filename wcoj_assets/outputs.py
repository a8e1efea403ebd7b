"""What the pipeline maintains, as Spark DataFrames for code of your own.

The step stores its data itself (the state directory, never through an IO manager), so a
downstream asset reads a query's output through `outputs_io_manager`, the IO manager of ``<q>``
and ``<q>_deltas``, registered as the resource ``wcoj_outputs``. An asset of your own that takes
one of them as a parameter receives a DataFrame whose columns are the query's head variables,
then ``diff`` (the signed multiplicity; for an output, how many times the tuple is in it)::

    @asset(partitions_def=Epochs("2024-03-01").partitions())   # the same epochs
    def top_triangles(triangles: DataFrame) -> ...:            # columns a, b, c, diff
        ...

* ``<q>`` gives the output as of the epoch; ``<q>_deltas`` its change at the epoch.
* A downstream asset without partitions (or one reading several epochs) gets ``<q>`` as of the
  last epoch it reads; the change is given one epoch at a time only, and asking for several is
  an error that says so.

`read_output` does the same from Python, given an `wcoj_core.engine.Engine` (for instance
``WcojResource(...).engine(topology)``). Either reads the state lazily: nothing is computed until
the DataFrame is used; Spark starts (through the resource, saying why) when it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dagster import Failure, InputContext, IOManager, OutputContext, io_manager

from wcoj_assets.graph import OUTPUTS_IO_MANAGER, AssetInfo, EpochGraph, Role
from wcoj_assets.specs import head_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from wcoj_core.engine import Engine
    from wcoj_core.query.ir import Query

__all__ = ["OUTPUTS_IO_MANAGER", "outputs_io_manager", "read_output"]


def read_output(engine: Engine, query: Query, epoch: int, *, change: bool = False) -> DataFrame:
    """`query`'s output as of `epoch` (or with `change`, its change at `epoch`), with the
    query's head variables as column names, then ``diff``."""
    from pyspark.sql import functions as F

    from wcoj_core.reading import changes_at
    from wcoj_core.traces import DIFF, output_trace_name, relation_columns

    stored = relation_columns(len(query.head))
    if change:
        df = changes_at(engine, output_trace_name(query.name), epoch)
    else:
        df = engine.output(query.name, epoch)
    names = head_columns(query)
    return df.select(*[F.col(c).alias(n) for c, n in zip(stored, names, strict=True)], DIFF)


class _Outputs(IOManager):
    """Loads a query asset's partition for a downstream asset; stores nothing."""

    def __init__(self, wcoj: Any, graph: EpochGraph, outputs: Sequence[AssetInfo]) -> None:
        self._wcoj = wcoj
        self._graph = graph
        self._assets = {graph.key(i.name): i for i in outputs}
        for info in outputs:
            q = graph.topology.query(info.query or "")
            changes = next(c for c in graph.of_role(Role.QUERY_CHANGES) if c.query == q.name)
            self._assets[graph.key(changes.name)] = changes

    def handle_output(self, context: OutputContext, obj: object) -> None:
        """Nothing to store: the step wrote its batches to the state itself."""

    def load_input(self, context: InputContext) -> DataFrame:
        info = self._assets[context.asset_key]
        asset = context.asset_key.to_user_string()
        query = self._graph.topology.query(info.query or "")
        change = info.role is Role.QUERY_CHANGES
        keys = context.asset_partition_keys if context.has_asset_partitions else []
        if not keys:
            raise Failure(f"{asset} is read per epoch: the reading asset needs epoch partitions")
        if change and len(keys) > 1:
            raise Failure(
                f"{asset} is the change at one epoch, but {len(keys)} epochs were asked for "
                f"({keys[0]}..{keys[-1]}); give the reading asset the same epoch partitions, "
                f"or read `{query.name}` (the output as of an epoch)"
            )
        epochs = self._graph.epochs
        last = max(keys, key=epochs.number)
        engine = self._wcoj.engine(self._graph.topology, create=False)
        return read_output(engine, query, epochs.number(last), change=change)


def outputs_io_manager(*, graph: EpochGraph, outputs: Sequence[AssetInfo]) -> Any:
    """The IO manager of the query assets `outputs` of `graph` (needs resource ``wcoj``)."""

    @io_manager(
        required_resource_keys={"wcoj"},
        description="Gives a query's output as of an epoch (`<q>`), or its change at an epoch "
        "(`<q>_deltas`), to downstream assets as a Spark DataFrame with the query's head "
        "variables as columns, then diff.",
    )
    def wcoj_outputs(init_context: Any) -> _Outputs:
        return _Outputs(init_context.resources.wcoj, graph, outputs)

    return wcoj_outputs
