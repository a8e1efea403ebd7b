"""The asset graph of one code location: every asset the engine's pass makes, with its lineage.

One `AssetInfo` per asset, in topological order: per relation ``R``, ``R_deltas``,
``R_snapshot``, its index segments (``R_forward``, ``R_reverse``, ...) and counts
(``R_counts_<key>``); per query ``Q``, ``Q_rule_<i>``, ``Q_deltas`` and ``Q``. Lineage is what
each asset is made from at the same epoch; what accumulates from the previous epoch says so in
its ``wcoj/role`` tag, not by a self-dependency (which makes Dagster launch a run per asset).
Groups: ``inputs``, ``results`` and ``engine``. `EpochGraph.build` passes each base `AssetSpec`
through the component's ``translation``, then wires dependencies and checks to the translated
keys. Nothing here reads a file or starts Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    AssetSpec,
    TableColumn,
    TableSchema,
)

from wcoj_assets.epochs import Epochs
from wcoj_assets.specs import (
    Topology,
    counts_asset_name,
    deltas_asset_name,
    head_columns,
    query_deltas_asset_name,
    rule_asset_name,
    snapshot_asset_name,
    view_asset_name,
)
from wcoj_core.errors import QueryError
from wcoj_core.indexes import ViewKey
from wcoj_core.meaning import RelationSpec
from wcoj_core.query.ir import Query
from wcoj_core.traces import (
    counts_trace_name,
    output_trace_name,
    relation_trace_name,
    rule_trace_name,
)

OUTPUTS_IO_MANAGER = "wcoj_outputs"
KINDS = frozenset({"wcoj"})
# Tags on every asset: what it is to the engine, and (on a query's output and change) that it is
# an answer a user reads.
ROLE_TAG = "wcoj/role"
RESULT_TAG = "wcoj/result"


class Role(Enum):
    """What an asset is, to the engine."""

    CHANGES = "changes"
    SNAPSHOT = "snapshot"
    INDEX = "index"
    COUNTS = "counts"
    RULE = "rule"
    QUERY_CHANGES = "query_changes"
    OUTPUT = "output"


@dataclass(frozen=True)
class AssetInfo:
    """One asset: its name (the base key), role, the relation or query it belongs to, the
    engine trace it shows and (an index) the view key, and what it is made from: ``(name,
    previous epoch?)``. The component's ``translation`` sees it as ``asset``."""

    name: str
    role: Role
    group: str
    trace: str
    relation: str | None = None
    query: str | None = None
    atom: int | None = None
    view: ViewKey | None = None
    deps: tuple[str, ...] = ()
    description: str = ""
    columns: tuple[str, ...] = ()

    @property
    def accumulated(self) -> bool:
        """Read as of an epoch (its previous epoch plus the change), not as a change."""
        return self.role in (Role.SNAPSHOT, Role.COUNTS, Role.OUTPUT)

    @property
    def result(self) -> bool:
        """One of the answers a user reads: a query's output or its change."""
        return self.role in (Role.QUERY_CHANGES, Role.OUTPUT)


def table_schema(columns: tuple[str, ...], described: dict[str, str] | None = None) -> TableSchema:
    """The ``dagster/column_schema`` of update rows: the columns (all long), then ``diff``.

    >>> [c.name for c in table_schema(("c0", "c1")).columns]
    ['c0', 'c1', 'diff']
    """
    described = described or {}
    cols = [TableColumn(c, "long", described.get(c, f"column {c}")) for c in columns]
    return TableSchema([*cols, TableColumn("diff", "long", "signed multiplicity of the tuple")])


def infos(topology: Topology) -> list[AssetInfo]:
    """Every asset of `topology`, in the order the engine makes them."""
    out: list[AssetInfo] = []
    for rel, arity in topology.relations.items():
        out += _relation_infos(topology, rel, arity)
    for q in topology.queries:
        out += _query_infos(topology, q)
    return out


