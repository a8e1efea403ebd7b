"""The one step: every asset of the code location, made by one engine pass per epoch.

`epochs_asset(graph, ...)` is ONE partitioned ``@multi_asset`` holding every asset spec and
check spec of the graph (`wcoj_assets.graph`, `wcoj_assets.checks`). It cannot be subset (the
engine advances every arrangement of an epoch together) and its backfill policy is a single run,
so a backfill of any range of epochs is one run and one step. For the run's epochs, oldest
first, the step:

1. **reads** each relation's landing folder (`wcoj_assets.intake`: pyarrow for local files,
   Spark only for remote or very large ones) and checks every landed row with pandera
   (``update_triples``); any failure fails the step before anything is applied, reported per
   relation;
2. **applies** each epoch with ``Engine.apply(t, changes, replace=True)``: one pass and one
   manifest commit per epoch, replacing what the epoch held (a re-run, a correction); stale
   epochs before it are derived again first, and reported materialized too;
3. **reports** every asset's materialization for every epoch with its own figures
   (`wcoj_assets.report`, through ``context.add_asset_metadata(partition_key=)``), then one
   ``MaterializeResult`` per asset in topological order, then the checks
   (`wcoj_assets.checks.report`).

A failure in the middle of a range keeps what was committed: those epochs are reported
materialized (``AssetMaterialization(partition=)``) and the step fails, naming the epoch.
"""

import time as clock
from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetExecutionContext,
    AssetMaterialization,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from pydantic import Field

from wcoj_assets import checks as ck
from wcoj_assets import provenance
from wcoj_assets.epochs import Epochs
from wcoj_assets.graph import EpochGraph, Role
from wcoj_assets.report import LandedFigures, epoch_metadata
from wcoj_assets.resources import WcojResource, freeze_heap_at_exit
from wcoj_core.errors import InputError, WcojError

OP_NAME = "wcoj_epochs"


class EpochConfig(Config):
    """Run config of the step (the launchpad's ``ops: {wcoj_epochs: {config: ...}}``)."""

    binary_join: bool = Field(
        default=False,
        description="Also run matches_binary_join (the full Spark SQL recomputation) on the "
        "run's last epoch, whatever the cadence (check_every).",
    )


def epochs_of(context: Any, epochs: Epochs) -> list[tuple[str, int]]:
    """The (key, epoch) pairs of the step's partitions, oldest first; Failure for a bad key."""
    try:
        pairs = [(key, epochs.number(key)) for key in context.partition_keys]
    except InputError as e:
        raise Failure(description=str(e), allow_retries=False) from e
    return sorted(pairs, key=lambda p: p[1])


def epochs_asset(
    graph: EpochGraph,
    *,
    name: str = OP_NAME,
    op_tags: dict[str, Any] | None = None,
    pool: str | None = None,
    description: str | None = None,
    backfill_policy: BackfillPolicy | None = None,
) -> Any:
    """The step making every asset of `graph` (see the module)."""

    @multi_asset(
        name=name,
        specs=graph.ordered_specs(),
        check_specs=graph.check_specs,
        partitions_def=graph.epochs.partitions(),
        backfill_policy=backfill_policy or BackfillPolicy.single_run(),
        can_subset=False,
        op_tags=op_tags,
        pool=pool,
        description=description
        or "Applies each epoch of the run, oldest first, in one engine pass and one commit per "
        "epoch, and reports every asset and check of every epoch.",
    )
    def _epochs(
        context: AssetExecutionContext, config: EpochConfig, wcoj: WcojResource
    ) -> Iterator[Any]:
        yield from EpochRun(context, config, wcoj, graph).run()

    return _epochs


