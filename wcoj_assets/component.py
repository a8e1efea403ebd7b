"""`WcojComponent`: the wcoj pipeline as a Dagster component, configured by a ``defs.yaml``.

Its attributes are the arguments of `wcoj_assets.definitions.build_definitions`, which builds its
definitions; ``translation`` sees each asset as ``asset`` (`wcoj_assets.graph.AssetInfo`) and its
base spec as ``spec`` and may set anything but the lineage and the partitions. ``name`` (default:
the folder of the ``defs.yaml``) prefixes the job, step, sensors, resource and IO manager, so that
several components live in one project; a second component over the same relation is refused
unless a ``key_prefix`` gives it keys of its own. The attributes, an example and the scaffold
(``dg scaffold defs wcoj_assets.component.WcojComponent <path>``) are in docs/dagster.md.
Loading the component parses and plans the queries; it touches no file and starts no Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
from dagster.components.component_scaffolding import scaffold_component
from dagster.components.resolved.core_models import OpSpec
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import Field

from wcoj_assets.definitions import build_definitions, run_epochs
from wcoj_assets.epochs import DEFAULT_EPOCHS
from wcoj_assets.graph import AssetInfo, EpochGraph
from wcoj_assets.pipeline import EpochConfig
from wcoj_assets.resources import WcojResource
from wcoj_assets.specs import QuerySpec, Topology
from wcoj_core.errors import QueryError
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.query.parse import parse_query


class RelationModel(dg.Model):
    """A relation that changes every epoch."""

    name: str = Field(description="The relation's name, as queries use it (edge).")
    arity: int = Field(description="How many columns its tuples have (2 for an edge).")


class QueryModel(dg.Model):
    """A query whose output is maintained."""

    name: str = Field(description="The name of the query's assets (triangles, triangles_deltas…).")
    query: str = Field(
        description="A built-in query by name (" + ", ".join(BUILTINS) + ") or query text, "
        "e.g. 'tri(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c'."
    )


# What `dg scaffold defs wcoj_assets.component.WcojComponent <path>` writes: the quick start.
SCAFFOLD: dict[str, Any] = {
    "relations": [{"name": "edge", "arity": 2}],
    "queries": [{"name": "triangles", "query": "triangles"}],
    "undirected": ["edge"],
    "landing": "data/landing",
    "storage": "data/state",
}


class WcojScaffolder(dg.Scaffolder):
    """Writes a ``defs.yaml`` that loads: triangles over an undirected edge list."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        scaffold_component(request, SCAFFOLD)


def _defs_file(path: Path, root: Path) -> str:
    """A component's ``defs.yaml`` (or its folder or file), relative to the project."""
    found = path / "defs.yaml" if (path / "defs.yaml").exists() else path
    return str(found.relative_to(root)) if found.is_relative_to(root) else str(found)


def _asset_vars(asset: AssetInfo) -> dict[str, Any]:
    return {"asset": asset}


