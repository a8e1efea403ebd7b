"""``python -m wcoj_core.report`` (``make benchmarks``): run the benchmarks, regenerate their page.

The page, ``docs/benchmarks.md``, is written by hand except for marked regions::

    <!-- generated: NAME -->
    (rewritten from the JSON of part NAME)
    <!-- /generated -->

Parts, run in this order, each one ``wcoj`` command run in this process through `cli.main`, so
that the command the page prints is exactly the one that ran:

* ``epochs`` — ``wcoj bench`` on web-NotreDame, 1,000-change epochs and a skew epoch, all three
  methods;
* ``static`` — ``wcoj bench --static`` on web-NotreDame, every static method;
* ``curve-size`` and ``curve-epoch-size`` — ``wcoj bench --curve`` (`wcoj_core.curves`).

Each part's JSON line, with its command, date, wall time, load average and the machine
(`wcoj_core.machine`), is saved as ``<root>/bench/<part>.json``; a curve's plot goes to
``<root>/img/<part>.png``. After every part the page is rendered again from every saved JSON:
the region of each part, and ``machine`` (machine, versions, dates and the exact commands). A
region without a saved JSON is left as it is; the text outside the regions is never touched.
Rendering (`wcoj_core.page`) reads only the JSON, so ``--render-only`` rebuilds the same page
without running anything.

Options: ``--only PART`` (repeatable) reruns some parts; ``--render-only``; ``--quick`` runs
tiny generated graphs instead (no SNAP file, a minute or two in all) and writes under ``--root``, by
default a new temporary directory, starting from a copy of the repository's page; ``--root DIR``
(default ``docs``) holds ``benchmarks.md``, ``bench/`` and ``img/``; ``--data DIR`` (default
``../shared/data``) holds the SNAP files; ``--master URL``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import shutil
import sys
import tempfile
import time as clock
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import NoReturn, TextIO

from pyspark.sql import SparkSession

from wcoj_core import cli
from wcoj_core.errors import WcojError
from wcoj_core.machine import load_average, machine_facts
from wcoj_core.page import MACHINE, PAGE, RENDER, render_machine, replace_regions

PARTS = ("epochs", "static", "curve-size", "curve-epoch-size")
NOTRE_DAME = "web-NotreDame.txt.gz"
DEFAULT_ROOT = "docs"
DEFAULT_DATA = "../shared/data"
REPO_PAGE = Path(__file__).resolve().parents[1] / "docs" / PAGE


class ReportError(WcojError):
    """A report that cannot run or render: missing page, region, data file or failed part."""


# -- the commands -------------------------------------------------------------------------------


def commands(quick: bool, data: str, img: Path, master: str | None = None) -> dict[str, list[str]]:
    """Each part's ``wcoj`` arguments: the full runs, or tiny generated graphs with `quick`."""
    nd = f"edge={data}/{NOTRE_DAME}"
    if quick:
        epochs = ["--input", "edge=rmat:scale=9,edges=3000,seed=5", "--epochs", "2"]
        epochs += ["--epoch-size", "10", "--skew", "60"]
        static = ["--input", "edge=rmat:scale=8,edges=1500,seed=3", "--repeat", "1"]
        static += ["--methods", "wcoj,spark-sql,duckdb,scipy"]
        size = ["--sizes", "1000,3000", "--epoch-size", "10", "--epochs", "2"]
        epoch_size = ["--input", "edge=rmat:scale=9,edges=4000,seed=2", "--epoch-sizes", "4,20"]
        epoch_size += ["--epochs", "2"]
    else:
        epochs = ["--input", nd, "--epochs", "4", "--epoch-size", "1000", "--skew", "3000"]
        static = ["--input", nd, "--repeat", "5"]
        size = ["--sizes", "200000,2000000,20000000", "--epoch-size", "1000", "--epochs", "4"]
        epoch_size = ["--input", nd, "--epoch-sizes", "10,100,1000,10000,100000", "--epochs", "4"]
    runs = {
        "epochs": ["bench", *epochs],
        "static": ["bench", "--static", *static],
        "curve-size": ["bench", "--curve", "size", "--input", "edge=rmat:seed=1", *size],
        "curve-epoch-size": ["bench", "--curve", "epoch-size", *epoch_size],
    }
    for curve in ("curve-size", "curve-epoch-size"):
        runs[curve] += ["--plot", str(img / f"{curve}.png")]
    tail = ["--undirected", "edge", *(["--master", master] if master else []), "--json"]
    return {name: [*argv, *tail] for name, argv in runs.items()}


# -- running ------------------------------------------------------------------------------------


class _Tee(io.StringIO):
    """Standard output of a part: echoed to stderr as it comes, kept for its last (JSON) line."""

    def __init__(self, echo: TextIO) -> None:
        super().__init__()
        self.echo = echo

    def write(self, text: str) -> int:
        self.echo.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.echo.flush()