class EpochRun:
    """One execution of the step (see the module)."""

    def __init__(
        self,
        context: AssetExecutionContext,
        config: EpochConfig,
        wcoj: WcojResource,
        graph: EpochGraph,
    ) -> None:
        self.context, self.config, self.wcoj, self.graph = context, config, wcoj, graph
        self.book = ck.CheckBook()
        self.metadata: dict[str, dict[str, dict[str, Any]]] = {}  # partition -> asset -> entries
        # One log line per epoch, written at the end as ONE event: an event per epoch would be a
        # write per epoch to the event log (the materializations carry the same figures).
        self.lines: list[str] = []

    def run(self) -> Iterator[Any]:
        context, graph = self.context, self.graph
        freeze_heap_at_exit()
        starter = self.wcoj.starter()
        starter.log = context.log.info
        pairs = epochs_of(context, graph.epochs)
        changes, landed = yield from self._read(pairs)
        engine = self.wcoj.engine(graph.topology)
        done: list[tuple[str, int]] = []
        for key, t in pairs:
            try:
                result = engine.apply(t, changes[t], replace=True)
            except Exception as e:
                if self.lines:
                    context.log.info("\n".join(self.lines))
                yield from self._committed(done)
                what = str(e) if isinstance(e, WcojError) else f"{type(e).__name__}: {e}"
                raise Failure(
                    description=f"epoch {t} ({key}) was not applied: {what}"
                    + (f"; epochs {done[0][0]}..{done[-1][0]} were committed" if done else ""),
                    allow_retries=False,
                ) from e
            for rebuilt in result.rebuilt:
                yield from self._rebuilt(engine, rebuilt)
            self._epoch(engine, key, result, landed.get(t))
            done.append((key, t))
        self._later(engine, pairs)
        if self.lines:
            context.log.info("\n".join(self.lines))
        for key, _t in pairs:
            for name, entries in self.metadata[key].items():
                context.add_asset_metadata(entries, asset_key=graph.key(name), partition_key=key)
        summary = {} if len(pairs) == 1 else {"epochs": f"{pairs[0][1]}..{pairs[-1][1]}"}
        for info in graph.infos:
            yield MaterializeResult(asset_key=graph.key(info.name), metadata=summary)
        self._binary_joins(engine, pairs)
        yield from ck.report(
            context, graph.check_specs, self.book, [k for k, _ in pairs], self.wcoj.check_reporting
        )

    # -- reading -------------------------------------------------------------------------------
    def _read(self, pairs: Sequence[tuple[str, int]]) -> Iterator[Any]:
        """Every relation's landed rows at every epoch, checked; on any problem, the
        ``update_triples`` results and a failed step (nothing applied)."""
        from wcoj_assets.intake import read_epoch
        from wcoj_assets.schemas import landed_problems
        from wcoj_core.traces import relation_columns

        graph, landing = self.graph, self.wcoj.landing_path()
        starter = self.wcoj.starter()
        changes: dict[int, dict[str, Any]] = {t: {} for _, t in pairs}
        landed: dict[int, dict[str, LandedFigures]] = {t: {} for _, t in pairs}
        errors: dict[str, dict[str, list[str]]] = {rel: {} for rel in graph.topology.relations}
        for key, t in pairs:
            for rel, arity in graph.topology.relations.items():
                start = clock.perf_counter()
                try:
                    read = read_epoch(landing, rel, arity, key, starter)
                except InputError as e:
                    errors[rel][key] = [f"epoch {t} ({key}): {e}"]
                    continue
                found = (
                    []
                    if read.rows is None
                    else landed_problems(read.rows, relation_columns(arity), t)
                )
                if found:
                    errors[rel][key] = [f"epoch {t} ({key}): {p}" for p in found]
                    continue
                if read.rows is not None:
                    # Streamed landed files are read again, a batch at a time, as they land.
                    streamed = hasattr(read.rows, "batches")
                    changes[t][rel] = read.rows.batches() if streamed else read.rows
                landed[t][rel] = LandedFigures(
                    read.files, read.bytes, read.count, read.ignored, clock.perf_counter() - start
                )
        for info in graph.of_role(Role.CHANGES):
            check = AssetCheckKey(graph.key(info.name), ck.UPDATE_TRIPLES)
            for key, _t in pairs:
                problems = errors[info.relation or ""].get(key, [])
                self.book.add(
                    check,
                    key,
                    ck.Outcome(
                        not problems,
                        {"depth": "schema and data", "errors": problems[: ck.EXAMPLES]},
                        "; ".join(problems[:3]) or None,
                    ),
                )
        bad = {rel: [e for es in by_key.values() for e in es] for rel, by_key in errors.items()}
        bad = {rel: es for rel, es in bad.items() if es}
        if bad:
            # Only the update_triples results: nothing else was done.
            specs = [s for s in graph.check_specs if s.name == ck.UPDATE_TRIPLES]
            yield from ck.report(
                self.context, specs, self.book, [k for k, _ in pairs], self.wcoj.check_reporting
            )
            raise Failure(
                description="bad changes, nothing applied: "
                + "; ".join(f"{rel}: {es[0]}" for rel, es in bad.items()),
                metadata={rel: MetadataValue.json(es[: ck.EXAMPLES]) for rel, es in bad.items()},
                allow_retries=False,
            )
        return changes, landed

    # -- after each epoch ----------------------------------------------------------------------
    def _epoch(self, engine: Any, key: str, result: Any, landed: Any) -> None:
        """Record an applied epoch: its assets' metadata and its per-epoch checks."""
        graph, t = self.graph, result.epoch
        self.metadata[key] = epoch_metadata(graph, engine, result, landed)
        self._epoch_checks(engine, key, result, rebuilt=False)
        out = ", ".join(
            f"{q} {result.count(q):,} ({result.total(q):+,})" for q in graph.topology.plans
        )
        changed = sum(r.changed for r in result.relations.values())
        self.lines.append(
            f"epoch {t} ({key}): {changed:,} tuples changed; {out}; "
            f"{result.metrics.total_seconds:.3f} s on the {result.metrics.deployment}"
        )

    def _epoch_checks(self, engine: Any, key: str, result: Any, rebuilt: bool) -> None:
        graph, t = self.graph, result.epoch
        for info in graph.of_role(Role.SNAPSHOT):
            check = AssetCheckKey(graph.key(info.name), ck.NON_NEGATIVE)
            self.book.add(check, key, ck.non_negative(info.relation or "", result))
        for info in graph.of_role(Role.QUERY_CHANGES):
            asset = graph.key(info.name)
            self.book.add(AssetCheckKey(asset, ck.CURRENT), key, provenance.current(t, rebuilt))
            outcome = ck.delta_rules(engine, info.query or "", t)
            self.book.add(AssetCheckKey(asset, ck.DELTA_RULES), key, outcome)
        if rebuilt:
            for info in graph.of_role(Role.CHANGES):
                check = AssetCheckKey(graph.key(info.name), ck.UPDATE_TRIPLES)
                self.book.add(
                    check, key, ck.Outcome(True, {"rederived": "from the stored changes"})
                )

    def _rebuilt(self, engine: Any, result: Any) -> Iterator[AssetMaterialization]:
        """A stale epoch the engine derived again before the run's: its materializations."""
        key = self.graph.epochs.key(result.epoch)
        self.context.log.info(
            f"epoch {result.epoch} ({key}) was stale (derived from changes corrected since): "
            "derived again first"
        )
        metadata = epoch_metadata(self.graph, engine, result, None)
        self._epoch_checks(engine, key, result, rebuilt=True)
        for info in self.graph.infos:
            yield AssetMaterialization(
                asset_key=self.graph.key(info.name), partition=key, metadata=metadata[info.name]
            )

    def _committed(self, done: Sequence[tuple[str, int]]) -> Iterator[AssetMaterialization]:
        """After a failure: the epochs already committed, reported materialized."""
        for key, _t in done:
            for info in self.graph.infos:
                yield AssetMaterialization(
                    asset_key=self.graph.key(info.name),
                    partition=key,
                    metadata=self.metadata[key][info.name],
                )

    # -- after the range -------------------------------------------------------------------------
    def _later(self, engine: Any, pairs: Sequence[tuple[str, int]]) -> None:
        """Later epochs the run left stale (a corrected epoch was re-run): named in the
        changes' metadata, and reported failing `current_history`."""
        graph = self.graph
        last_key, last = pairs[-1]
        later = [e for e in engine.stale() if e > last]
        if not later:
            return
        first = graph.epochs.key(later[0])
        corrected = ", ".join(k for k, _ in pairs)
        for info in graph.of_role(Role.CHANGES):
            self.metadata[last_key][info.name] |= {
                "stale_later_epochs": len(later),
                "backfill_from": first,
            }
        for info in graph.of_role(Role.QUERY_CHANGES):
            check = AssetCheckKey(graph.key(info.name), ck.CURRENT)
            for e in later:
                self.book.add(check, graph.epochs.key(e), provenance.stale(e, corrected, first))
        self.context.log.warning(
            f"epochs {later[0]}..{later[-1]} were derived before {corrected} changed: they fail "
            f"`{ck.CURRENT}` until rebuilt (the sensor {provenance.REBUILD_SENSOR} does it, or a "
            f"backfill from {first})"
        )

    def _binary_joins(self, engine: Any, pairs: Sequence[tuple[str, int]]) -> None:
        """`matches_binary_join` on the run's last due epoch (its last epoch on demand): a run
        over a range recomputes the output once at most, as of the latest epoch it can."""
        graph, every = self.graph, self.wcoj.check_every
        due = [t for _, t in pairs if ck.due(t, every)]
        chosen = pairs[-1][1] if self.config.binary_join else (due[-1] if due else None)
        for info in graph.of_role(Role.OUTPUT):
            query = graph.topology.query(info.query or "")
            check = AssetCheckKey(graph.key(info.name), ck.BINARY_JOIN)
            for key, t in pairs:
                if t != chosen:
                    self.book.add(check, key, ck.not_due(t, every))
                    continue
                try:
                    outcome = ck.binary_join(engine, query, t, key)
                except Exception as e:  # a check that cannot run fails, saying why
                    what = f"{type(e).__name__}: {e}"
                    outcome = ck.Outcome(False, {"checked": True, "error": what}, what)
                self.book.add(check, key, outcome)
