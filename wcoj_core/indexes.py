"""A trace's arrangements as of an epoch: its persisted index, corrected, and advanced.

A trace's index (`wcoj_core.store.manifest.Index`) covers its batches up to the index's time: per
*view key* (an atom view, or None, and a column order) a base segment and a few recent ones
(`wcoj_core.store.segments`). `open_trace` gives the trace as of just before an epoch: the mapped
segments plus a *correction* layer of the batches the index lacks (added) or holds beyond the old
state (subtracted); the usual epoch, the next after the index, reads no batch. Missing or damaged
segments, or no index, rebuild the trace from its batches (`Opened.rebuilt`). `advance` adds one
recent segment per view key after an epoch, merged together beyond `MAX_RECENT` and into a new
base beyond `MERGE_SHARE` of it. `plan_views` says which view keys the plans read. A process
applying epoch after epoch keeps its segments mapped (`KEPT`) while their stamps are unchanged.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from wcoj_core.kernel.join import prepare
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, arranged, merged, summed_sorted
from wcoj_core.kernel.stored import DAMAGED_FILES
from wcoj_core.query.ir import Const
from wcoj_core.query.plan import AtomView, Kind, Plan, Version
from wcoj_core.store import segments
from wcoj_core.store.files import stamp_of, sync_soon
from wcoj_core.store.manifest import Batch, Index, Level, Segment, Trace
from wcoj_core.store.names import segment_name, trace_dir
from wcoj_core.traces import counts_trace_name

if TYPE_CHECKING:
    from wcoj_core.spill import Spill

# Recent segments per view key before they are merged into one, and the share of the base's
# rows (at least `MERGE_MIN_ROWS`) beyond which the merged recent segment joins the base.
MAX_RECENT = 6
MERGE_SHARE = 0.05
MERGE_MIN_ROWS = 50_000

# A view key: the atom view's pattern (None: the trace as stored) and the column order.
Pattern = tuple[int | Const, ...]
ViewKey = tuple[Pattern | None, tuple[int, ...]]


def view_key(view: AtomView | None, order: Sequence[int]) -> ViewKey:
    """The key of a view of a trace: an identity view is the trace as stored.

    >>> view_key(AtomView("e", (0, 1)), (1, 0))
    (None, (1, 0))
    >>> view_key(AtomView("e", (0, 0)), (0,))
    ((0, 0), (0,))
    """
    if view is None or view.is_identity:
        return (None, tuple(order))
    return (view.pattern, tuple(order))


def identity(width: int) -> ViewKey:
    return (None, tuple(range(width)))


def arrange(layer: Layer, key: ViewKey) -> Layer:
    """A layer of a trace (as stored) seen through a view key."""
    pattern, order = key
    view = None if pattern is None else AtomView("", pattern)
    return arranged(layer, view, order)


class _Recorder:
    """A `Layers` that records what a rule reads (and holds nothing)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[ViewKey]] = {}

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        if version is not Version.DELTA:
            self.seen.setdefault(name, set()).add(view_key(view, order))
        return []

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        return Layer.empty(len(order))


def plan_views(plans: Iterable[Plan], widths: Mapping[str, int]) -> dict[str, frozenset[ViewKey]]:
    """Every view key the plans' rules read, per trace, plus each trace's identity (what
    lookups of changed tuples read); `widths` gives every trace to index and its width."""
    recorder = _Recorder()
    for plan in plans:
        for rule in plan.rules:
            prepare(plan, rule, recorder)  # type: ignore[arg-type]
    return {
        name: frozenset({identity(width), *recorder.seen.get(name, set())})
        for name, width in widths.items()
    }


def counts_names(plans: Iterable[Plan]) -> dict[str, tuple[str, ...]]:
    """The counts traces the plans read, each once, with their columns."""
    out: dict[str, tuple[str, ...]] = {}
    for plan in plans:
        for a in plan.arrangements:
            if a.kind is Kind.COUNTS:
                out[counts_trace_name(a)] = tuple(f"c{k}" for k in a.key)
    return out


