"""What the pipeline maintains, as Spark DataFrames for code of your own.

The query assets store their data themselves (in the state directory, never through an IO
manager), so a downstream asset reads them through `outputs_io_manager`, the IO manager of
``<q>`` and ``<q>_deltas``, registered as the resource ``wcoj_outputs``. An asset of your own
that takes one of them as a parameter receives a DataFrame whose columns are the query's head
variables, then ``diff`` (the signed multiplicity; for an output, how many times the tuple is
in it)::

    @asset(partitions_def=defs_epochs.partitions())   # the same epochs: one epoch per run
    def top_triangles(triangles: DataFrame) -> ...:   # columns a, b, c, diff
        ...

* ``<q>`` gives the output as of the epoch; ``<q>_deltas`` its change at the epoch.
* A downstream asset without partitions (or one reading several epochs) gets ``<q>`` as of the
  last epoch it reads; the change is given one epoch at a time only, and asking for several is
  an error that says so.

`read_output` does the same from Python, given a `wcoj_core.history.History` (for instance
``WcojResource(...).history(topology.queries)``). Either reads the state lazily: nothing is
computed until the DataFrame is used. Importing this module starts no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagster import Failure, InputContext, IOManager, OutputContext, io_manager

from wcoj_assets.epochs import Epochs
from wcoj_assets.specs import head_columns, query_deltas_asset_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from wcoj_core.history import History
    from wcoj_core.query.ir import Query

OUTPUTS_IO_MANAGER = "wcoj_outputs"


def read_output(history: History, query: Query, epoch: int, *, change: bool = False) -> DataFrame:
    """`query`'s output as of `epoch` (or with `change`, its change at `epoch`), with the
    query's head variables as column names, then ``diff``."""
    from pyspark.sql import functions as F

    from wcoj_core.traces import output_trace_name
    from wcoj_core.updates import DIFF, relation_columns

    stored = relation_columns(len(query.head))
    if change:
        df = history.changes_or_empty(output_trace_name(query.name), stored, epoch)
    else:
        df = history.output(query.name, epoch)
    names = head_columns(query)
    return df.select(*[F.col(c).alias(n) for c, n in zip(stored, names, strict=True)], DIFF)


class _Outputs(IOManager):
    """Loads a query asset's partition for a downstream asset; stores nothing."""

    def __init__(self, wcoj: Any, queries: Sequence[Query], epochs: Epochs) -> None:
        self._wcoj = wcoj
        self._queries = queries
        self._epochs = epochs
        self._assets: Mapping[str, tuple[Query, bool]] = {
            **{q.name: (q, False) for q in queries},
            **{query_deltas_asset_name(q.name): (q, True) for q in queries},
        }

    def handle_output(self, context: OutputContext, obj: object) -> None:
        """Nothing to store: the asset's step wrote its batches to the state itself."""

    def load_input(self, context: InputContext) -> DataFrame:
        asset = context.asset_key.to_user_string()
        query, change = self._assets[asset]
        keys = context.asset_partition_keys if context.has_asset_partitions else []
        if not keys:
            raise Failure(f"{asset} is read per epoch: the reading asset needs epoch partitions")
        if change and len(keys) > 1:
            raise Failure(
                f"{asset} is the change at one epoch, but {len(keys)} epochs were asked for "
                f"({keys[0]}..{keys[-1]}); give the reading asset the same epoch partitions, "
                f"or read `{query.name}` (the output as of an epoch)"
            )
        last = max(keys, key=self._epochs.number)
        history = self._wcoj.history(self._queries)
        return read_output(history, query, self._epochs.number(last), change=change)


def outputs_io_manager(*, queries: Sequence[Query], epochs: Epochs) -> Any:
    """The IO manager of the query assets of `queries` over `epochs` (needs resource ``wcoj``)."""

    @io_manager(
        required_resource_keys={"wcoj"},
        description="Gives a query's output as of an epoch (`<q>`), or its change at an epoch "
        "(`<q>_deltas`), to downstream assets as a Spark DataFrame with the query's head "
        "variables as columns, then diff.",
    )
    def wcoj_outputs(init_context: Any) -> _Outputs:
        return _Outputs(init_context.resources.wcoj, queries, epochs)

    return wcoj_outputs
