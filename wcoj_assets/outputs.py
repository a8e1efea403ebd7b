"""What the pipeline maintains, for code of your own: Arrow, pandas, polars or Spark, by annotation.

The step stores its data itself (the state directory, never through an IO manager), so a
downstream asset reads a query's output through `outputs_io_manager`, the IO manager of ``<q>``
and ``<q>_deltas`` (registered as ``wcoj_outputs``, or ``<name>_outputs`` for a named pipeline).
An asset of your own that takes one of them as a parameter receives the query's head variables
as columns, then ``diff`` (the signed multiplicity; for an output, how many times the tuple is
in it; an aggregate query's ``<q>`` names it after the aggregate, ``count`` or ``sum_<x>``: each
group's value, read from its arrangement), in the type its annotation names, as dagster-duckdb's and dagster-deltalake's IO
managers do::

    @asset(partitions_def=..., automation_condition=follows_epochs())   # the same epochs
    def top_vertices(triangles_deltas: pa.Table) -> ...:                 # a, b, c, diff
        ...

* ``pyarrow.Table`` (also an unannotated parameter), pandas ``DataFrame`` or polars
  ``DataFrame``: read with pyarrow from the files the state's manifest lists — no JVM starts;
* a Spark ``DataFrame`` (``pyspark.sql.DataFrame``): read lazily by Spark, which the resource
  starts saying why (``starting Spark ...: <asset> reads <input> as a Spark DataFrame``).

``<q>`` gives the output as of the epoch; ``<q>_deltas`` its change at the epoch. A parameter
annotated ``dict[str, <type>]`` gets every epoch the run reads, by partition key — what an asset
with a single-run backfill policy reads when one run fills a range of epochs (an asset added
after the epochs ran: `wcoj_assets.provenance.follows_epochs`); otherwise a downstream asset
without partitions (or one reading several epochs) gets ``<q>`` as of the last epoch it reads,
and the change is given one epoch at a time only, asking for several being an error that says
so. `read_output` does the same from Python, given an `wcoj_core.engine.Engine`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, get_args, get_origin

import pyarrow as pa
from dagster import Failure, InputContext, IOManager, OutputContext, io_manager

from wcoj_assets.graph import OUTPUTS_IO_MANAGER, AssetInfo, EpochGraph, Role
from wcoj_assets.specs import head_columns
from wcoj_core.traces import DIFF

if TYPE_CHECKING:
    from wcoj_core.engine import Engine
    from wcoj_core.query.ir import Query

__all__ = ["OUTPUTS_IO_MANAGER", "Form", "outputs_io_manager", "read_output"]


class Form(Enum):
    """What a reader asks for."""

    ARROW = "pyarrow.Table"
    PANDAS = "pandas.DataFrame"
    POLARS = "polars.DataFrame"
    SPARK = "pyspark.sql.DataFrame"

    @staticmethod
    def of(annotation: Any) -> Form:
        """The form an input's annotation names (Arrow when it names none).

        >>> import pyarrow as pa, pandas as pd
        >>> Form.of(pa.Table), Form.of(pd.DataFrame), Form.of(None)
        (<Form.ARROW: 'pyarrow.Table'>, <Form.PANDAS: 'pandas.DataFrame'>, <Form.ARROW: 'pyarrow.Table'>)
        """
        module = getattr(annotation, "__module__", "") or ""
        name = getattr(annotation, "__name__", "") or ""
        if name == "DataFrame" and module.startswith("pyspark"):
            return Form.SPARK
        if name == "DataFrame" and module.startswith("pandas"):
            return Form.PANDAS
        if name == "DataFrame" and module.startswith("polars"):
            return Form.POLARS
        return Form.ARROW


def read_output(
    engine: Engine, query: Query, epoch: int, *, change: bool = False, form: Form = Form.SPARK
) -> Any:
    """`query`'s output as of `epoch` (or with `change`, its change at `epoch`), with the
    query's head variables as column names, then ``diff``, in `form`."""
    from wcoj_core import aggregates
    from wcoj_core.traces import output_trace_name, relation_columns

    stored = relation_columns(len(query.head))
    names = head_columns(query)
    trace = output_trace_name(query.name)
    value = DIFF if change else aggregates.value_name(query)
    if form is Form.SPARK:
        from pyspark.sql import functions as F

        from wcoj_core.state_read import changes_at

        df = changes_at(engine, trace, epoch) if change else engine.output(query.name, epoch)
        cols = [F.col(c).alias(n) for c, n in zip(stored, names, strict=True)]
        return df.select(*cols, F.col(DIFF).alias(value))
    from wcoj_core.state_read import read_table

    if change:
        table = stored_change(engine, trace, epoch)
    elif query.aggregate is not None:
        table = aggregates.table(engine, query, epoch)
    else:
        table = read_table(engine, trace, epoch)
    table = table.rename_columns([*names, value])
    if form is Form.PANDAS:
        return table.to_pandas()
    if form is Form.POLARS:
        import polars as pl

        return pl.from_arrow(table)
    return table


