"""The one step: every asset of the code location, made by one engine pass per epoch.

`epochs_asset(graph, ...)` is ONE partitioned ``@multi_asset`` holding every asset spec and
check spec of the graph (`wcoj_assets.graph`, `wcoj_assets.checks`), with a single-run backfill
policy, so a backfill of any range of epochs is one run and one step. It can be subset, as
dagster-dbt's and dagster-sling's steps can, so that Dagster 1.13 launches a backfill of any
selection from the asset graph (its check that every key of a step that cannot be subset
targets the same partitions compares subsets by a lazily counted field and refuses equal ones),
but the engine advances every arrangement of an epoch together: whatever the selection, the step
applies whole epochs and reports every asset it made (those not selected as
``AssetMaterialization`` events). For the run's epochs, oldest first, the step:

1. **reads** each relation's landing folder (`wcoj_assets.landing_read`: pyarrow for local files,
   Spark only for remote or very large ones) and checks every landed row (the reader, then
   `wcoj_assets.schemas.landed_problems`). Files too big to read at once are streamed and read
   once: each batch is checked as the engine lands it (`LandedStream.checked`), and a refused one
   stops that epoch's apply before anything of it is committed (`Refused`). An epoch whose
   files hold bad rows — or with nothing landed, unless the resource declares empty epochs
   normal — fails ``update_triples`` for that epoch, listing every bad row (up to
   `wcoj_assets.checks.BAD_ROWS`) with file, line and column, and neither it nor the epochs
   after it in the run are applied; the run itself ends without an error (a data problem, not
   a failure of the step: no stack trace, no other check failed), tagged ``wcoj/refused`` with
   the epoch's key (`REFUSED_TAG`, seen in the Runs list), its log saying why the epoch's other
   checks were skipped;
2. **applies** each epoch before it with ``Engine.apply(t, changes, replace=True)``: one pass
   and one manifest commit per epoch, replacing what the epoch held (a re-run, a correction);
   stale epochs before it are derived again first, and reported materialized too;
3. **reports** every asset's materialization for every applied epoch with its own figures
   (`wcoj_assets.report`, through ``context.add_asset_metadata(partition_key=)``), then one
   ``MaterializeResult`` per selected asset in topological order, then the checks
   (`wcoj_assets.checks.report`).

A failure of the engine in the middle of a range keeps what was committed: those epochs are
reported materialized (``AssetMaterialization(partition=)``) and the step fails, naming the
epoch.

**Verifying.** A run tagged ``wcoj/verify`` (`VERIFY_TAG`: the verify job's runs), or one that
selects checks and no asset (the UI's *Execute* on a check), applies and materializes nothing:
it runs the selected checks on the run's epochs as the state holds them (`EpochRun._verify`).

`EpochRun.run` is what `wcoj_assets.component.WcojComponent.execute` calls: a subclass of the
component may wrap it.
"""

import time as clock
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import replace
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
from wcoj_assets.instance import hold_connections
from wcoj_assets.landing_read import LandedStream, Refused, fingerprint, landed_files
from wcoj_assets.report import FINGERPRINT, LandedFigures, epoch_metadata, unit
from wcoj_assets.resources import WcojResource, freeze_heap_at_exit
from wcoj_core.errors import InputError, WcojError
from wcoj_core.traces import relation_trace_name

OP_NAME = "wcoj_epochs"
# The tag a run gets when an epoch's changes were refused: the epoch's key (see the Runs list).
REFUSED_TAG = "wcoj/refused"
# The tag of the verify job's runs: the run's epochs are checked as stored, none applied.
VERIFY_TAG = "wcoj/verify"


class EpochConfig(Config):
    """Run config of the step (the launchpad's ``ops: {wcoj_epochs: {config: ...}}``)."""

    binary_join: bool = Field(
        default=False,
        description="Also run matches_binary_join (the full Spark SQL recomputation) on the "
        "run's last epoch, whatever the cadence (check_every).",
    )


def epochs_of(context: Any, epochs: Epochs, day: Any = None) -> list[tuple[str, int]]:
    """The (key, epoch) pairs of the step's partitions, oldest first; Failure for a bad key.
    Several epochs a day: each epoch ``day(key)`` names, else the day's first."""
    try:
        keys = sorted(context.partition_keys, key=epochs.number)
    except InputError as e:
        raise Failure(description=str(e), allow_retries=False) from e
    if epochs.per_day == 1 or day is None:
        return [(key, epochs.number(key)) for key in keys]
    return [(key, t) for key in keys for t in day(key) or [epochs.number(key)]]


