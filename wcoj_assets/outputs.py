"""What the pipeline maintains, for code of your own: whole or lazy, in the form an annotation names.

`outputs_io_manager` (``wcoj_outputs``, or ``<name>_outputs``) gives ``<q>`` (the output as of
the epoch) and ``<q>_deltas`` (its change) as the head variables' columns then ``diff`` (an
aggregate's ``count`` or ``sum_<x>``), in the annotated type: whole (``pyarrow.Table``, pandas
or polars ``DataFrame``; weighed first against the memory budget, `BudgetError` if it would not
fit), lazy (``pyarrow.RecordBatchReader``, polars ``LazyFrame``, a DuckDB relation) or a Spark
``DataFrame``. Every form reads exactly the files the manifest lists, each checked against its
digest; ``dict[str, <form>]`` gets every epoch the run reads, by partition key. `read_output`
does the same from Python, given an `wcoj_core.engine.Engine`. See docs/dagster.md.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from enum import Enum
from itertools import permutations
from typing import TYPE_CHECKING, Any, get_args, get_origin

import pyarrow as pa
from dagster import Failure, InputContext, IOManager, OutputContext, io_manager

from wcoj_assets.graph import OUTPUTS_IO_MANAGER, AssetInfo, EpochGraph, Role
from wcoj_assets.specs import head_columns
from wcoj_core.budget import BudgetError, format_size, process_limit
from wcoj_core.errors import WcojError
from wcoj_core.lineage import epochs_of as epochs_held
from wcoj_core.traces import DIFF

if TYPE_CHECKING:
    from wcoj_core.engine import Engine
    from wcoj_core.query.ir import Query
    from wcoj_core.store.manifest import Batch, Trace

__all__ = ["OUTPUTS_IO_MANAGER", "Form", "outputs_io_manager", "read_output"]

# What a whole form holds at its peak, per byte of its columns: one stored batch read as it is
# (its columns, and a file's bytes as read), several summed into one (their columns, the layer
# they make and its sort); pandas copies the columns once more.
READ_COPIES = 1.5
SUMMED_COPIES = 5.5
# The widest change whose column orders are each tried for the one it is sorted in.
ORDERS_TRIED = 4
LAZY_FORMS = "pyarrow.RecordBatchReader, polars.LazyFrame or duckdb.DuckDBPyRelation"


class Form(Enum):
    """What a reader asks for."""

    ARROW = "pyarrow.Table"
    PANDAS = "pandas.DataFrame"
    POLARS = "polars.DataFrame"
    SPARK = "pyspark.sql.DataFrame"
    BATCHES = "pyarrow.RecordBatchReader"
    LAZY_POLARS = "polars.LazyFrame"
    DUCKDB = "duckdb.DuckDBPyRelation"

    @staticmethod
    def of(annotation: Any) -> Form:
        """The form an input's annotation names (Arrow when it names none).

        >>> import pyarrow as pa, pandas as pd, polars as pl
        >>> Form.of(pa.Table), Form.of(pd.DataFrame), Form.of(None)
        (<Form.ARROW: 'pyarrow.Table'>, <Form.PANDAS: 'pandas.DataFrame'>, <Form.ARROW: 'pyarrow.Table'>)
        >>> Form.of(pa.RecordBatchReader), Form.of(pl.LazyFrame), Form.of(pl.DataFrame)
        (<Form.BATCHES: 'pyarrow.RecordBatchReader'>, <Form.LAZY_POLARS: 'polars.LazyFrame'>, <Form.POLARS: 'polars.DataFrame'>)
        """
        package = (getattr(annotation, "__module__", "") or "").split(".")[0].lstrip("_")
        name = getattr(annotation, "__name__", "") or ""
        named = (
            f for f in Form if f.value.startswith(f"{package}.") and f.value.endswith(f".{name}")
        )
        return next(named, Form.ARROW)

    @property
    def whole(self) -> bool:
        """Whether the form holds the whole output in memory."""
        return self in (Form.ARROW, Form.PANDAS, Form.POLARS)


def read_output(
    engine: Engine, query: Query, epoch: int, *, change: bool = False, form: Form = Form.SPARK
) -> Any:
    """`query`'s output as of `epoch` (or with `change`, its change at `epoch`), with the
    query's head variables as column names, then ``diff`` (an aggregate's value, named after
    it, for an aggregate query's output), in `form` (see the module)."""
    from wcoj_core import aggregates
    from wcoj_core.state_read import listed
    from wcoj_core.traces import output_trace_name, relation_columns

    stored = relation_columns(len(query.head))
    names = head_columns(query)
    trace_name = output_trace_name(query.name)
    value = DIFF if change else aggregates.value_name(query)
    if form is Form.SPARK:
        from pyspark.sql import functions as F

        from wcoj_core.state_read import changes_at

        df = changes_at(engine, trace_name, epoch) if change else engine.output(query.name, epoch)
        cols = [F.col(c).alias(n) for c, n in zip(stored, names, strict=True)]
        return df.select(*cols, F.col(DIFF).alias(value))
    trace, batches = listed(engine, trace_name, epoch, change=change)
    what = f"{query.name}{'_deltas' if change else ''} at epoch {epoch}"
    if not form.whole:
        return _lazy(engine, trace, batches, [*names, value], form)
    _fits(engine, what, form, batches, len(names) + 1)
    if query.aggregate is not None and not change:
        table = aggregates.table(engine, query, epoch)
    else:
        table = whole_table(engine, trace_name, epoch, change=change)
    table = table.rename_columns([*names, value])
    if form is Form.PANDAS:
        return table.to_pandas()
    if form is Form.POLARS:
        import polars as pl

        return pl.from_arrow(table)
    return table