# A function reading a batch whole (its files checked against their digests) as a layer.
ReadBatch = Callable[[Trace, Batch], Layer]
# A function reading a batch a piece at a time (its files checked first): rows and diffs.
ReadChunks = Callable[[Trace, Batch], Iterable[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True, slots=True)
class Streamed:
    """How a trace is rebuilt from its batches within a memory budget: each batch read a piece
    at a time (`read_chunks`), the pieces summed through `spill`'s sorted runs and every view
    arranged by it (mapped from the scratch folder when they spilled)."""

    read_chunks: ReadChunks
    spill: Spill


@dataclass
class Opened:
    """A trace as of just before an epoch, through any view key: `segments` (mapped, per view key),
    `correction` (signed: what the old state holds beyond them), `read` (batches read whole, by
    path), `rebuilt` (why the index was not used, "" when it was), `mapped` and `read_bytes`."""

    trace: Trace
    before: int
    segments: dict[ViewKey, list[Layer]]
    correction: Layer
    index: Index | None
    read: dict[str, Layer] = field(default_factory=dict)
    rebuilt: str = ""
    damaged: bool = False  # an index was there but could not be used
    mapped: int = 0
    read_bytes: int = 0
    maps: dict[str, int] = field(default_factory=dict)  # the bytes of each segment mapped
    _derived: dict[ViewKey, list[Layer]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.trace.name

    def layers(self, view: AtomView | None, order: tuple[int, ...]) -> list[Layer]:
        """The trace through a view, as layers to sum (the `TraceIndex` protocol)."""
        return self.at(view_key(view, order))

    def at(self, key: ViewKey) -> list[Layer]:
        found = self._derived.get(key)
        if found is not None:
            return found
        held = self.segments.get(key)
        if held is None:
            # A view no segment holds: derived once from the whole trace (a view the index was
            # not built for, e.g. a state rebuilt for fewer queries).
            whole = self.whole()
            held = [arrange(whole, key)] if len(whole) else []
            out = held
        else:
            out = [layer for layer in held if len(layer)]
            if len(self.correction):
                out.append(arrange(self.correction, key))
        self._derived[key] = out
        return out

    def whole(self) -> Layer:
        """The trace as stored, summed into one layer (reads every segment of the identity)."""
        key = identity(len(self.trace.columns))
        layers = [*self.segments.get(key, []), self.correction]
        total = Layer.empty(len(self.trace.columns))
        for layer in layers:
            total = merged(total, layer)
        return total


class KeptSegments:
    """Segments this process mapped, kept for its next epochs: `open` reuses one while its record
    and every file's stamp are unchanged (a file rewritten in place changes its stamp), else
    opens and checks it again; `keep_only` forgets what the current manifest no longer names;
    at most `most` are kept."""

    def __init__(self, most: int = 512) -> None:
        self.most = most
        self._held: OrderedDict[tuple[str, str], tuple[Segment, tuple[object, ...], Layer]] = (
            OrderedDict()
        )
        self._folds: OrderedDict[tuple[tuple[int, ...], tuple[Layer, ...]], Layer] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, root: str, segment: Segment) -> Layer:
        if segment.rows == 0:
            return segments.open_segment(root, segment)
        paths = segments.segment_files(root, segment)
        key = (os.fspath(root), segment.path)
        with self._lock:
            found = self._held.get(key)
        fresh = found is not None and found[0] == segment and found[1] == _stamps(paths)
        if fresh and found is not None and paths[0] not in DAMAGED_FILES:
            with self._lock:
                self._held.move_to_end(key)
            layer = found[2]
            layer.directory()  # opened again: worth a directory (built once, None if sparse)
            return layer
        layer = segments.open_segment(root, segment)
        stamps = _stamps(paths)
        with self._lock:
            self._held[key] = (segment, stamps, layer)
            while len(self._held) > self.most:
                self._held.popitem(last=False)
        return layer

    def folded(self, segs: Sequence[Segment], layers: Sequence[Layer]) -> list[Layer]:
        """One view key's layers with its recent segments summed into one (a lookup then
        searches the base and one or two recent layers, not up to `MAX_RECENT` of them): made
        once per list of recent layers, from the last sum when the list only grew."""
        base = [x for s, x in zip(segs, layers, strict=True) if s.level is Level.BASE]
        recent = [x for s, x in zip(segs, layers, strict=True) if s.level is not Level.BASE]
        recent = [x for x in recent if len(x)]
        if len(recent) > 2 and len(recent[0]) > sum(len(x) for x in recent[1:]):
            # The first recent segment is earlier ones merged, larger than the rest together:
            # kept apart, so that each epoch sums only the small ones (a sort of a few rows).
            base.append(recent.pop(0))
        if len(recent) < 2:
            return [*base, *recent]
        ids = tuple(id(x) for x in recent)
        with self._lock:
            known = list(self._folds.items())
        total: Layer | None = None
        for (held, _), found in reversed(known):
            if ids == held:
                total = found
                break
            if held == ids[: len(held)]:
                total = summed_sorted([found, *recent[len(held) :]])
                break
        if total is None:
            total = summed_sorted(recent)
        with self._lock:
            # Held with the layers it sums, so that their ids stay theirs while it is kept.
            self._folds[(ids, tuple(recent))] = total
            while len(self._folds) > 64:
                self._folds.popitem(last=False)
        return [*base, total]

    def keep_only(self, root: str, used: Iterable[str]) -> None:
        """Forget the segments of the state `root` whose folders are not in `used`."""
        root, keep = os.fspath(root), set(used)
        with self._lock:
            for key in [k for k in self._held if k[0] == root and k[1] not in keep]:
                del self._held[key]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._folds.clear()


def _stamps(paths: Iterable[os.PathLike[str] | str]) -> tuple[object, ...]:
    out: list[object] = []
    for p in paths:
        try:
            out.append(stamp_of(os.stat(p)))
        except OSError:
            out.append(None)
    return tuple(out)


def kept_most() -> int:
    """How many segments a process keeps mapped (each mapping holds a file descriptor): at most
    128, and never more than a twelfth of the descriptor limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 32
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 128
    return max(8, min(128, soft // 12))


# The driver's kept segments (`EpochPass` opens traces through it).
KEPT = KeptSegments(kept_most())


def open_trace(
    root: str,
    trace: Trace,
    before: int,
    keys: Iterable[ViewKey],
    read_batch: ReadBatch,
    *,
    verify: bool = False,
    kept: KeptSegments | None = None,
    streamed: Streamed | None = None,
    mirror: bool = False,
) -> Opened:
    """The trace as of just before epoch `before`, through every view key in `keys` (see the
    module). A damaged or missing index is rebuilt from the batches (`streamed`: a piece at a
    time); a damaged batch raises. `kept` reuses segments an earlier epoch mapped; with `mirror`
    (an undirected trace) the reversed view is read from the identity's segments."""
    wanted = [b for b in trace.batches if b.time < before]
    index = trace.index
    keys = set(keys)

    def rebuild(reason: str) -> Opened:
        return _rebuild(trace, before, wanted, keys, read_batch, reason, streamed)

    if index is None or not index.segments:
        return rebuild("" if not wanted else "the trace has no index")
    covered = {b.path for b in trace.batches if b.time <= index.time}
    held = {k: [s for s in index.segments if _segment_key(s) == k] for k in keys}
    if any(not segs for segs in held.values()):
        missing = [k for k, segs in held.items() if not segs]
        found = rebuild(f"the index lacks the view(s) {missing}")
        found.damaged = True
        return found

    def opener(s: Segment) -> Layer:
        if kept is None or verify:
            return segments.open_segment(root, s, verify=verify)
        return kept.open(root, s)

    same = _mirrored_keys(keys, len(trace.columns)) if mirror and not verify else {}
    try:
        mapped = {k: [opener(s) for s in segs] for k, segs in held.items() if k not in same}
        if kept is not None and not verify:
            mapped = {k: kept.folded(held[k], layers) for k, layers in mapped.items()}
        for k, other in same.items():
            mapped[k] = mapped[other]
    except segments.DamagedFile as e:
        found = rebuild(str(e))
        found.damaged = True
        return found
    opened = Opened(trace, before, mapped, Layer.empty(len(trace.columns)), index)
    opened.maps = {
        s.path: segments.segment_bytes(s) for k, segs in held.items() if k not in same for s in segs
    }
    opened.mapped = sum(opened.maps.values())
    plus = [b for b in wanted if b.path not in covered]
    wanted_paths = {b.path for b in wanted}
    minus = [b for b in trace.batches if b.path in covered and b.path not in wanted_paths]
    opened.correction = _signed(trace, plus, minus, read_batch, opened)
    return opened


def _mirrored_keys(keys: Iterable[ViewKey], width: int) -> dict[ViewKey, ViewKey]:
    """Of a binary trace that is its own mirror, the reversed view key (when it is read along
    with the identity) and the identity that holds its rows."""
    reverse, ident = (None, (1, 0)), identity(width)
    keys = set(keys)
    return {reverse: ident} if width == 2 and reverse in keys and ident in keys else {}


def _segment_key(s: Segment) -> ViewKey:
    return (None if s.view is None else tuple(s.view), tuple(s.order))


def _signed(
    trace: Trace,
    plus: Sequence[Batch],
    minus: Sequence[Batch],
    read_batch: ReadBatch,
    opened: Opened,
) -> Layer:
    total = Layer.empty(len(trace.columns))
    for batches, sign in ((plus, 1), (minus, -1)):
        for b in batches:  # every batch, an "empty" one too: a row count is the manifest's word
            layer = opened.read.get(b.path)
            if layer is None:
                layer = read_batch(trace, b)
                opened.read[b.path] = layer
                opened.read_bytes += sum(f.size for f in b.files)
            total = merged(total, layer if sign > 0 else layer.with_diff(-layer.diff))
    return total


def _rebuild(
    trace: Trace,
    before: int,
    wanted: Sequence[Batch],
    keys: set[ViewKey],
    read_batch: ReadBatch,
    reason: str,
    streamed: Streamed | None = None,
) -> Opened:
    opened = Opened(trace, before, {}, Layer.empty(len(trace.columns)), None, rebuilt=reason)
    if streamed is None or not wanted:
        whole = _signed(trace, wanted, (), read_batch, opened)
        opened.segments = {k: [arrange(whole, k)] if len(whole) else [] for k in keys}
        return opened
    whole = _summed_batches(trace, wanted, streamed, f"rebuilding the arrangements of {trace.name}")
    opened.read_bytes += sum(f.size for b in wanted for f in b.files)
    opened.segments = {k: [_arranged(streamed.spill, whole, k)] if len(whole) else [] for k in keys}
    return opened


def _summed_batches(trace: Trace, batches: Iterable[Batch], streamed: Streamed, what: str) -> Layer:
    """`batches` of `trace` summed into one sorted, consolidated layer a piece at a time (mapped
    from the scratch folder when it spilled): no batch is held whole."""
    sorter = streamed.spill.sorter(len(trace.columns), what)
    for b in batches:
        for rows, diff in streamed.read_chunks(trace, b):
            sorter.add(rows, diff)
    return sorter.layer()


def _arranged(spill: Spill, layer: Layer, key: ViewKey) -> Layer:
    """`arrange` of a layer of any size, within `spill`'s budget."""
    pattern, order = key
    return spill.arranged(layer, None if pattern is None else AtomView("", pattern), order)


def advance(
    root: str,
    opened: Opened,
    change: Layer,
    time: int,
    keys: Iterable[ViewKey],
    written: list[str],
    read_batch: ReadBatch,
    *,
    verify_merges: bool = True,
    streamed: Streamed | None = None,
    mirror: bool = False,
) -> Index:
    """The trace's index after epoch `time` changed it by `change` (see the module); new segment
    folders go to `written` as soon as they may exist. With `mirror` the reversed view's segments
    are the identity's. A damaged segment is not merged but its view's base rebuilt from the
    batches; `streamed` arranges and merges through mapped runs (`wcoj_core.spill`)."""
    spill = streamed.spill if streamed is not None else None
    folder = f"arrangements/{trace_dir(opened.name)}"

    def arranged(layer: Layer, key: ViewKey) -> Layer:
        return arrange(layer, key) if spill is None else _arranged(spill, layer, key)

    def summed(width: int, *layers: Layer) -> Layer:
        return _sum(width, *layers) if spill is None else spill.merged(layers, width)

    delta = summed(len(opened.trace.columns), opened.correction, change)
    out: list[Segment] = []
    keys = sorted(keys, key=repr)
    same = _mirrored_keys(keys, len(opened.trace.columns)) if mirror else {}
    made: dict[ViewKey, list[Segment]] = {}
    for key in keys:
        if key in same and same[key] in made:
            out += [replace(s, order=key[1]) for s in made[same[key]]]
            continue
        start = len(out)
        _advance_view(
            opened,
            key,
            change,
            delta,
            out,
            root,
            folder,
            written,
            read_batch,
            verify_merges,
            arranged,
            summed,
            streamed,
        )
        made[key] = out[start:]
    return Index(time, tuple(out))


def _advance_view(
    opened: Opened,
    key: ViewKey,
    change: Layer,
    delta: Layer,
    out: list[Segment],
    root: str,
    folder: str,
    written: list[str],
    read_batch: ReadBatch,
    verify_merges: bool,
    arranged: Callable[[Layer, ViewKey], Layer],
    summed: Callable[..., Layer],
    streamed: Streamed | None = None,
) -> None:
    """One view key's segments after the epoch (`advance`), added to `out`; with `streamed`, a
    damaged base is rebuilt from the batches a piece at a time."""
    if opened.rebuilt or opened.index is None:
        # No index to build on: the whole trace after the epoch becomes the base (an empty
        # base too: the index then says the view is empty, rather than missing).
        base = summed(len(key[1]), *opened.at(key), arranged(change, key))
        out.append(_write(root, folder, base, Level.BASE, key, written))
        return
    segs = [s for s in opened.index.segments if _segment_key(s) == key]
    base = [s for s in segs if s.level is Level.BASE]
    recent = [s for s in segs if s.level is not Level.BASE]
    fresh = arranged(delta, key) if len(delta) else None
    try:
        if fresh is not None and len(fresh):
            if len(recent) + 1 > MAX_RECENT:
                layers = [segments.open_segment(root, s, verify=verify_merges) for s in recent]
                fresh = summed(len(key[1]), *layers, fresh)
                recent = []
            base_rows = sum(s.rows for s in base)
            if len(fresh) > max(MERGE_MIN_ROWS, MERGE_SHARE * base_rows):
                layers = [
                    segments.open_segment(root, s, verify=verify_merges) for s in base + recent
                ]
                merged_base = summed(len(key[1]), *layers, fresh)
                base = [_write(root, folder, merged_base, Level.BASE, key, written)]
                recent, fresh = [], None
    except segments.DamagedFile as e:
        wanted = [b for b in opened.trace.batches if b.time < opened.before]
        if streamed is not None and wanted:
            what = f"rebuilding the arrangements of {opened.name}"
            whole = _summed_batches(opened.trace, wanted, streamed, what)
        else:
            whole = _signed(opened.trace, wanted, (), read_batch, opened)
        rebuilt = summed(len(key[1]), arranged(whole, key), arranged(change, key))
        base = [_write(root, folder, rebuilt, Level.BASE, key, written)]
        recent, fresh = [], None
        opened.rebuilt, opened.damaged = str(e), True
    out += base + recent
    if fresh is not None and len(fresh):
        out.append(_write(root, folder, fresh, Level.RECENT, key, written))


def _sum(width: int, *layers: Layer) -> Layer:
    """Layers of one width summed into one (consolidated, sorted)."""
    live = [layer for layer in layers if len(layer)]
    if not live:
        return Layer.empty(width)
    if len(live) == 1:
        return live[0]
    return Layer.build(
        np.concatenate([np.asarray(layer.rows) for layer in live]),
        np.concatenate([np.asarray(layer.diff, dtype=I64) for layer in live]),
    )


def _write(
    root: str, folder: str, layer: Layer, level: Level, key: ViewKey, written: list[str]
) -> Segment:
    rel = f"{folder}/{segment_name()}"
    written.append(rel)
    pattern, order = key
    segment = segments.write_segment(root, rel, layer, level=level, view=pattern, order=order)
    if segment.files:
        sync_soon(root, rel)  # its fsync runs while the epoch goes on; the commit waits
    return segment


def rebuilt_index(
    root: str, trace: Trace, read_chunks: ReadChunks, written: list[str], spill: Spill
) -> Index | None:
    """A trace's index written again from its batches, a base segment per view key it held
    (`repair`'s work), within `spill`'s shares: batches read a piece at a time into a `Sorter`,
    each view arranged by `Spill.arranged`; nothing held whole."""
    index = trace.index
    if index is None:
        return None
    keys = {_segment_key(s) for s in index.segments}
    streamed = Streamed(read_chunks, spill)
    what = f"rebuilding the arrangements of {trace.name}"
    whole = _summed_batches(trace, trace.visible(index.time), streamed, what)
    folder = f"arrangements/{trace_dir(trace.name)}"
    out = []
    for key in sorted(keys, key=repr):
        layer = _arranged(spill, whole, key) if len(whole) else Layer.empty(len(key[1]))
        out.append(_write(root, folder, layer, Level.BASE, key, written))
    return Index(index.time, tuple(out))