def run_part(name: str, argv: list[str], bench_dir: Path, say: Callable[[str], None]) -> Path:
    """Run one part's command; save its JSON with the command, date, time and machine."""
    command = "wcoj " + shlex.join(argv)
    say(f"report: {name}: {command}")
    before = load_average()
    start = clock.perf_counter()
    out = _Tee(sys.stderr)
    with redirect_stdout(out):
        status = cli.main(argv)
    seconds = clock.perf_counter() - start
    if status != cli.EXIT_OK:
        raise ReportError(
            f"part {name} failed (exit status {status}, error above); its JSON and the page's "
            f"region are left as they were: {command}"
        )
    lines = out.getvalue().strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise ReportError(f"part {name} printed no JSON line at the end: {command}")
    spark = SparkSession.getActiveSession()
    record = {
        "part": name,
        "command": command,
        "argv": argv,
        "seconds": round(seconds, 1),
        "load_average": [before, load_average()],
        "machine": machine_facts(spark),
        "result": json.loads(lines[-1]),
    }
    if spark is not None:
        spark.catalog.clearCache()
    bench_dir.mkdir(parents=True, exist_ok=True)
    path = bench_dir / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    say(f"report: {name}: done in {seconds:.0f} s; wrote {path}")
    return path


# -- rendering ----------------------------------------------------------------------------------


def render(root: Path, say: Callable[[str], None]) -> list[str]:
    """Rewrite the regions of ``root/benchmarks.md`` from ``root/bench/*.json``; their names."""
    page = root / PAGE
    if not page.is_file():
        raise ReportError(f"no {page}: run from the repository's root or pass --root DIR")
    records = {}
    for name in PARTS:
        path = root / "bench" / f"{name}.json"
        if path.is_file():
            records[name] = json.loads(path.read_text())
        else:
            say(f"report: no {path}: region {name!r} left as it is")
    bodies = {name: RENDER[name](record) for name, record in records.items()}
    if records:
        bodies[MACHINE] = render_machine(records)
    text = page.read_text()
    updated = replace_regions(text, bodies, str(page))
    if updated != text:
        page.write_text(updated)
    say(f"report: rendered {page}: {', '.join(bodies) or 'nothing'}")
    return list(bodies)


# -- the command --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ReportError(f"{message} (see 'python -m wcoj_core.report --help')")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m wcoj_core.report",
        description="Run the benchmarks and regenerate docs/benchmarks.md from their JSON.",
    )
    p.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    p.add_argument("--render-only", action="store_true", help="rebuild the page from saved JSON")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny generated graphs; writes under --root (a temp dir)",
    )
    p.add_argument("--root", metavar="DIR", help=f"page, bench/ and img/ (default {DEFAULT_ROOT})")
    p.add_argument(
        "--data",
        default=DEFAULT_DATA,
        metavar="DIR",
        help=f"the SNAP files (default {DEFAULT_DATA})",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    return p


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _prepare_root(args: argparse.Namespace) -> Path:
    if args.root is None and args.quick:
        root = Path(tempfile.mkdtemp(prefix="wcoj-report-"))
    else:
        root = Path(args.root or DEFAULT_ROOT)
    page = root / PAGE
    if args.quick and not page.exists():
        if not REPO_PAGE.is_file():
            raise ReportError(f"--quick starts from a copy of {REPO_PAGE}, which is missing")
        root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_PAGE, page)
    if not page.is_file():
        raise ReportError(f"no {page}: run from the repository's root or pass --root DIR")
    return root


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = _say) -> int:
    """Run the chosen parts (or none with --render-only) and render the page; the exit status."""
    try:
        args = _parser().parse_args(argv)
        if args.render_only and args.only:
            raise ReportError("--render-only runs nothing; drop --only")
        root = _prepare_root(args)
        say(f"report: writing under {root}")
        chosen = [] if args.render_only else [p for p in PARTS if not args.only or p in args.only]
        runs = commands(args.quick, args.data, root / "img", args.master)
        if not args.quick and any(p != "curve-size" for p in chosen):
            snap = Path(args.data) / NOTRE_DAME
            if not snap.is_file():
                raise ReportError(f"no {snap}: pass --data DIR, the folder of the SNAP files")
        for name in chosen:
            run_part(name, runs[name], root / "bench", say)
            render(root, say)
        if not chosen:
            render(root, say)
    except WcojError as exc:
        print(f"wcoj report: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return cli.EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else cli.EXIT_OK
    except KeyboardInterrupt:
        print("wcoj report: error: interrupted", file=sys.stderr, flush=True)
        return cli.EXIT_INTERRUPTED
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