@dg.scaffold_with(WcojScaffolder)
class WcojComponent(dg.Component, dg.Resolvable, dg.Model):
    """Cyclic query results (triangles, cliques…) kept up to date over daily epochs of changes."""

    relations: list[RelationModel] = Field(description="The relations the queries read.")
    queries: list[QueryModel] = Field(description="The queries to maintain.")
    undirected: list[str] = Field(
        default_factory=list,
        description="Binary relations landed as edge lists in no particular direction: each "
        "change is read as both of its directions, self-loops dropped. Sets by default.",
    )
    sets: list[str] = Field(
        default_factory=list,
        description="Relations that are sets: each tuple present or not; inserting a present "
        "tuple or deleting an absent one changes nothing (and is counted).",
    )
    bags: list[str] = Field(
        default_factory=list,
        description="Relations that are bags: signed multiplicities (the default for a relation "
        "that is not undirected).",
    )
    landing: str | None = Field(
        default=None,
        description="Where changes land, as <landing>/<relation>/<YYYY-MM-DD>/<files> "
        "(default .wcoj/landing).",
    )
    storage: str | None = Field(
        default=None,
        description="The state directory: a local path or any URI Spark writes, such as "
        "s3a://… (default .wcoj/state).",
    )
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")
    start: str | None = Field(
        default=None,
        description="The first epoch's day (YYYY-MM-DD): epoch n is n days on. Default: the "
        "oldest epoch folder landed when the code location loads (today when none has).",
    )
    epochs_per_day: int = Field(
        default=1,
        description="Epochs in a day's partition, a divisor of 1440 (24: hourly, 1440: a minute "
        "each): each epoch lands in <landing>/<relation>/<YYYY-MM-DD>/<HHMM>/ (its first "
        "minute), is applied and committed on its own, and a day's run applies them in order.",
    )
    check_every: int | None = Field(
        default=None,
        description="The full binary-join recomputation (matches_binary_join) runs on one epoch "
        "in this many (default 30).",
    )
    check_reporting: str | None = Field(
        default=None,
        description="Which partitions of a run over a range get a check evaluation of their "
        "own: auto (the default: every partition its own status for ranges of at most 100 "
        "epochs, news beyond), every (each evaluated partition) or news (failures and "
        "recoveries; the range's result summarizes the rest).",
    )
    empty_epochs: bool = Field(
        default=False,
        description="Whether an epoch with nothing landed is normal (applied without changes). "
        "By default its update_triples check fails, naming the folder.",
    )
    name: str | None = Field(
        default=None,
        description="The prefix of the names of the job, step, sensors, resource and IO manager "
        "(default: the name of the folder holding this defs.yaml).",
    )
    memory: str | None = Field(
        default=None,
        description="The memory budget of the process running a step, e.g. 4g (default: a "
        "quarter of the machine's memory): every stage streams within it and spills the rest.",
    )
    op: OpSpec | None = Field(
        default=None,
        description="The step making every asset: its name (default wcoj_epochs), tags, pool "
        "and backfill policy (default: one run per range).",
    )
    translation: (
        Annotated[
            TranslationFn[AssetInfo],
            TranslationFnResolver[AssetInfo](template_vars_for_translation_fn=_asset_vars),
        ]
        | None
    ) = Field(
        default=None,
        description="Each asset's spec from its base spec (`spec`) and what it is (`asset`: "
        "name, role, relation, query, group): key or key_prefix, group_name, owners, tags, "
        "kinds, description, metadata.",
    )

    def specs(self) -> list[QuerySpec]:
        """The query specs, checked against the declared relations.

        >>> WcojComponent(
        ...     relations=[RelationModel(name="edge", arity=3)],
        ...     queries=[QueryModel(name="t", query="triangles")],
        ... ).specs()
        Traceback (most recent call last):
          ...
        wcoj_core.errors.QueryError: query 't' reads relation 'edge' with arity 2, but it is declared with arity 3
        """
        declared = {r.name: r.arity for r in self.relations}
        if any(arity < 1 for arity in declared.values()):
            raise QueryError("a relation's arity is 1 or more")
        if len(declared) != len(self.relations):
            raise QueryError("a relation is declared twice; declare each relation once")
        specs: list[QuerySpec] = []
        for q in self.queries:
            text = BUILTINS.get(q.query, q.query)
            used = parse_query(text).relations
            for rel, arity in used.items():
                if rel not in declared:
                    raise QueryError(
                        f"query {q.name!r} reads relation {rel!r}, which is not declared; add "
                        f"{{name: {rel}, arity: {arity}}} to relations"
                    )
                if declared[rel] != arity:
                    raise QueryError(
                        f"query {q.name!r} reads relation {rel!r} with arity {arity}, but it is "
                        f"declared with arity {declared[rel]}"
                    )
            specs.append(QuerySpec(q.name, text, tuple(used)))
        unread = sorted(set(declared) - {rel for s in specs for rel in s.relations})
        if unread:
            raise QueryError(f"relations {unread} are declared but read by no query")
        return specs

    def get_asset_spec(self, spec: dg.AssetSpec, asset: AssetInfo) -> dg.AssetSpec:
        """The spec of one asset: `spec` (its base spec) through ``translation``. Override to
        set attributes in Python."""
        return self.translation(spec, asset) if self.translation is not None else spec

    def execute(
        self,
        context: dg.AssetExecutionContext,
        config: EpochConfig,
        wcoj: WcojResource,
        graph: EpochGraph,
    ) -> Iterator[Any]:
        """The step's body: applies the run's epochs and yields every asset's materialization
        and check result (`wcoj_assets.pipeline.EpochRun`). Override to wrap it::

            class Logged(WcojComponent):
                def execute(self, context, config, wcoj, graph):
                    context.log.info("epochs starting")
                    yield from super().execute(context, config, wcoj, graph)
        """
        yield from run_epochs(context, config, wcoj, graph)

    def pipeline_name(self, context: dg.ComponentLoadContext | None) -> str:
        """`name`, or the folder of the ``defs.yaml`` as an identifier."""
        if self.name:
            return self.name
        folder = context.path.name if context is not None else "wcoj"
        name = "".join(c if c.isalnum() else "_" for c in folder).strip("_") or "wcoj"
        return name if not name[0].isdigit() else f"p_{name}"

    def first_day(self) -> str:
        """`start`, or the oldest epoch folder landed (read when the code location loads),
        or today (UTC)."""
        from wcoj_assets.landing_read import landed_epochs
        from wcoj_assets.resources import DEFAULT_LANDING

        if self.start:
            return self.start
        relations = [r.name for r in self.relations]
        return landed_epochs(self.landing or DEFAULT_LANDING, relations).start

    def asset_keys(self) -> set[dg.AssetKey]:
        """The keys of this component's assets, translated."""
        topology = Topology.of(self.specs(), self.undirected, self.sets, self.bags)
        return set(EpochGraph.build(topology, DEFAULT_EPOCHS, self.get_asset_spec).keys.values())

    def refuse_shared_keys(self, context: dg.ComponentLoadContext) -> None:
        """`QueryError`, naming both files and what to do, when another `WcojComponent` of the
        project defines one of this one's asset keys (Dagster would say ``Duplicate asset key``
        alone, naming neither)."""
        tree, own = context.component_tree, context.component_decl.loc
        mine: set[dg.AssetKey] | None = None
        for loc, decl in tree.find_root_decl().iterate_loc_component_decl_pairs():
            kind = decl.component_type
            if loc == own or not (isinstance(kind, type) and issubclass(kind, WcojComponent)):
                continue
            mine = mine if mine is not None else self.asset_keys()
            other = tree.load_component(loc)
            assert isinstance(other, WcojComponent)
            theirs = other.asset_keys()
            shared = sorted(k.to_user_string() for k in mine & theirs)
            if shared:
                files = sorted(
                    _defs_file(path, context.project_root)
                    for path in (context.path, decl.context.path)
                )
                raise QueryError(
                    f"{files[0]} and {files[1]} both define the assets "
                    f"{', '.join(shared[:4])}{', …' if len(shared) > 4 else ''}: a second query "
                    "over the same relation goes in `queries:` of the component that has the "
                    "relation (its queries share the relation's arrangements); a separate "
                    "component needs keys of its own (`translation: {key_prefix: <its name>}`) "
                    "and keeps a state of its own"
                )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        if context is not None:
            self.refuse_shared_keys(context)
        op = self.op
        return build_definitions(
            self.specs(),
            name=self.pipeline_name(context),
            execute=self.execute,
            empty_epochs=self.empty_epochs,
            storage=self.storage,
            landing=self.landing,
            spark_master=self.spark_master,
            spark_conf=self.spark_conf,
            start=self.first_day(),
            epochs_per_day=self.epochs_per_day,
            undirected=self.undirected,
            sets=self.sets,
            bags=self.bags,
            check_every=self.check_every,
            check_reporting=self.check_reporting,
            memory=self.memory,
            translate=self.get_asset_spec,
            op_name=op.name if op is not None and op.name else None,
            op_tags=op.tags if op is not None else None,
            pool=op.pool if op is not None else None,
            backfill_policy=op.backfill_policy if op is not None else None,
        )
