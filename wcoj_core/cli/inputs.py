"""The relations a command reads: ``--input`` / ``--changes`` specs, checked, then read.

`parse_inputs` and `parse_changes` check the specs against the query (each relation once, used by
it, every used one given for inputs; local files exist, generator specs parse, changes are
files); `check_undirected` checks ``--undirected REL``; `check_files` reads what is cheap of every
local file (`wcoj_core.input_read.check_locally`) and raises the full read's `InputError`. All of
it runs before Spark. Without Spark (`needs_spark` false) the commands stream each file
(`read_local_batches`); with Spark, `read_inputs` reads every input and `read_flagged` one, warning
of negative multiplicities. Every error is a `WcojError` (`UsageError` for an argument's syntax).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from wcoj_core.cli.console import UsageError, warn
from wcoj_core.errors import InputError, QueryError
from wcoj_core.input_read import (
    Format,
    check_input_file,
    check_locally,
    detect_format,
    is_generator_spec,
    is_local_input,
)
from wcoj_core.query.ir import Query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def parse_inputs(specs: Sequence[str], query: Query) -> dict[str, str]:
    """``REL=PATH`` arguments as a mapping, checked against the relations of `query`."""
    inputs: dict[str, str] = {}
    for spec in specs:
        rel, sep, path = spec.partition("=")
        rel = rel.strip()
        if not sep or not rel or not path:
            raise UsageError(
                f"--input {spec!r} is not of the form REL=PATH (for example edge=graph.txt)"
            )
        if not (rel.isidentifier() and rel.isascii()):
            raise UsageError(f"--input {spec!r}: {rel!r} is not a relation name (an identifier)")
        if rel in inputs:
            raise UsageError(
                f"--input gives relation {rel!r} twice ({inputs[rel]} and {path}); "
                "give each relation once"
            )
        inputs[rel] = path
    used = ", ".join(sorted(query.relations))
    for rel in inputs:
        if rel not in query.relations:
            raise QueryError(
                f"--input gives relation {rel!r}, which query {query.name} does not use "
                f"(it uses: {used})"
            )
    for rel in query.relations:
        if rel not in inputs:
            raise QueryError(
                f"query {query.name} uses relation {rel!r}, but no --input gives it; "
                f"add --input {rel}=PATH"
            )
    for rel, path in inputs.items():
        _check_source(rel, path, query.relations[rel])
    return inputs


def parse_changes(specs: Sequence[str], query: Query) -> dict[str, str]:
    """``REL=PATH`` arguments of ``apply``: relations of `query`, each once, files that exist."""
    changes: dict[str, str] = {}
    for spec in specs:
        rel, sep, path = spec.partition("=")
        rel = rel.strip()
        if not sep or not rel or not path:
            raise UsageError(f"--changes {spec!r} is not of the form REL=PATH")
        if rel not in query.relations:
            raise QueryError(
                f"--changes gives relation {rel!r}, which query {query.name} does not use "
                f"(it uses: {', '.join(sorted(query.relations))})"
            )
        if rel in changes:
            raise UsageError(f"--changes gives relation {rel!r} twice; give each relation once")
        if is_generator_spec(path):
            raise UsageError(f"--changes {spec!r}: changes come from a file, not a generator")
        _check_source(rel, path, query.relations[rel])
        changes[rel] = path
    return changes


def _check_source(rel: str, path: str, arity: int) -> None:
    """Fail fast on a generator spec that does not parse, or a local path that is missing, not
    a regular file (a folder only for Parquet) or unreadable. A remote URI is Spark's to read."""
    if is_generator_spec(path):
        from wcoj_core import generate  # imports Spark's Python modules (no JVM)

        generate.parse_generator_spec(path)
        if arity != 2:
            raise InputError(
                f"a generated graph is binary, but the query uses relation {rel} with arity {arity}",
                path,
            )
        return
    check_input_file(path, rel)


def needs_spark(inputs: Mapping[str, str]) -> bool:
    """Whether reading `inputs` needs Spark: a generator spec or a remote URI among them."""
    return not all(is_local_input(path) for path in inputs.values())


def check_undirected(names: Sequence[str], query: Query, inputs: Mapping[str, str]) -> set[str]:
    """The ``--undirected`` relations, each given by an input and binary."""
    for rel in names:
        if rel not in inputs:
            raise UsageError(f"--undirected {rel}: no --input gives relation {rel!r}")
        if query.relations[rel] != 2:
            raise QueryError(
                f"--undirected {rel}: query {query.name} uses {rel!r} with arity "
                f"{query.relations[rel]}; only a binary relation can be undirected"
            )
    return set(names)


def check_files(query: Query, inputs: Mapping[str, str]) -> None:
    """Refuse bad local input files without Spark, relation by relation in name order."""
    for rel, path in sorted(inputs.items()):
        check_locally(path, query.relations[rel], rel)


def read_inputs(
    spark: SparkSession, query: Query, inputs: Mapping[str, str]
) -> dict[str, DataFrame]:
    """Every input, as read (callers such as the benchmarks normalize them themselves)."""
    from wcoj_core.input_spark import read_relation

    return {
        rel: read_relation(spark, path, query.relations[rel], rel)
        for rel, path in sorted(inputs.items())
    }


def read_flagged(
    spark: SparkSession, rel: str, path: str, arity: int, negative: dict[str, int]
) -> DataFrame:
    """`read_relation`, warning of tuples whose multiplicity is negative (kept signed, counted in
    `negative`; only CSV and Parquet carry a ``diff``)."""
    from wcoj_core.input_spark import negative_tuples, read_relation

    df = read_relation(spark, path, arity, rel)
    if is_generator_spec(path) or detect_format(path) is Format.TEXT:
        return df
    _warn_negative(rel, path, *negative_tuples(df), negative)
    return df


def _warn_negative(
    rel: str,
    path: str,
    count: int,
    examples: Sequence[tuple[tuple[int, ...], int]],
    negative: dict[str, int],
) -> None:
    if count:
        negative[rel] = count
        shown = "; ".join(f"{tup} {m}" for tup, m in examples[:5])
        more = ", ..." if count > 5 else ""
        warn(
            f"{path} (relation {rel}): {count} tuple(s) have a negative multiplicity, i.e. "
            f"delete tuples that are absent (kept as signed multiplicities): {shown}{more}"
        )
