"""``wcoj verify``: read a whole state back against its manifests; name every damaged file.

Every kept manifest and every file it names is read once, within ``--memory``; each damaged file
is one line (its trace, the epochs it affects, whether it can be rebuilt); exit 0 when nothing
is damaged, 1 otherwise. ``--repair`` rebuilds the current generation's damaged arrangement
files from the batches and stamps again restored ones, in one new generation; a damaged batch is
only reported. No Spark starts for a local state.
"""

from __future__ import annotations

import argparse
import dataclasses

from wcoj_core.budget import MemoryBudget, Shares, default_budget
from wcoj_core.check.verify import state_scratch, verify_state
from wcoj_core.cli.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_memory_argument,
    emit_json,
    epilog,
    error,
    note,
    say,
)
from wcoj_core.indexes import rebuilt_index
from wcoj_core.spill import Spill
from wcoj_core.store.batches import Batches
from wcoj_core.store.files import check_stamp, file_ref, verify_ref
from wcoj_core.store.manifest import Index
from wcoj_core.store.store import Store

EXAMPLES = (
    "wcoj verify lake/tri",
    "wcoj verify lake/tri --repair --json",
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "verify",
        help="check every file of a state against its manifests; --repair rebuilds arrangements",
        description="Read a whole state back against its manifests and name every damaged file.",
        epilog=epilog(EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("state", metavar="STATE", help="the state directory")
    p.add_argument(
        "--repair",
        action="store_true",
        help="rebuild damaged arrangement files from the batches (one new generation)",
    )
    add_memory_argument(p)
    p.add_argument("--json", action="store_true", help="end with one JSON line of results")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    store = Store.open(args.state, create=False)
    before = store.generations()
    try:
        return _verify(args, store)
    except KeyboardInterrupt:
        after = store.generations()
        if after and (not before or after[-1] > before[-1]):
            error(
                f"interrupted after the repair was committed (generation {after[-1]}): the "
                "damaged arrangement files were rebuilt; run wcoj verify again to check the state"
            )
        elif args.repair:
            error("interrupted: nothing was repaired; the state is as it was")
        else:
            error("interrupted: the state was not read to the end; nothing was changed")
        return EXIT_INTERRUPTED


def _verify(args: argparse.Namespace, store: Store) -> int:
    report = verify_state(store, memory=args.memory)
    for damage in report.damaged:
        say(f"damaged: {damage.describe()}")
    repaired: list[str] = []
    if args.repair:
        damaged = {d.path for d in report.damaged if d.rebuildable and d.current}
        repaired = repair(store, damaged, args.memory)
        for name in repaired:
            if name.endswith(" (stamps)"):
                note(
                    f"stamped the arrangement files of {name.removesuffix(' (stamps)')} again "
                    "(their contents match: a restored or copied state)"
                )
            else:
                note(f"rebuilt the arrangements of {name} from its batches")
        if repaired:
            report = verify_state(store, memory=args.memory)
    verdict = "ok" if report.ok else f"{len(report.damaged)} damaged"
    say(
        f"verify: {verdict} ({report.files} files, {report.bytes:,} bytes, generations "
        f"{', '.join(map(str, report.generations)) or 'none'})"
    )
    if args.json:
        emit_json(
            {
                "command": "verify",
                "ok": report.ok,
                "generation": report.generation,
                "files": report.files,
                "bytes": report.bytes,
                "damaged": [dataclasses.asdict(d) for d in report.damaged],
                "repaired": repaired,
            }
        )
    return EXIT_OK if report.ok else EXIT_FAILED


def repair(store: Store, damaged: set[str], memory: MemoryBudget | None = None) -> list[str]:
    """Rebuild, in one new generation, the index of every current trace with a damaged segment
    file (`rebuilt_index`, within `memory`) and stamp again the segment files whose stamp changed
    but whose contents match; what was done."""
    base = store.current()
    files = Batches(store.files)
    traces = dict(base.traces)
    written: list[str] = []
    rebuilt: list[str] = []
    scratch = state_scratch(store)
    spill = Spill.of(scratch, Shares.of(memory or default_budget()))

    try:
        for name, trace in base.traces.items():
            if trace.index is None:
                continue
            folders = {s.path for s in trace.index.segments}
            if not any(p in folders or p.rsplit("/", 1)[0] in folders for p in damaged):
                restamped = _restamped(store, trace.index)
                if restamped is not None:
                    traces[name] = dataclasses.replace(trace, index=restamped)
                    rebuilt.append(f"{name} (stamps)")
                continue
            index = rebuilt_index(
                store.root,
                trace,
                lambda t, b: files.verified_pieces(b, t.columns),
                written,
                spill,
            )
            traces[name] = dataclasses.replace(trace, index=index)
            rebuilt.append(name)
        if rebuilt:
            store.commit(dataclasses.replace(base, traces=traces), expected=base)
    except BaseException:
        store.discard(written)
        raise
    finally:
        scratch.close()
    return rebuilt


def _restamped(store: Store, index: Index) -> Index | None:
    """The index with fresh stamps on segment files whose stamp changed but whose digest
    matches; None when every stamp holds."""
    root = store.local_root
    if root is None:
        return None
    changed = False
    segments = []
    for segment in index.segments:
        refs = {}
        for role, ref in segment.files.items():
            path = root / segment.file_path(role)
            if (
                ref.stamp is not None
                and not check_stamp(path, ref)
                and verify_ref(path, ref) is None
            ):
                refs[role] = file_ref(path)
                changed = True
            else:
                refs[role] = ref
        segments.append(dataclasses.replace(segment, files=refs))
    return dataclasses.replace(index, segments=tuple(segments)) if changed else None