def _fits(engine: Engine, what: str, form: Form, batches: list[Batch], columns: int) -> None:
    """Raise `BudgetError` when `batches` (their rows of `columns` longs), read whole in `form`,
    would not fit the engine's budget (or the process's own limit, when smaller)."""
    rows = sum(b.rows for b in batches)
    copies = (READ_COPIES if len(batches) <= 1 else SUMMED_COPIES) + (form is Form.PANDAS)
    need = int(rows * columns * 8 * copies)
    budget = engine.budget.bytes, f"the memory budget of {engine.budget.describe()}"
    limit = process_limit()
    if limit is not None and limit[0] < budget[0]:
        budget = limit[0], f"{limit[1]} of {format_size(limit[0])}"
    if need > budget[0]:
        raise BudgetError(
            f"{what} as a {form.value}: {rows:,} rows would take {format_size(need)} read "
            f"whole, over {budget[1]}; annotate the input as a lazy form, which reads it a "
            f"piece at a time ({LAZY_FORMS}), or raise the memory budget (`memory` of the "
            "resource)"
        )


def _lazy(engine: Engine, trace: Trace, batches: list[Batch], names: list[str], form: Form) -> Any:
    """Stored batches in a lazy `form`, their columns named `names` (see the module)."""
    stored = [*trace.columns, DIFF]
    schema = pa.schema([pa.field(n, pa.int64()) for n in names])
    if form is Form.BATCHES:

        def pieces() -> Iterator[pa.RecordBatch]:
            for b in batches:
                for chunk in engine.batches.iter_chunks(b, trace.columns, digests=True):
                    arrays = [chunk.column(c).cast(pa.int64()) for c in stored]
                    yield pa.RecordBatch.from_arrays(arrays, schema=schema)

        return pa.RecordBatchReader.from_batches(schema, pieces())
    uris = [uri for b in batches for uri in engine.batches.checked_uris(b)]
    if form is Form.LAZY_POLARS:
        import polars as pl

        frame = (
            pl.scan_parquet(uris) if uris else pl.LazyFrame(schema={c: pl.Int64 for c in stored})
        )
        return frame.select([pl.col(c).alias(n) for c, n in zip(stored, names, strict=True)])
    import duckdb

    config: dict[str, Any] = {
        "memory_limit": f"{engine.budget.bytes}B",
        "temp_directory": tempfile.gettempdir(),
    }
    con = duckdb.connect(config=config)
    relation = con.read_parquet(uris) if uris else con.from_arrow(schema.empty_table())
    columns = ", ".join(f'"{c}" AS "{n}"' for c, n in zip(stored, names, strict=True))
    return relation.project(columns) if uris else relation