def _relation_infos(topology: Topology, rel: str, arity: int) -> list[AssetInfo]:
    """A relation's assets: its changes, its snapshot, each index and each counts arrangement."""
    out: list[AssetInfo] = []
    spec = topology.meanings[rel]
    cols = tuple(f"c{i}" for i in range(arity))
    changes, snapshot = deltas_asset_name(rel), snapshot_asset_name(rel)
    trace = relation_trace_name(rel)
    text = _changes_text(rel, spec)
    out.append(
        AssetInfo(changes, Role.CHANGES, "inputs", trace, rel, description=text, columns=cols)
    )
    out.append(
        AssetInfo(
            snapshot,
            Role.SNAPSHOT,
            "engine",
            trace,
            rel,
            deps=(changes,),
            description=f"Relation `{rel}` as of the epoch (its previous snapshot plus the "
            "epoch's change), stored as its batches: the self arrangement, which every rule "
            "reads through its atoms' views.",
            columns=cols,
        )
    )
    for key in topology.views[rel]:
        name = view_asset_name(rel, key)
        pattern, order = key
        seen = "the relation" if pattern is None else f"the view {pattern} of the relation"
        out.append(
            AssetInfo(
                name,
                Role.INDEX,
                "engine",
                trace,
                rel,
                view=key,
                deps=(snapshot,),
                description=f"The index of `{rel}` in column order "
                f"({', '.join(f'c{o}' for o in order)}): {seen} sorted for the kernel's "
                "lookups, as memory-mapped segment files (a base and a few recent layers), "
                "shared by every rule of every query that probes it.",
                columns=tuple(f"c{o}" for o in order),
            )
        )
    for a in topology.counts_for(rel):
        name = counts_asset_name(a)
        key_cols = tuple(f"c{k}" for k in a.key)
        out.append(
            AssetInfo(
                name,
                Role.COUNTS,
                "engine",
                counts_trace_name(a),
                rel,
                deps=(snapshot,),
                description=f"`{a}`: for each value of ({', '.join(key_cols) or 'no key'}) "
                f"of `{a.view}`, the number of distinct tuples with a non-zero "
                "multiplicity, kept as batches and an index. Shared by every rule of every "
                "query that counts or checks support by this key.",
                columns=key_cols,
            )
        )
    return out


def _changes_text(rel: str, spec: RelationSpec) -> str:
    """What a relation's changes asset says of them: where they land and what they mean."""
    meaning = (
        f"an undirected {spec.meaning.value}" if spec.undirected else f"a {spec.meaning.value}"
    )
    text = (
        f"The change of relation `{rel}` ({meaning}) at the epoch: what the update triples "
        f"landed in `<landing>/{rel}/<epoch key>/` (CSV, SNAP edge list or Parquet) did to "
        "it, after a full pandera check of the landed rows."
    )
    if spec.undirected:
        text += (
            " Undirected: each landed change (a, b, diff) is an edge in no particular "
            "direction, taken as (a, b) and (b, a); self-loops are dropped."
        )
    if spec.meaning.value == "set":
        text += (
            " A set: a tuple is present or not; inserting a present tuple or deleting an "
            "absent one changes nothing and is counted."
        )
    return text


def _query_infos(topology: Topology, q: Query) -> list[AssetInfo]:
    """A query's assets: each delta rule's change, the output's change and the output."""
    out: list[AssetInfo] = []
    head = tuple(head_columns(q))
    rules = []
    for i, atom in enumerate(q.atoms):
        name = rule_asset_name(q.name, i)
        rules.append(name)
        reads = tuple(topology.rule_reads(q.name, i))
        out.append(
            AssetInfo(
                name,
                Role.RULE,
                "engine",
                rule_trace_name(q.name, i),
                query=q.name,
                atom=i,
                deps=(deltas_asset_name(atom.relation), *reads),
                description=f"Rule {i} of `{q.name}`: the output change caused by the "
                f"changes to atom {i} (`{atom}`) at the epoch, joining the atoms before it "
                "as of the epoch and those after it as of the previous epoch. GenericJoin: "
                "count, propose from the fewest, validate against the others.",
                columns=head,
            )
        )
    changes = query_deltas_asset_name(q.name)
    out.append(
        AssetInfo(
            changes,
            Role.QUERY_CHANGES,
            "results",
            output_trace_name(q.name),
            query=q.name,
            deps=tuple(rules),
            description=f"**A result**: the change of `{q.name}`'s output at the epoch "
            "(its delta rules' outputs summed and consolidated): the tuples it gained "
            "(diff > 0) and lost (diff < 0).",
            columns=head,
        )
    )
    out.append(
        AssetInfo(
            q.name,
            Role.OUTPUT,
            "results",
            output_trace_name(q.name),
            query=q.name,
            deps=(changes,),
            description=f"**The result**: the output of `{q}` as of the epoch (the "
            "previous epoch's output plus the epoch's change).",
            columns=head,
        )
    )
    return out


# A translation: an asset's base spec and its info in, the spec to use out.
Translate = Callable[[AssetSpec, AssetInfo], AssetSpec]