def stored_change(engine: Engine, name: str, epoch: int) -> pa.Table:
    """A trace's stored change at `epoch`, as `wcoj_core.state_read.change_table` gives it (one row
    per tuple, non-zero ``diff``, sorted; read from exactly the files the manifest lists, each
    checked against its size, digest and rows) without sorting it again: the engine writes a
    change's batch in that order, so its files, concatenated, are the table once one pass over
    its columns confirms it (`wcoj_core.arrow.consolidated`). A batch that is not (none is
    written so) is read by `change_table`."""
    from wcoj_core.arrow import consolidated
    from wcoj_core.state_read import change_batches, change_table

    trace, batches = change_batches(engine, name, epoch)
    if len(batches) != 1:
        return change_table(engine, name, epoch)
    (batch,) = batches
    tables = engine.files.verified_tables(
        batch.path, trace.columns, batch.files, batch.rows, batch.time
    )
    names = [*trace.columns, DIFF]
    if not tables or not consolidated(tables, trace.columns):
        return change_table(engine, name, epoch)
    schema = pa.schema([pa.field(n, pa.int64()) for n in names])  # as change_table's
    return pa.concat_tables([t.select(names).cast(schema) for t in tables])


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

    def load_input(self, context: InputContext) -> Any:
        info = self._assets[context.asset_key]
        asset = context.asset_key.to_user_string()
        query = self._graph.topology.query(info.query or "")
        change = info.role is Role.QUERY_CHANGES
        keys = context.asset_partition_keys if context.has_asset_partitions else []
        if not keys:
            raise Failure(f"{asset} is read per epoch: the reading asset needs epoch partitions")
        annotation = getattr(context.dagster_type, "typing_type", None)
        each = get_origin(annotation) is dict  # dict[str, <form>]: every epoch, by partition
        if change and len(keys) > 1 and not each:
            raise Failure(
                f"{asset} is the change at one epoch, but {len(keys)} epochs were asked for "
                f"({keys[0]}..{keys[-1]}); annotate the parameter dict[str, pa.Table] (each "
                f"epoch's, by partition), or read `{query.name}` (the output as of an epoch)"
            )
        epochs = self._graph.epochs
        last = max(keys, key=epochs.number)
        form = Form.of(get_args(annotation)[-1] if each else annotation)
        if form is Form.SPARK:
            reader = context.upstream_output.asset_key if context.upstream_output else None
            who = context.asset_key.to_user_string() if reader is None else asset
            self._wcoj.starter().log = context.log.info
            self._wcoj.spark(f"an asset reads {who} at {last} as a Spark DataFrame")
        engine = self._wcoj.engine(self._graph.topology, create=False)
        if each:
            return {
                k: read_output(engine, query, epochs.number(k), change=change, form=form)
                for k in sorted(keys, key=epochs.number)
            }
        return read_output(engine, query, epochs.number(last), change=change, form=form)


def outputs_io_manager(
    *, graph: EpochGraph, outputs: Sequence[AssetInfo], resource_key: str = "wcoj"
) -> Any:
    """The IO manager of the query assets `outputs` of `graph` (needs the resource
    `resource_key`)."""

    @io_manager(
        required_resource_keys={resource_key},
        description="Gives a query's output as of an epoch (`<q>`), or its change at an epoch "
        "(`<q>_deltas`), to downstream assets with the query's head variables as columns, then "
        "diff: a pyarrow Table, pandas or polars DataFrame (no JVM) or a Spark DataFrame, as "
        "the input's annotation says.",
    )
    def wcoj_outputs(init_context: Any) -> _Outputs:
        return _Outputs(getattr(init_context.resources, resource_key), graph, outputs)

    return wcoj_outputs
