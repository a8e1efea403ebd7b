"""``wcoj-bench report`` (``make benchmarks``): run the benchmarks, regenerate their page.

Also ``python -m wcoj_bench.report``, with the same options.

The page, ``docs/benchmarks.md``, is written by hand except for marked regions::

    <!-- generated: NAME -->
    (rewritten from the JSON of part NAME)
    <!-- /generated -->

Parts, run in this order, each one ``wcoj-bench`` command run in a process of its own (``python -m
wcoj_bench``: its own Spark session and settings), so that the command the page prints is
exactly the one that ran:

* ``epochs`` — ``wcoj-bench epochs`` on web-NotreDame, 1,000-change epochs and a skew epoch, all three
  methods;
* ``static`` — ``wcoj-bench static`` on web-NotreDame, every static method;
* ``curve-size`` and ``curve-epoch-size`` — ``wcoj-bench curve`` (`wcoj_bench.parts.curves`);
* ``cold`` — ``wcoj-bench cold`` (`wcoj_bench.parts.cold`): whole processes, exec to exit, on
  web-NotreDame (a fresh ``wcoj apply`` per epoch against a fresh Spark SQL recompute, opening
  the state, the warm epoch as a set and as a bag) and on R-MAT graphs of 0.2 M to 20 M edges;
* ``dagster-run`` — ``wcoj-bench dagster-run`` (`wcoj_bench.parts.dagster_run`): the README's quick
  start on web-NotreDame, each 1,000-change epoch partition a fresh ``dagster job execute``,
  beside the same job with empty bodies;
* ``scale`` — ``wcoj-bench scale`` (`wcoj_bench.parts.scale`): the memory budget at 18.6 M edges, a
  one-epoch load, a build in epochs and fresh epochs, each a whole process with its tree's peak
  anonymous memory;
* ``cluster-static``, ``cluster-epochs``, ``cluster-curve-size``, ``cluster-cliques`` — the same
  kinds of runs on a two-worker, one-core-each standalone cluster that the report starts on this
  machine (`wcoj_bench.infra.cluster`) and stops afterwards, with wcoj's kernel on the executors
  (``--deploy executors``): web-NotreDame counted against Spark SQL and the neighbour array;
  its 1,000-change epochs against recompute; R-MAT graphs up to 20 M edges with a 1 GiB driver;
  4-cliques of the densest shared graphs (facebook_combined: the highest mean degree;
  email-Eu-core: the highest edge density) with 1 GiB executors, their Python workers held to
  1 GiB; ``cluster-idle`` (`wcoj_bench.parts.idle`): 1,000-change epochs of the 2 M-edge R-MAT graph
  back to back, then two minutes apart (20 M edges, issue 21's size, once the state of that
  graph can be built within the machine's memory).

The process parts (``cold``, ``dagster-run``, ``cluster-idle``) keep their prepared graphs and built states in
``.wcoj/bench`` (under ``--root`` with ``--quick``): each graph's state is built once, by
``wcoj apply``, and reused by later runs until `wcoj_core`'s source changes.

Each part's JSON line, with its command, date, wall time, load average and the machine
(`wcoj_bench.infra.machine`), is saved as ``<root>/bench/<part>.json``; a curve's plot goes to
``<root>/img/<part>.png``. After every part the page is rendered again from every saved JSON:
the region of each part, and ``machine`` (machine, versions, dates and the exact commands). A
region without a saved JSON is left as it is; the text outside the regions is never touched.
Rendering (`wcoj_bench.page`) reads only the JSON, so ``--render-only`` rebuilds the same page
without running anything.

Options: ``--only PART`` (repeatable) reruns some parts; ``--render-only``; ``--quick`` runs
tiny generated graphs instead (no SNAP file) and writes under ``--root``, by default a new
temporary directory, starting from a copy of the repository's page. Its timings mean nothing, so
it runs the local parts and the cluster parts as two streams at once (each stream's parts one
after another, the page rendered by one of them at a time), and its Spark sessions are set for
tiny data (`QUICK_SPARK`); ``--root DIR``
(default ``docs``) holds ``benchmarks.md``, ``bench/`` and ``img/``; ``--data DIR`` (default
``../shared/data``) holds the SNAP files; ``--master URL``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time as clock
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from wcoj_bench.infra.machine import load_average, machine_facts
from wcoj_bench.page import MACHINE, PAGE, RENDERERS, render_machine, replace_regions
from wcoj_core.cli.console import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from wcoj_core.errors import WcojError

LOCAL_PARTS = ("epochs", "static", "curve-size", "curve-epoch-size", "cold", "dagster-run", "scale")
CLUSTER_PARTS = (
    "cluster-static",
    "cluster-epochs",
    "cluster-curve-size",
    "cluster-cliques",
    "cluster-cliques-dense",
    "cluster-idle",
)
PARTS = (*LOCAL_PARTS, *CLUSTER_PARTS)
# The parts that read no SNAP file (their graphs are generated).
GENERATED_ONLY = ("curve-size", "cluster-curve-size", "cluster-idle")
# The cluster the cluster parts run on (what `wcoj-bench cluster up` starts by default).
CLUSTER = {"workers": 2, "cores": 1, "memory": "2g"}
ONE_GIB = ["--conf", "spark.executor.memory=1g", "--conf", "spark.executor.pyspark.memory=1g"]
NOTRE_DAME = "web-NotreDame.txt.gz"
DEFAULT_ROOT = "docs"
DEFAULT_DATA = "../shared/data"
REPO_PAGE = Path(__file__).resolve().parents[1] / "docs" / PAGE
# The quick run's Spark sessions (its graphs have a few thousand edges): two shuffle partitions,
# not eight, and interpreted plans (compiling code per plan costs more than these plans run).
QUICK_SPARK = [
    *["--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.sql.codegen.wholeStage=false"],
    *["--conf", "spark.driver.memory=1g"],
]


class ReportError(WcojError):
    """A report that cannot run or render: missing page, region, data file or failed part."""


# -- the commands -------------------------------------------------------------------------------


def commands(
    quick: bool,
    data: str,
    img: Path,
    master: str | None = None,
    cluster: str = "CLUSTER",
    scratch: Path | None = None,
) -> dict[str, list[str]]:
    """Each part's ``wcoj-bench`` arguments: the full runs, or tiny generated graphs with `quick`;
    the cluster parts on the master `cluster`; the process parts' graphs and states under
    `scratch` (default: their own, ``.wcoj/bench``, kept between runs)."""
    nd = f"edge={data}/{NOTRE_DAME}"
    if quick:
        epochs = ["--input", "edge=rmat:scale=9,edges=3000,seed=5", "--epochs", "2"]
        epochs += ["--epoch-size", "10", "--skew", "60"]
        static = ["--input", "edge=rmat:scale=8,edges=1500,seed=3", "--repeat", "1"]
        static += ["--methods", "wcoj,spark-sql,duckdb,scipy"]
        size = ["--sizes", "1000,3000", "--epoch-size", "10", "--epochs", "2"]
        epoch_size = ["--input", "edge=rmat:scale=9,edges=4000,seed=2", "--epoch-sizes", "4,20"]
        epoch_size += ["--epochs", "2"]
        cliques = ["--input", "edge=rmat:scale=8,edges=1500,seed=3"]
        dense = ["--input", "edge=rmat:scale=7,edges=1200,seed=4"]
        cold = ["--input", "edge=rmat:scale=9,edges=3000,seed=5", "--epochs", "2"]
        cold += ["--warm-epochs", "3", "--epoch-size", "20", "--sizes", "1000,3000"]
        idle = ["--input", "edge=rmat:scale=9,edges=3000,seed=5", "--epochs", "2"]
        idle += ["--epoch-size", "20", "--gap", "1"]
        dagster = ["--input", "edge=rmat:scale=9,edges=3000,seed=5", "--epochs", "2"]
        dagster += ["--epoch-size", "20"]
        scale = ["--rmat", "rmat:scale=9,edges=3000,seed=5", "--build", "2", "--epochs", "2"]
        scale += ["--epoch-size", "20", "--sizes", "rmat:scale=8,edges=1500,seed=3"]
        scale += ["--methods", "duckdb", "--memory", "256m", "--timeout", "300"]
    else:
        epochs = ["--input", nd, "--epochs", "4", "--epoch-size", "1000", "--skew", "3000"]
        static = ["--input", nd, "--repeat", "5"]
        size = ["--sizes", "200000,2000000,20000000", "--epoch-size", "1000", "--epochs", "4"]
        epoch_size = ["--input", nd, "--epoch-sizes", "10,100,1000,10000,100000", "--epochs", "4"]
        cliques = ["--input", f"edge={data}/facebook_combined.txt.gz"]
        dense = ["--input", f"edge={data}/email-Eu-core.txt.gz"]
        cold = ["--input", nd, "--epochs", "6", "--warm-epochs", "12", "--epoch-size", "1000"]
        # Not 20 M: building its state (five 3.7 M-edge epochs through `wcoj apply`) ran out of
        # the machine's 24 GiB at the second epoch (docs/benchmarks.md, the cold part's notes).
        cold += ["--sizes", "200000,2000000"]
        # 2 M edges, not issue 21's 20 M: that graph's state could not be built (see `cold`'s).
        idle = ["--input", "edge=rmat:scale=17,edges=2000000,seed=1", "--epochs", "4"]
        idle += ["--epoch-size", "1000", "--gap", "120"]
        dagster = ["--input", nd, "--epochs", "6", "--epoch-size", "1000"]
        # Issue 31's graph and budget; the static counts stopped after half an hour each.
        scale = ["--rmat", "rmat:scale=20,edges=20000000,seed=1", "--memory", "4g"]
        scale += ["--build", "5", "--epochs", "4", "--timeout", "1800"]
    where = ["--scratch", str(scratch)] if scratch is not None else []
    # The quick run's cluster stream runs beside the local one: a cache of its own, so that no
    # state is built by both at once (one's cleanup removed the other's chunk files).
    apart = ["--scratch", f"{scratch}-cluster"] if scratch is not None else []
    runs = {
        "epochs": ["epochs", *epochs],
        "static": ["static", *static],
        "curve-size": ["curve", "size", "--input", "edge=rmat:seed=1", *size],
        "curve-epoch-size": ["curve", "epoch-size", *epoch_size],
    }
    runs["cold"] = ["cold", *cold, *where, "--plot", str(img / "cold.png")]
    for curve in ("curve-size", "curve-epoch-size"):
        runs[curve] += ["--plot", str(img / f"{curve}.png")]
    tiny = QUICK_SPARK if quick else []  # the parts that start a Spark session of their own
    tail = ["--undirected", "edge", *(["--master", master] if master else []), *tiny, "--json"]
    out = {name: [*argv, *tail] for name, argv in runs.items()}
    out["cold"] = [*runs["cold"], "--undirected", "edge", "--json"]  # starts no Spark itself
    out["dagster-run"] = ["dagster-run", *dagster, *where, "--undirected", "edge", "--json"]
    out["scale"] = ["scale", *scale, *where, "--json"]  # whole processes: starts no Spark itself
    on = ["--master", cluster, "--deploy", "executors", "--undirected", "edge", *tiny, "--json"]
    three = ["--methods", "wcoj,wcoj-apply,spark-sql,neighbour-array"]
    # Quick: one run per method (its medians mean nothing), as the local static part does.
    repeat = "1" if quick else "3"
    out["cluster-static"] = ["static", *static[:2], "--repeat", repeat, *three, *on]
    out["cluster-epochs"] = ["epochs", *epochs, "--methods", "recompute,wcoj", *on]
    out["cluster-curve-size"] = [
        *["curve", "size", "--input", "edge=rmat:seed=1", *size],
        *["--methods", "binary-delta,wcoj"],
        *["--conf", "spark.driver.memory=1g", "--plot", str(img / "cluster-curve-size.png"), *on],
    ]
    for part, graph in (("cluster-cliques", cliques), ("cluster-cliques-dense", dense)):
        out[part] = [
            *["static", "--query", "4-cliques", *graph, "--repeat", "1", "--methods", "wcoj"],
            *[*ONE_GIB, *on],
        ]
    out["cluster-idle"] = ["idle", *idle, *apart, *on]
    return out


# -- running ------------------------------------------------------------------------------------


def run_part(name: str, argv: list[str], bench_dir: Path, say: Callable[[str], None]) -> Path:
    """Run one part's command in a process of its own; save its JSON with the command, date,
    time, load and machine (the machine and Spark settings as that process saw them)."""
    command = f"wcoj-bench {shlex.join(argv)}"
    say(f"report: {name}: {command}")
    before = load_average()
    start = clock.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wcoj_bench", *argv], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:  # echoed to stderr as it comes, kept for the last (JSON) line
        sys.stderr.write(line)
        lines.append(line.rstrip("\n"))
    status = proc.wait()
    seconds = clock.perf_counter() - start
    if status != EXIT_OK:
        raise ReportError(
            f"part {name} failed (exit status {status}, error above); its JSON and the page's "
            f"region are left as they were: {command}"
        )
    lines = [line for line in lines if line.strip()]
    if not lines or not lines[-1].startswith("{"):
        raise ReportError(f"part {name} printed no JSON line at the end: {command}")
    result = json.loads(lines[-1])
    record = {
        "part": name,
        "command": command,
        "argv": argv,
        "seconds": round(seconds, 1),
        "load_average": [before, load_average()],
        "machine": result.pop("machine", None) or machine_facts(None),
        "result": result,
    }
    bench_dir.mkdir(parents=True, exist_ok=True)
    path = bench_dir / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    say(f"report: {name}: done in {seconds:.0f} s; wrote {path}")
    return path


@contextmanager
def local_cluster(root: Path, say: Callable[[str], None]) -> Iterator[str]:
    """A standalone cluster on this machine for the cluster parts: its master URL; stopped
    after, whatever happens."""
    from wcoj_bench.infra import cluster

    where = root / "cluster"
    say(f"report: starting a cluster ({CLUSTER}) under {where}")
    running = cluster.up(where, port=0, ui_port=0, timeout=300, **CLUSTER)  # type: ignore[arg-type]
    try:
        yield running.master
    finally:
        cluster.down(where)
        say("report: the cluster is stopped")


def run_local(
    names: list[str], runs: dict[str, list[str]], root: Path, say: Callable[[str], None]
) -> None:
    """The local parts `names`, one after another, the page rendered after each."""
    for name in names:
        run_part(name, runs[name], root / "bench", say)
        render(root, say)


def run_on_cluster(
    names: list[str], runs: dict[str, list[str]], root: Path, say: Callable[[str], None]
) -> None:
    """The cluster parts `names` on a cluster started for them, one after another, the page
    rendered after each; the cluster stopped after, whatever happens."""
    if not names:
        return
    scratch = Path(tempfile.mkdtemp(prefix="wcoj-report-cluster-"))
    with local_cluster(scratch, say) as master:
        for name in names:
            argv = [master if a == "CLUSTER" else a for a in runs[name]]
            run_part(name, argv, root / "bench", say)
            render(root, say)
    shutil.rmtree(scratch, ignore_errors=True)


def both_at_once(*streams: Callable[[], None]) -> None:
    """Run `streams` at once, each in a thread (their parts are processes of their own); the
    first error is raised once every stream has ended."""
    with ThreadPoolExecutor(len(streams), thread_name_prefix="report") as pool:
        futures = [pool.submit(stream) for stream in streams]
    for future in futures:
        future.result()


# -- rendering ----------------------------------------------------------------------------------

_RENDERING = threading.Lock()  # the quick run's two streams render one at a time


def render(root: Path, say: Callable[[str], None]) -> list[str]:
    """Rewrite the regions of ``root/benchmarks.md`` from ``root/bench/*.json``; their names."""
    with _RENDERING:
        return _render(root, say)


def _render(root: Path, say: Callable[[str], None]) -> list[str]:
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
    bodies = {name: RENDERERS[name](record) for name, record in records.items()}
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
        raise ReportError(f"{message} (see '{self.prog} --help')")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="wcoj-bench report",
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
        scratch = root / "scratch" if args.quick else None
        runs = commands(args.quick, args.data, root / "img", args.master, scratch=scratch)
        if not args.quick and any(p not in GENERATED_ONLY for p in chosen):
            snap = Path(args.data) / NOTRE_DAME
            if not snap.is_file():
                raise ReportError(f"no {snap}: pass --data DIR, the folder of the SNAP files")
        local = [p for p in chosen if p in LOCAL_PARTS]
        on_cluster = [p for p in chosen if p in CLUSTER_PARTS]
        streams = (
            lambda: run_local(local, runs, root, say),
            lambda: run_on_cluster(on_cluster, runs, root, say),
        )
        if args.quick:  # its timings mean nothing: the two streams at once
            both_at_once(*streams)
        else:  # one part at a time: each part's timings its own
            for stream in streams:
                stream()
        if not chosen:
            render(root, say)
    except WcojError as exc:
        print(
            f"wcoj-bench report: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True
        )
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        print("wcoj-bench report: error: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