@dataclass
class EpochGraph:
    """The assets and checks of a code location, translated (see the module)."""

    topology: Topology
    epochs: Epochs
    infos: list[AssetInfo]
    specs: dict[str, AssetSpec]
    keys: dict[str, AssetKey]
    io_manager_key: str = OUTPUTS_IO_MANAGER
    check_specs: list[AssetCheckSpec] = field(default_factory=list)

    @staticmethod
    def build(
        topology: Topology,
        epochs: Epochs,
        translate: Translate | None = None,
        checks: Callable[[EpochGraph], list[AssetCheckSpec]] | None = None,
        io_manager_key: str = OUTPUTS_IO_MANAGER,
    ) -> EpochGraph:
        """The graph of `topology`: each base spec through `translate`, dependencies wired to
        the translated keys, then `checks`."""
        partitions = epochs.partitions()
        all_infos = infos(topology)
        specs: dict[str, AssetSpec] = {}
        keys: dict[str, AssetKey] = {}
        for info in all_infos:
            base = base_spec(info, topology)
            spec = translate(base, info) if translate is not None else base
            if not isinstance(spec, AssetSpec):
                raise QueryError(f"the translation of {info.name} gave {spec!r}, not an AssetSpec")
            if spec.deps:
                raise QueryError(
                    f"the translation of {info.name} sets deps; wcoj wires its assets' lineage "
                    "itself (add assets of your own downstream instead)"
                )
            if spec.partitions_def is not None:
                raise QueryError(
                    f"the translation of {info.name} sets partitions; every wcoj asset has the "
                    "code location's epochs"
                )
            if spec.key in keys.values():
                raise QueryError(
                    f"the translation gives two assets the key {spec.key.to_user_string()}"
                )
            keys[info.name] = spec.key
            specs[info.name] = spec
        for info in all_infos:
            deps = [AssetDep(keys[name]) for name in info.deps]
            # Skippable: a run reports what it made (nothing for an epoch whose changes were
            # refused), and downstream assets of an asset it did not make do not run.
            spec = specs[info.name].replace_attributes(
                deps=deps, partitions_def=partitions, skippable=True
            )
            if info.result:
                spec = spec.with_io_manager_key(io_manager_key)
            specs[info.name] = spec
        graph = EpochGraph(topology, epochs, all_infos, specs, keys, io_manager_key)
        if checks is not None:
            graph.check_specs = checks(graph)
        return graph

    def key(self, name: str) -> AssetKey:
        return self.keys[name]

    def info(self, name: str) -> AssetInfo:
        return next(i for i in self.infos if i.name == name)

    def named(self, key: AssetKey) -> AssetInfo:
        """The asset whose (translated) key is `key`."""
        for info in self.infos:
            if self.keys[info.name] == key:
                return info
        raise KeyError(key)

    def of_role(self, *roles: Role) -> Iterator[AssetInfo]:
        return (i for i in self.infos if i.role in roles)

    def ordered_specs(self) -> list[AssetSpec]:
        return [self.specs[i.name] for i in self.infos]


def base_spec(info: AssetInfo, topology: Topology) -> AssetSpec:
    """An asset's spec before translation: key, group, kinds, description, column schema."""
    metadata: dict[str, object] = {}
    if info.role in (Role.RULE, Role.QUERY_CHANGES, Role.OUTPUT):
        q = topology.query(info.query or "")
        described = {
            name: f"head variable {v.name}, stored as c{i}"
            for i, (v, name) in enumerate(zip(q.head, info.columns, strict=True))
        }
        schema = table_schema(info.columns, described)
        if q.aggregate is not None and info.role is Role.OUTPUT:  # the groups' values
            value = TableColumn(q.aggregate.name, "long", f"the group's {q.aggregate}")
            schema = TableSchema([*schema.columns[:-1], value])
        metadata["dagster/column_schema"] = schema
    elif info.role is Role.COUNTS:
        schema = table_schema(info.columns)
        cols = [TableColumn(c.name, c.type, f"key column {c.name}") for c in schema.columns[:-1]]
        diff = TableColumn("diff", "long", "number of distinct tuples with this key")
        metadata["dagster/column_schema"] = TableSchema([*cols, diff])
    else:
        metadata["dagster/column_schema"] = table_schema(info.columns)
    if info.role is Role.RULE:
        from wcoj_core.query.explain import explain_rule

        plan = topology.plans[info.query or ""]
        text = explain_rule(plan, plan.rules[info.atom or 0])
        metadata["explain"] = _md(text)
        description = f"{info.description}\n\n```\n{text}\n```"
    else:
        description = info.description
    tags = {ROLE_TAG: info.role.value}
    if info.result:
        tags[RESULT_TAG] = "true"
    return AssetSpec(
        key=AssetKey(info.name),
        group_name=info.group,
        kinds=set(KINDS),
        description=description,
        metadata=metadata,
        tags=tags,
    )


def _md(text: str) -> object:
    from dagster import MetadataValue

    return MetadataValue.md(f"```\n{text}\n```")
