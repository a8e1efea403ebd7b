"""What every ``wcoj`` command prints, and how it fails: one line per error, fixed exit codes.

Contract: results go to stdout, one flushed line at a time (`say`; `emit_json` for the final JSON
line); notes, warnings and errors go to stderr (`note`, `warn`, `error`), each folded onto one
line. A mistake in the arguments is a `UsageError`, which `Parser` raises instead of printing
argparse's usage block, so that it is reported like every other `WcojError`; the argument
types `epoch_argument` and `state_argument` refuse a bad ``--epoch`` or ``--state`` the same way,
while the arguments are parsed. `epilog` is the text each command's ``--help`` ends with:
examples, then the built-in query names.

>>> print(epilog(["wcoj explain --query triangles"]).splitlines()[1])
  wcoj explain --query triangles
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from wcoj_core.errors import WcojError
from wcoj_core.query.builtins import BUILTINS

PROG = "wcoj"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
MAX_EPOCH = 2**62  # epochs are stored in signed 64-bit columns, with room for arithmetic
_WHOLE = re.compile(r"[0-9]+", re.ASCII)


class UsageError(WcojError):
    """Command-line arguments that do not describe a run."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are `UsageError`s, reported in one line like any other."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def epilog(examples: Sequence[str]) -> str:
    """The end of a command's ``--help``: example command lines and the built-in queries."""
    lines = ["examples:", *(f"  {e}" for e in examples), ""]
    lines.append(f"built-in queries (--query NAME): {', '.join(BUILTINS)}")
    return "\n".join(lines)


def say(line: str) -> None:
    """A line of results on stdout, flushed at once (progress shows as it happens)."""
    print(line, flush=True)


def note(line: str) -> None:
    """A line of progress on stderr, flushed at once."""
    print(line, file=sys.stderr, flush=True)


def emit_json(payload: dict[str, Any]) -> None:
    say(json.dumps(payload))


# The longest error or warning line; a longer message keeps its start and its end.
LINE = 2000


def one_line(message: str, most: int = LINE) -> str:
    """A message on one line of at most about `most` characters: white space collapsed, and
    the middle of a longer one left out, saying how much.

    >>> one_line("a   b")
    'a b'
    >>> one_line("x" * 30 + "y" * 30, most=20)
    'xxxxxxxxxx ... (40 characters left out) ... yyyyyyyyyy'
    """
    text = " ".join(message.split())
    if len(text) <= most:
        return text
    half = most // 2
    return f"{text[:half]} ... ({len(text) - 2 * half:,} characters left out) ... {text[-half:]}"


def error(message: str, prog: str = PROG) -> None:
    text = one_line(message) or "unknown error"
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)


def warn(message: str, prog: str = PROG) -> None:
    print(f"{prog}: warning: {one_line(message)}", file=sys.stderr, flush=True)


def phases(seconds: dict[str, float]) -> str:
    """Seconds per engine phase.

    >>> phases({"open": 0.0042, "rules": 1.25})
    'open 0.004 rules 1.250'
    """
    return " ".join(f"{name} {value:.3f}" for name, value in seconds.items())


def epoch_argument(text: str) -> int:
    """``--epoch``: a whole number from 0 to 2**62, as argparse's ``type=``.

    Anything else is a `UsageError` (one line, raised while the arguments are parsed).

    >>> epoch_argument("7"), epoch_argument(" 0 ")
    (7, 0)
    >>> epoch_argument("-1")
    Traceback (most recent call last):
      ...
    wcoj_core.cli.console.UsageError: --epoch '-1': give a whole number from 0 to 2**62 (4611686018427387904)
    """
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped) or int(stripped) > MAX_EPOCH:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise UsageError(f"--epoch {shown!r}: give a whole number from 0 to 2**62 ({MAX_EPOCH})")
    return int(stripped)


def state_argument(text: str) -> str:
    """``--state``: a directory path, as argparse's ``type=``; an empty one is a `UsageError`.

    >>> state_argument("lake/tri")
    'lake/tri'
    >>> state_argument("")
    Traceback (most recent call last):
      ...
    wcoj_core.cli.console.UsageError: --state is empty: pass a directory
    """
    if not text.strip():
        raise UsageError("--state is empty: pass a directory")
    return text


def spark_message(exc: BaseException) -> str:
    """The first meaningful line of a Spark failure (the Java exception's, for Py4J)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    text = ""
    java = getattr(exc, "java_exception", None)
    if not isinstance(exc, PySparkException) and java is not None:
        try:
            text = str(java.toString())
        except Py4JError:
            text = ""
    if not text:
        try:
            text = str(exc)
        except Exception:  # a Py4J error whose text needs a gateway that is gone
            text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def add_memory_argument(p: argparse.ArgumentParser) -> None:
    """``--memory SIZE``: the process's memory budget (`wcoj_core.budget`)."""
    from wcoj_core.budget import default_description

    p.add_argument(
        "--memory",
        metavar="SIZE",
        type=memory_argument,
        default=None,
        help="the memory budget of this process, e.g. 4g or 512m: every stage streams in pieces "
        "that fit it and spills what does not to the state's scratch folder (anonymous memory, "
        f"not the page cache of mapped files; {default_description()})",
    )


def memory_argument(text: str) -> Any:
    """``--memory``: a size, as argparse's ``type=``; a bad one is a `UsageError`.

    >>> memory_argument("2g").bytes
    2147483648
    """
    from wcoj_core.budget import BudgetError, MemoryBudget

    try:
        return MemoryBudget.of(text)
    except BudgetError as e:
        raise UsageError(f"--memory: {e}") from e


class ProgressLine:
    """Progress of a long epoch on one line of stderr: rewritten in place on a terminal, else a
    line at most every `every` seconds; `done` ends it."""

    def __init__(self, every: float = 30.0) -> None:
        import time

        self._clock = time.monotonic
        self.every = every
        self.tty = sys.stderr.isatty()
        self._shown = False
        self._last = -every

    def __call__(self, line: str) -> None:
        if self.tty:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
            self._shown = True
            return
        now = self._clock()
        if now - self._last >= self.every:
            self._last = now
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self._shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self._shown = False


def add_deploy_argument(p: argparse.ArgumentParser) -> None:
    """``--deploy``: where the join kernel runs (see `wcoj_core.deploy`)."""
    p.add_argument(
        "--deploy",
        choices=("auto", "driver", "executors"),
        default="auto",
        help="where the join kernel runs: auto (the driver, within --memory, when the state is "
        "on this machine; else Spark's executors), driver, or executors (default auto)",
    )
