"""Plan -> deterministic text, for humans, golden tests and Dagster metadata (an aggregate's
last step says when its candidates are counted per group rather than enumerated)."""

from __future__ import annotations

from wcoj_core.query.ir import Filter
from wcoj_core.query.plan import DeltaRule, Extender, Plan


def _filters(filters: tuple[Filter, ...]) -> str:
    return ", ".join(str(f) for f in filters)


def _extender(plan: Plan, x: Extender) -> str:
    atom = plan.query.atoms[x.atom]
    key = ", ".join(str(plan.atom_vars[x.atom][k]) for k in x.key) or "-"
    how = "completes" if x.completes else "support"
    return f"{atom}#{x.atom} {x.version.value} by [{key}] {how}"


def explain_rule(plan: Plan, rule: DeltaRule) -> str:
    """The text of one delta rule."""
    atoms = plan.query.atoms
    lines = [f"rule {rule.delta}: delta {atoms[rule.delta]}#{rule.delta}"]
    others = [f"{atoms[j]}#{j} {v.value}" for j, v in enumerate(rule.versions) if j != rule.delta]
    if others:
        lines.append(f"  reads: {', '.join(others)}")
    lines.append(f"  start [{', '.join(map(str, rule.start))}]")
    for c in rule.checks:
        lines.append(f"    validate {atoms[c.atom]}#{c.atom} {c.version.value}")
    if rule.start_filters:
        lines.append(f"    filter {_filters(rule.start_filters)}")
    agg = plan.query.aggregate
    for k, step in enumerate(rule.steps):
        counted = agg is not None and k == len(rule.steps) - 1 and step.var not in plan.query.head
        lines.append(f"  extend {step.var}" + (f" counted: {agg} per group" if counted else ""))
        for x in step.extenders:
            lines.append(f"    count/propose/validate {_extender(plan, x)}")
        if step.filters:
            lines.append(f"    filter {_filters(step.filters)}")
    lines.append(f"  order [{', '.join(map(str, rule.order))}]")
    return "\n".join(lines)


def explain(plan: Plan) -> str:
    """The whole plan: query, implied filters, shared arrangements, then every rule."""
    lines = [f"query {plan.query}"]
    if plan.implied:
        lines.append(f"implied filters: {_filters(plan.implied)}")
    lines.append("arrangements:")
    lines.extend(f"  {a}" for a in plan.arrangements)
    for rule in plan.rules:
        lines.append(explain_rule(plan, rule))
    return "\n".join(lines) + "\n"