def epochs_asset(
    graph: EpochGraph,
    execute: Any,
    *,
    name: str = OP_NAME,
    op_tags: dict[str, Any] | None = None,
    pool: str | None = None,
    description: str | None = None,
    backfill_policy: BackfillPolicy | None = None,
    resource_key: str = "wcoj",
) -> Any:
    """The step making every asset of `graph` (see the module): its body is
    ``execute(context, config)``, an iterator of Dagster events (`EpochRun.run`), with the
    resource `resource_key` available."""

    @multi_asset(
        name=name,
        specs=graph.ordered_specs(),
        check_specs=graph.check_specs,
        partitions_def=graph.epochs.partitions(),
        backfill_policy=backfill_policy or BackfillPolicy.single_run(),
        can_subset=True,
        op_tags=op_tags,
        pool=pool,
        required_resource_keys={resource_key},
        description=description
        or "Applies each epoch of the run, oldest first, in one engine pass and one commit per "
        "epoch, and reports every asset and check of every epoch.",
    )
    def _epochs(context: AssetExecutionContext, config: EpochConfig) -> Iterator[Any]:
        yield from execute(context, config)

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
        self.selected = set(context.selected_asset_keys)
        # One log line per epoch, written at the end as ONE event: an event per epoch would be a
        # write per epoch to the event log (the materializations carry the same figures).
        self.lines: list[str] = []
        self.later_audits: list[tuple[AssetCheckKey, str, str, int]] = []
        # Epoch -> relation -> its streamed landed files and their check (`_read`).
        self.streamed: dict[int, dict[str, tuple[LandedStream, Any]]] = {}
        self.counted: dict[tuple[int, str], int] = {}  # (epoch, relation) -> streamed rows
        # Several epochs a day: the epochs the state holds; (day, relation) -> its files read.
        self.held: set[int] = set()
        self.day_files: dict[tuple[str, str], list[Any]] = {}

    def _pairs(self) -> list[tuple[str, int]]:
        """The run's (partition key, epoch) pairs (`epochs_of`); several epochs a day, each of a
        day's with a landing folder or held by the state (a folder removed since: applied
        empty)."""
        from wcoj_assets.landing_read import partition_folders
        from wcoj_core.lineage import epochs_of as held_epochs

        epochs, landing, topo = self.graph.epochs, self.wcoj.landing_path(), self.graph.topology
        if epochs.per_day > 1:
            with suppress(WcojError):  # no state yet: none held
                held = self.wcoj.engine(topo, create=False).store.current()
                self.held = set(held_epochs(held))

        def day(key: str) -> list[int]:
            found = {
                t for r in topo.relations for t in partition_folders(landing, r, key, epochs)[0]
            }
            return sorted(found | (self.held & set(epochs.span(key))))

        return epochs_of(self.context, epochs, day)

    def run(self) -> Iterator[Any]:
        context, graph = self.context, self.graph
        freeze_heap_at_exit()
        hold_connections(context.instance)
        starter = self.wcoj.starter()
        starter.log = context.log.info
        if context.run.tags.get(VERIFY_TAG) or not self.selected:  # the verify job, or checks
            yield from self._verify()
            return
        pairs = self._pairs()
        changes, landed, refused = self._read(pairs)
        # A day whose changes are refused is applied none of (nor are the days after it).
        applied = [(k, t) for k, t in pairs if refused is None or k < refused[0]]
        done: list[tuple[str, int]] = []
        if applied:
            engine = self.wcoj.engine(graph.topology)
            last_of = dict(applied)  # each day's last epoch: the one its metadata reports
            for key, t in applied:
                try:
                    self._check_before_rebuilds(engine, t, changes[t])
                    result = engine.apply(t, changes[t], replace=True)
                except Refused as e:  # streamed rows refused as they were landed
                    self._refused(pairs, key, t, {e.relation: e.lines})
                    refused = (key, t)
                    break
                except Exception as e:
                    if self.lines:
                        context.log.info("\n".join(self.lines))
                    yield from self._materialized(done)
                    what = str(e) if isinstance(e, WcojError) else f"{type(e).__name__}: {e}"
                    raise Failure(
                        description=f"epoch {t} ({key}) was not applied: {what}"
                        + (f"; epochs {done[0][0]}..{done[-1][0]} were committed" if done else ""),
                        allow_retries=False,
                    ) from e
                for rebuilt in result.rebuilt:
                    yield from self._rebuilt(engine, rebuilt)
                # The run's last epoch is audited while its events are written (below).
                last = (key, t) == applied[-1]
                self._epoch(engine, key, result, landed.get(t), last, t == last_of[key])
                done.append((key, t))
            if done:
                self._later(engine, done)
            if self.lines:
                context.log.info("\n".join(self.lines))
            with self._audit_meanwhile(engine):
                yield from self._reported(done, whole=len(done) == len(pairs))
            if done:
                self._binary_joins(engine, done)
        if refused is not None:
            key, t = refused
            later = sorted({k for k, _ in pairs if k > key})
            others = sorted(
                {c.name for c in context.selected_asset_check_keys} - {ck.UPDATE_TRIPLES}
            )
            context.instance.add_run_tags(context.run_id, {REFUSED_TAG: key})
            context.log.error(
                f"epoch {t} ({key}): its changes were refused (see the check "
                f"{ck.UPDATE_TRIPLES}); nothing of it"
                + (f" or of the later epochs of the run ({', '.join(later)})" if later else "")
                + " was applied, so its other checks were not evaluated (Skipped: "
                + ", ".join(others)
                + "). Fix or replace the files: the landing sensor runs the epoch again."
            )
        yield from ck.report(
            context, graph.check_specs, self.book, _keys(pairs), self.wcoj.check_reporting
        )

    # -- reading -------------------------------------------------------------------------------
    def _read(
        self, pairs: Sequence[tuple[str, int]]
    ) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, LandedFigures]], Any]:
        """Every relation's landed rows at every epoch up to the first refused one, checked;
        each relation's ``update_triples`` outcome at each epoch read; the first refused epoch
        as ``(key, t)`` (None when none was)."""
        from wcoj_assets.landing_read import bad_rows, landed_columns, read_epoch
        from wcoj_assets.schemas import arrow_problems, landed_problems
        from wcoj_core.traces import relation_columns

        graph, landing = self.graph, self.wcoj.landing_path()
        starter = self.wcoj.starter()
        changes: dict[int, dict[str, Any]] = {t: {} for _, t in pairs}
        landed: dict[int, dict[str, LandedFigures]] = {t: {} for _, t in pairs}
        for key, t in pairs:
            problems: dict[str, list[str]] = {}
            found: dict[str, Any] = {}
            folder = graph.epochs.folder(t)
            for rel, arity in graph.topology.relations.items():
                start = clock.perf_counter()
                try:
                    read = read_epoch(landing, rel, arity, folder, starter)
                except InputError as e:
                    files = [f.path for f in landed_files(landing, rel, folder).files]
                    rows = [r for f in files for r in bad_rows(f, arity, rel, ck.BAD_ROWS)]
                    problems[rel] = rows[: ck.BAD_ROWS] or [str(e)]
                    continue
                columns = relation_columns(arity)
                if isinstance(read.rows, LandedStream):
                    # Streamed: checked a batch at a time as the engine lands it, the files read
                    # once; a refusal then stops the apply (`Refused`) before anything commits.
                    def check(
                        batch: Any, seen: int, at: Any = (t, rel), columns: Any = columns
                    ) -> Any:
                        self.counted[at] = seen + batch.num_rows
                        return arrow_problems(batch, columns, at[0], seen)

                    self.streamed.setdefault(t, {})[rel] = (read.rows, check)
                    changes[t][rel] = read.rows.checked(check, ck.BAD_ROWS)
                elif read.rows is not None:
                    bad = landed_problems(read.rows, columns, t)
                    if bad:
                        problems[rel] = bad
                        continue
                    changes[t][rel] = read.rows
                found[rel] = read
                self.day_files.setdefault((key, rel), []).extend(read.paths)
                names = next((landed_columns(f.path) for f in read.paths), ())
                landed[t][rel] = LandedFigures(
                    tuple(f.name for f in read.paths),
                    read.bytes,
                    read.count,
                    read.ignored,
                    clock.perf_counter() - start,
                    fingerprint(read.paths) if read.paths else "",
                    names if len(names) == arity else (),
                )
            if (
                not problems
                and not any(r.paths for r in found.values())
                and not self.wcoj.empty_epochs
                and t not in self.held  # a folder removed since: the epoch is applied empty
            ):
                problems = {
                    rel: [
                        f"nothing landed in {landing}/{rel}/{folder}/: no epoch is applied "
                        "without changes unless empty epochs are declared normal "
                        "(empty_epochs: true)"
                    ]
                    for rel in graph.topology.relations
                }
            self._input_checks(key, t, problems)
            if problems:
                return changes, landed, (key, t)
        return changes, landed, None

    def _check_before_rebuilds(self, engine: Any, t: int, changes: dict[str, Any]) -> None:
        """When stale epochs before `t` will be derived again (and committed) before `t` is
        applied, `t`'s streamed rows are checked first, in a pass of their own (`Refused`), so
        that a refusal leaves the state as it was; their stream is then read anew."""
        streams = self.streamed.get(t, {})
        if not streams or not any(s < t for s in engine.stale()):
            return
        for rel, (local, check) in streams.items():
            for _ in local.checked(check, ck.BAD_ROWS):
                pass
            changes[rel] = local.checked(check, ck.BAD_ROWS)

    def _input_checks(self, key: str, t: int, problems: dict[str, list[str]]) -> None:
        """Each relation's ``update_triples`` outcome at epoch `t`: passed, or its problems."""
        graph = self.graph
        for info in graph.of_role(Role.CHANGES):
            rel = info.relation or ""
            check = AssetCheckKey(graph.key(info.name), ck.UPDATE_TRIPLES)
            lines = [f"epoch {t} ({graph.epochs.folder(t)}): {x}" for x in problems.get(rel, [])]
            metadata: dict[str, Any] = {"epoch": str(t), "depth": "schema and data"}
            metadata["problems found"] = len(lines)
            if lines:
                metadata["errors"] = MetadataValue.json(lines[: ck.BAD_ROWS])
            more = f"; the first 3 of {len(lines)} shown, every one under errors"
            summary = (
                f"{len(lines)} problem(s), nothing applied: {'; '.join(lines[:3])}"
                + (more if len(lines) > 3 else "")
                if lines
                else None
            )
            self.book.add(check, key, ck.Outcome(not lines, metadata, summary))

    def _refused(
        self, pairs: Sequence[tuple[str, int]], key: str, t: int, problems: dict[str, list[str]]
    ) -> None:
        """Epoch `t`'s streamed rows refused while it was applied (nothing of it committed): its
        ``update_triples`` fails as a refusal found when reading does, and the later epochs of
        the run, not applied, report no check."""
        later = {k for k, _ in pairs if k > key}
        for outcomes in self.book.outcomes.values():
            for k in later:
                outcomes.pop(k, None)
        self._input_checks(key, t, problems)

    # -- after each epoch ----------------------------------------------------------------------
    def _epoch(
        self, engine: Any, key: str, result: Any, landed: Any, audit_later: bool, full: bool
    ) -> None:
        """Record an applied epoch: its per-epoch checks (with `audit_later`, its audit started in
        a thread of its own: `_audit_meanwhile`) and, with `full` (its partition's last epoch),
        its assets' metadata."""
        graph, t = self.graph, result.epoch
        landed = {  # streamed rows are counted as they are checked
            rel: f if f.rows is not None else replace(f, rows=self.counted.get((t, rel)))
            for rel, f in (landed or {}).items()
        }
        self.metadata[key] = (
            epoch_metadata(graph, engine, result, landed)
            if full
            else {i.name: {"epoch": t} for i in graph.infos}
        )
        if graph.epochs.per_day > 1:  # the day's files, as the landing sensor fingerprints them
            for info in graph.of_role(Role.CHANGES):
                files = self.day_files.get((key, info.relation or ""))
                self.metadata[key][info.name][FINGERPRINT] = fingerprint(files) if files else ""
        self._epoch_checks(engine, key, result, rebuilt=False, audit_later=audit_later)
        out = ", ".join(
            f"{q} {result.count(q):,} ({result.total(q):+,})" for q in graph.topology.plans
        )
        changed = ", ".join(
            f"{rel} {r.changed // unit(graph, rel)[1]:,} {unit(graph, rel)[0]} changed"
            for rel, r in result.relations.items()
        )
        self.lines.append(
            f"epoch {t} ({graph.epochs.folder(t)}): {changed}; {out}; "
            f"{result.metrics.total_seconds:.3f} s on the {result.metrics.deployment}"
        )

    def _epoch_checks(
        self, engine: Any, key: str, result: Any, rebuilt: bool, audit_later: bool = False
    ) -> None:
        graph, t = self.graph, result.epoch
        for info in graph.of_role(Role.SNAPSHOT):
            rel = info.relation or ""
            trace = result.traces.get(relation_trace_name(rel))
            negative = trace.figures.negative if trace is not None else 0
            examples = result.relations[rel].negative_examples if rel in result.relations else ()
            check = AssetCheckKey(graph.key(info.name), ck.NON_NEGATIVE)
            self.book.add(check, key, ck.non_negative(rel, t, negative, examples))
        for info in graph.of_role(Role.QUERY_CHANGES):
            asset = graph.key(info.name)
            self.book.add(AssetCheckKey(asset, ck.CURRENT), key, provenance.current(t, rebuilt))
            check = AssetCheckKey(asset, ck.DELTA_RULES)
            if audit_later:
                self.later_audits.append((check, key, info.query or "", t))
            else:
                self.book.add(check, key, ck.delta_rules(engine, info.query or "", t))
        if rebuilt:
            for info in graph.of_role(Role.CHANGES):
                check = AssetCheckKey(graph.key(info.name), ck.UPDATE_TRIPLES)
                self.book.add(
                    check, key, ck.Outcome(True, {"rederived": "from the stored changes"})
                )

    @contextmanager
    def _audit_meanwhile(self, engine: Any) -> Iterator[None]:
        """The run's last epoch's audits (`_epoch` with `audit_later`), run in a thread of
        their own while the caller writes the run's materializations — no epoch is applied after
        it, and the audit's work (numpy, mostly outside the GIL) overlaps Dagster's writes of
        its events — then their outcomes in the book."""
        if not self.later_audits:
            yield
            return
        with ThreadPoolExecutor(1, thread_name_prefix="wcoj-audit") as pool:
            futures = [
                (check, key, pool.submit(ck.delta_rules, engine, query, t))
                for check, key, query, t in self.later_audits
            ]
            yield
            for check, key, future in futures:
                self.book.add(check, key, future.result())
        self.later_audits.clear()

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

    def _materialized(
        self, done: Sequence[tuple[str, int]], names: Sequence[str] | None = None
    ) -> Iterator[AssetMaterialization]:
        """The epochs `done` reported materialized, one event per asset (of `names`, default
        all) and epoch."""
        wanted = set(names) if names is not None else None
        for key in _keys(done):
            for info in self.graph.infos:
                if wanted is None or info.name in wanted:
                    yield AssetMaterialization(
                        asset_key=self.graph.key(info.name),
                        partition=key,
                        metadata=self.metadata[key][info.name],
                    )

    def _reported(self, done: Sequence[tuple[str, int]], whole: bool) -> Iterator[Any]:
        """Every applied epoch's materializations: for the selected assets of a run that applied
        its whole range, each epoch's figures added to one `MaterializeResult` per asset (Dagster
        writes them in batches); every other one as an event of its own."""
        context, graph = self.context, self.graph
        chosen = [i.name for i in graph.infos if graph.key(i.name) in self.selected]
        others = [i.name for i in graph.infos if i.name not in chosen]
        if not whole:
            yield from self._materialized(done)
            return
        for key in _keys(done):
            for name in chosen:
                entries = self.metadata[key][name]
                context.add_asset_metadata(entries, asset_key=graph.key(name), partition_key=key)
        for name in chosen:
            yield MaterializeResult(asset_key=graph.key(name))
        yield from self._materialized(done, others)

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
                "stale later epochs": len(later),
                "backfill from": first,
            }
        for info in graph.of_role(Role.QUERY_CHANGES):
            check = AssetCheckKey(graph.key(info.name), ck.CURRENT)
            for e in later:
                self.book.add(check, graph.epochs.key(e), provenance.stale(e, corrected, first))
        self.context.log.warning(
            f"epochs {later[0]}..{later[-1]} were derived before {corrected} changed: they fail "
            f"`{ck.CURRENT}` until rebuilt (the rebuild sensor does it, or a backfill from "
            f"{first})"
        )

    def _binary_joins(
        self, engine: Any, pairs: Sequence[tuple[str, int]], only: Sequence[Any] | None = None
    ) -> None:
        """`matches_binary_join` once at most per run (of the checks `only`, default all): on
        its last epoch when the run selected the check (the verify job, a run from the asset
        graph) or asked for it (op config), else on its last due epoch (one in
        ``check_every``)."""
        graph, every = self.graph, self.wcoj.check_every
        due = [t for _, t in pairs if ck.due(t, every)]
        for info in graph.of_role(Role.OUTPUT):
            check = AssetCheckKey(graph.key(info.name), ck.BINARY_JOIN)
            if only is not None and check not in only:
                continue
            asked = self.config.binary_join or check in self.context.selected_asset_check_keys
            chosen = pairs[-1][1] if asked else (due[-1] if due else None)
            if chosen is None:
                continue
            key = graph.epochs.key(chosen)
            query = graph.topology.query(info.query or "")
            self.context.log.info(
                f"{ck.BINARY_JOIN} of {query.name} at epoch {chosen} ({key}): recomputing the "
                "output with Spark SQL"
            )
            try:
                outcome = ck.binary_join(engine, query, chosen, key)
            except Exception as e:  # a check that cannot run fails, saying why
                what = f"{type(e).__name__}: {e}"
                outcome = ck.Outcome(False, {"error": what, "epoch": str(chosen)}, what)
            self.book.add(check, key, outcome)
            self.context.log.info(
                f"{ck.BINARY_JOIN} of {query.name} at epoch {chosen}: "
                + ("passed" if outcome.passed else "FAILED")
                + f" in {outcome.metadata.get('seconds', '?')} s"
            )

    # -- verifying -------------------------------------------------------------------------------
    def _verify(self) -> Iterator[Any]:
        """The selected checks of the run's epochs (a run without partitions: the state's last
        epoch) as the state holds them (a run tagged `VERIFY_TAG`, or of checks alone): nothing
        applied, nothing materialized. An epoch the state does not hold fails each."""
        from wcoj_core.lineage import epochs_of as held_epochs

        context, graph = self.context, self.graph
        selected = set(context.selected_asset_check_keys)
        engine = self.wcoj.engine(graph.topology, create=False)
        held, stale = set(held_epochs(engine.store.current())), set(engine.stale())
        if context.has_partition_key or context.has_partition_key_range:
            pairs = self._pairs()
        else:
            last = engine.epoch if engine.epoch is not None else 0
            pairs = [(graph.epochs.key(last), last)]
        if any(c.name == ck.UPDATE_TRIPLES for c in selected):
            self._read(pairs)
        for key, t in pairs:
            missing = _not_held(key, t)
            for info in graph.of_role(Role.SNAPSHOT, Role.QUERY_CHANGES):
                asset = graph.key(info.name)
                for name in (ck.NON_NEGATIVE, ck.CURRENT, ck.DELTA_RULES):
                    check = AssetCheckKey(asset, name)
                    if check not in selected:
                        continue
                    if t not in held and name == ck.CURRENT:
                        continue  # no history yet: not stale, and nothing for the automation
                    if t not in held:
                        outcome = missing
                    elif name == ck.NON_NEGATIVE:
                        negative = engine.figures(relation_trace_name(info.relation or ""), t)[2]
                        outcome = ck.non_negative(info.relation or "", t, negative)
                    elif name == ck.CURRENT and t in stale:
                        first = graph.epochs.key(min(stale))
                        outcome = provenance.stale(t, "an earlier epoch", first)
                    elif name == ck.CURRENT:
                        outcome = provenance.current(t)
                    else:
                        outcome = ck.delta_rules(engine, info.query or "", t)
                    self.book.add(check, key, outcome)
        joins = [c for c in selected if c.name == ck.BINARY_JOIN]
        if pairs[-1][1] in held:
            self._binary_joins(engine, pairs, joins)
        for check in joins if pairs[-1][1] not in held else ():
            self.book.add(check, pairs[-1][0], _not_held(*pairs[-1]))
        keys = [k for k, _ in pairs]
        yield from ck.report(context, graph.check_specs, self.book, keys, self.wcoj.check_reporting)


def _keys(pairs: Sequence[tuple[str, int]]) -> list[str]:
    """The partition keys of (key, epoch) pairs, each once, in order."""
    return list(dict.fromkeys(k for k, _ in pairs))


def _not_held(key: str, t: int) -> ck.Outcome:
    """A check's outcome at an epoch the state does not hold."""
    what = f"epoch {t} ({key}) is not in the state: run it first"
    return ck.Outcome(False, {"epoch": str(t), "error": what}, what)