def whole_table(engine: Engine, name: str, epoch: int, *, change: bool = False) -> pa.Table:
    """A trace whole (`wcoj_core.state_read`): its change at `epoch` (`change`) or its output as of
    `epoch`, one row per tuple, from exactly the manifest's files, each checked. One batch is given
    as stored once one pass confirms it consolidated and sorted (`wcoj_core.arrow.consolidated`);
    several are summed and sorted (`read_table`, `change_table`)."""
    from wcoj_core.arrow import consolidated
    from wcoj_core.state_read import change_table, listed, read_table

    trace, batches = listed(engine, name, epoch, change=change)
    if len(batches) == 1:
        (batch,) = batches
        tables = engine.batches.verified_tables(
            batch.path, trace.columns, batch.files, batch.rows, batch.time
        )
        orders = permutations(trace.columns) if len(trace.columns) <= ORDERS_TRIED else []
        if tables and any(consolidated(tables, order) for order in orders):
            names = [*trace.columns, DIFF]
            schema = pa.schema([pa.field(n, pa.int64()) for n in names])  # as read_table's
            return pa.concat_tables([t.select(names).cast(schema) for t in tables])
    return change_table(engine, name, epoch) if change else read_table(engine, name, epoch)


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
        epochs = self._graph.epochs
        engine = self._wcoj.engine(self._graph.topology, create=False)
        # Several epochs a day: each epoch of the days the state holds, by folder (day/HHMM).
        held = set(epochs_held(engine.store.current())) if epochs.per_day > 1 else None
        ts = sorted(t for k in keys for t in epochs.span(k) if held is None or t in held)
        ts = ts or [epochs.span(max(keys, key=epochs.number))[-1]]
        if change and len(ts) > 1 and not each:
            raise Failure(
                f"{asset} is the change at one epoch, but {len(ts)} epochs were asked for "
                f"({epochs.folder(ts[0])}..{epochs.folder(ts[-1])}); annotate the parameter "
                f"dict[str, pa.Table] (each epoch's, by partition, or day/HHMM with several "
                f"epochs a day), or read `{query.name}` (the output as of an epoch)"
            )
        last = epochs.folder(ts[-1])
        form = Form.of(get_args(annotation)[-1] if each else annotation)
        if form is Form.SPARK:
            reader = context.upstream_output.asset_key if context.upstream_output else None
            who = context.asset_key.to_user_string() if reader is None else asset
            self._wcoj.starter().log = context.log.info
            self._wcoj.spark(f"an asset reads {who} at {last} as a Spark DataFrame")
        try:
            if each:
                return {
                    epochs.folder(t): read_output(engine, query, t, change=change, form=form)
                    for t in ts
                }
            return read_output(engine, query, ts[-1], change=change, form=form)
        except WcojError as e:  # a whole form refused, memory run out, a damaged batch: one line
            lazy = f"; lazy forms: {LAZY_FORMS}" if isinstance(e, MemoryError) else ""
            raise Failure(f"{e}{lazy}") from e


def outputs_io_manager(
    *, graph: EpochGraph, outputs: Sequence[AssetInfo], resource_key: str = "wcoj"
) -> Any:
    """The IO manager of the query assets `outputs` of `graph` (needs the resource
    `resource_key`)."""

    @io_manager(
        required_resource_keys={resource_key},
        description="Gives a query's output as of an epoch (`<q>`), or its change at an epoch "
        "(`<q>_deltas`), to downstream assets with the query's head variables as columns, then "
        "diff: whole (a pyarrow Table, pandas or polars DataFrame, refused when it would not "
        "fit in memory) or lazy (a pyarrow RecordBatchReader, polars LazyFrame or DuckDB "
        "relation) with no JVM, or a Spark DataFrame, as the input's annotation says.",
    )
    def wcoj_outputs(init_context: Any) -> _Outputs:
        return _Outputs(getattr(init_context.resources, resource_key), graph, outputs)

    return wcoj_outputs
