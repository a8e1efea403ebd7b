"""Errors raised by wcoj.

Every user mistake surfaces as a `WcojError` (or a subclass) whose message says what was wrong,
where (file, line, column, epoch, relation or query position) and, where it helps, what to do.
The core never prints; the CLI turns a `WcojError` into one line on stderr and a non-zero exit.
"""

from __future__ import annotations


class WcojError(Exception):
    """Base class for every error wcoj reports to a user."""


class QuerySyntaxError(WcojError):
    """Query text that does not parse; carries the 1-based line and column."""

    def __init__(self, message: str, line: int, column: int, text: str | None = None) -> None:
        self.line = line
        self.column = column
        self.text = text
        super().__init__(f"query line {line}, column {column}: {message}")


class QueryError(WcojError):
    """A query that parses but is not valid (unbound head variable, arity clash, ...)."""


class InputError(WcojError):
    """An input file or DataFrame that cannot be read as a relation.

    Carries the source name and, when known, the 1-based line and column (or row and column
    name for Parquet).
    """

    def __init__(
        self,
        message: str,
        source: str,
        line: int | None = None,
        column: int | str | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.column = column
        where = source
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column}"
        super().__init__(f"{where}: {message}")


class StateError(WcojError):
    """The persisted state cannot accept the requested change (wrong epoch, concurrent writer, ...)."""


class EpochAlreadyApplied(StateError):
    """The epoch (or a later one) has already been applied to this state directory."""


class ConcurrentCommit(StateError):
    """Another writer committed the generation this one was about to commit."""
