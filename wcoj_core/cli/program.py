"""The ``wcoj`` program: its parser, its commands and how every failure ends (see
`wcoj_core.cli`, whose `main` imports this module only once it can report an interruption).

Each command is a module of `wcoj_core.cli` (`COMMANDS`), imported when the command line names
it: a command that reads a manifest (``status``) does not pay for the engine's imports (numpy,
pyarrow, most of a second on a cold cache). Only ``--help`` and a mistake in the command's name
import them all.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from wcoj_core.cli.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Parser,
    error,
    spark_message,
)
from wcoj_core.errors import WcojError
from wcoj_core.knobs import knob

__all__ = ["run"]


def _version() -> str:
    from importlib import metadata  # only for --version: its imports take tens of ms

    try:
        return metadata.version("wcoj")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: argparse's, with the version looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS, **kwargs
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser._print_message(f"{PROG} {_version()}\n", sys.stdout)
        parser.exit()


# The commands in the order ``--help`` lists them, each a module with `add_parser`; and those
# that hold no arrays, which leave the allocator as it is (and so never import pyarrow).
COMMANDS = ("count", "replay", "apply", "query", "attach", "detach", "verify", "status", "explain")
NO_ARRAYS = frozenset({"status", "explain"})
# A module holding more than one command, by command.
MODULES = {"detach": "attach"}


def _parser(named: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the `named` commands."""
    parser = Parser(prog=PROG, description="Incremental worst-case-optimal joins on Spark.")
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(MODULES.get(name, name) for name in named):
        importlib.import_module(f"wcoj_core.cli.{module}").add_parser(commands)
    return parser


def interrupt_once() -> None:
    """Let the first Ctrl-C interrupt the command and ignore the ones after it: a command
    being interrupted reports how it stopped on one line, and a second Ctrl-C while it does
    (or while Python joins a pool's threads at exit) would end in a traceback instead."""
    if threading.current_thread() is not threading.main_thread():
        return

    def first(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, first)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status. A process that is the command (`argv`
    None) lets only its first Ctrl-C interrupt it (`interrupt_once`), and none once the
    command has ended: Python gives a handled signal its default action back while the
    process exits, and a Ctrl-C landing then would kill a process that reported success
    (an ignored signal stays ignored)."""
    if argv is not None:
        return _run(list(argv))
    interrupt_once()
    try:
        return _run(sys.argv[1:])
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(argv: list[str]) -> int:
    debug = knob("WCOJ_DEBUG") == "1"
    # The command the first argument names, or every command (``--help``, a mistake).
    named = argv[:1] if argv and argv[0] in COMMANDS else COMMANDS
    try:  # the imports: most of a second, where a Ctrl-C is still one line
        if not NO_ARRAYS.issuperset(named):
            from wcoj_core.memory import keep_freed_memory

            keep_freed_memory()  # before anything allocates (see `wcoj_core.memory`)
        parser = _parser(named)
    except KeyboardInterrupt:
        error("interrupted: nothing was applied")
        return EXIT_INTERRUPTED
    try:
        args = parser.parse_args(argv)
        with warnings.catch_warnings():
            # PySpark warns about the pandas version on its first DataFrame; not the user's issue.
            warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
            return int(args.run(args))
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    except (MemoryError, OSError) as exc:
        if not (isinstance(exc, MemoryError) or exc.errno == errno.ENOMEM):
            raise
        if debug:
            traceback.print_exc()
        detail = " ".join(str(exc).split())[: None if isinstance(exc, WcojError) else 200]
        error(
            f"out of memory{f' ({detail})' if detail else ''}: the command stopped; what it had "
            "committed stays, nothing else was written (give it more memory, or less work at once)"
        )
        return EXIT_FAILED
    except WcojError as exc:
        if debug:
            traceback.print_exc()
        error(str(exc))
        return EXIT_USAGE
    except Exception as exc:
        if not _from_spark(exc):
            raise
        if debug:
            traceback.print_exc()
        error(f"spark failed: {spark_message(exc)}")
        return EXIT_FAILED


def _from_spark(exc: BaseException) -> bool:
    """Whether an exception is Spark's or Py4J's (without importing either)."""
    return any(cls.__module__.split(".")[0] in ("pyspark", "py4j") for cls in type(exc).__mro__)
