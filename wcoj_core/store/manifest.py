"""The manifest of state format 5: one commit point per generation, as frozen values and JSON.

A `Manifest` names everything a generation of the state holds: the plan it serves, and per trace
its batches (Parquet folders, the source of truth) and its index (memory-mapped segments). Its
JSON (docs/state.md) is canonical — keys sorted, no spaces — and carries ``digest``, the sha256
of the canonical JSON of everything else. `Manifest.from_json` checks the digest and the whole
shape (every field's type, ints for times and counts, no negative counts, paths that wcoj makes)
and raises one `DamagedState` whose one-line message names the file, what is wrong and the
previous generation, which is the way back. A manifest of another format is refused with
`IncompatibleState` (formats 2 to 4 lived a few days before any user: re-create such a state).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NoReturn

from wcoj_core.errors import DamagedState, IncompatibleState, QueryError
from wcoj_core.kernel.keys import Packing
from wcoj_core.query.ir import Const
from wcoj_core.store import names

FORMAT = 5

Stamp = tuple[int, int, int]  # (st_ino, st_mtime_ns, st_ctime_ns) right after writing
Pattern = tuple[int | Const, ...]  # an `AtomView` pattern (the relation is the trace's)
Figures = tuple[int, int, int]  # (distinct tuples, summed multiplicity, negative tuples)


class Level(Enum):
    """A segment's place in a trace's index: the big base or the small recent layer."""

    BASE = "base"
    RECENT = "recent"


class Meaning(Enum):
    """What a relation's tuples mean: present or not (set), or counted (bag) — recorded in the
    manifest, honoured by `wcoj_core.meaning`."""

    SET = "set"
    BAG = "bag"


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file as written: its name in its folder, size, sha256 and (segments) its stamp."""

    name: str
    size: int
    sha256: str
    stamp: Stamp | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """One immutable batch of a trace: its folder (relative to the state), time, rows, data
    `files`, the trace's `figures` as of it (distinct tuples, summed multiplicity, negative
    tuples) and its provenance digests (`landed`, `inputs`, `chain`)."""

    path: str
    time: int
    rows: int
    files: tuple[FileRef, ...] = ()
    figures: Figures | None = None
    landed: str = ""
    inputs: str = ""
    chain: str = ""


@dataclass(frozen=True, slots=True)
class Segment:
    """One persisted layer of a trace's index (`wcoj_core.store.segments`): seen through `view`
    (None: as stored), in column `order`, at `path`, its one file by role (none when `rows` is
    0)."""

    level: Level
    view: Pattern | None
    order: tuple[int, ...]
    rows: int
    packing: Packing | None
    unit: bool
    path: str
    files: Mapping[str, FileRef] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return len(self.order)

    def file_path(self, role: str) -> str:
        """A file of the segment, relative to the state."""
        del role  # one file
        return self.path


@dataclass(frozen=True, slots=True)
class Index:
    """A trace's index: segments covering exactly its batches with ``time <= index.time``."""

    time: int
    segments: tuple[Segment, ...] = ()

    def find(self, level: Level, view: Pattern | None, order: tuple[int, ...]) -> Segment | None:
        for s in self.segments:
            if s.level == level and s.view == view and s.order == order:
                return s
        return None


@dataclass(frozen=True, slots=True)
class Trace:
    """A named collection of update triples over long `columns`: batches and an index."""

    name: str
    columns: tuple[str, ...]
    batches: tuple[Batch, ...] = ()
    index: Index | None = None

    def visible(self, time: int | None, strict: bool = False) -> tuple[Batch, ...]:
        """The batches whose updates are visible at `time` (all of them for ``None``)."""
        if time is None:
            return self.batches
        return tuple(b for b in self.batches if (b.time < time if strict else b.time <= time))

    def rows(self, time: int | None = None, strict: bool = False) -> int:
        """Stored rows visible at `time`; 0 means the collection is certainly empty."""
        return sum(b.rows for b in self.visible(time, strict))

    def figures_at(self, time: int | None = None) -> Figures:
        """The trace's figures as of `time` (default: its last epoch): those of its last batch
        at or before `time` that carries figures, (0, 0, 0) when none does."""
        found: Figures = (0, 0, 0)
        for b in self.batches:
            if (time is None or b.time <= time) and b.figures is not None:
                found = b.figures
        return found

    def bytes(self) -> int:
        """The size of every file the trace's batches and index segments hold, each file once
        and only the trace's own: an undirected relation's reversed view lists its identity's
        segments, a second counts trace its first's (`docs/state.md`), held once on disk."""
        size = sum(f.size for b in self.batches for f in b.files)
        own = f"{names.ARRANGEMENTS}/{names.trace_dir(self.name)}/"
        if self.index is not None:
            held = {s.path: s for s in self.index.segments if s.path.startswith(own)}
            size += sum(f.size for s in held.values() for f in s.files.values())
        return size

    def with_batch(self, batch: Batch) -> Trace:
        return replace(self, batches=(*self.batches, batch))

    def replacing(self, batch: Batch) -> Trace:
        """The trace with `batch` in place of whatever it held at the batch's time."""
        kept = tuple(b for b in self.batches if b.time != batch.time)
        return replace(self, batches=tuple(sorted((*kept, batch), key=lambda b: b.time)))

    def with_index(self, index: Index | None) -> Trace:
        return replace(self, index=index)

    def paths(self) -> set[str]:
        """Every folder the trace references (batches and segments), relative to the state."""
        out = {b.path for b in self.batches}
        if self.index is not None:
            out.update(s.path for s in self.index.segments)
        return out


@dataclass(frozen=True, slots=True)
class RelationPlan:
    arity: int
    meaning: Meaning
    undirected: bool = False


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """A query the state serves: its normalized text, the relations it reads and, for a query
    attached to the state after its first epoch (`wcoj_core.attach`), the epoch it was attached
    at: its output trace holds its whole output as of that epoch, then its changes."""

    text: str
    relations: tuple[str, ...]
    since: int | None = None


@dataclass(frozen=True, slots=True)
class StatePlan:
    """What a state serves: its relations and its queries, by name."""

    relations: Mapping[str, RelationPlan] = field(default_factory=dict)
    queries: Mapping[str, QueryPlan] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Manifest:
    """One committed generation of the state (generation 0: a new, empty state)."""

    generation: int = 0
    epoch: int | None = None
    frontier: int | None = None  # history at or before it is compacted
    plan: StatePlan | None = None
    traces: Mapping[str, Trace] = field(default_factory=dict)

    def trace(self, name: str) -> Trace | None:
        return self.traces.get(name)

    def with_trace(self, trace: Trace) -> Manifest:
        return replace(self, traces={**self.traces, trace.name: trace})

    def paths(self) -> set[str]:
        """Every folder this generation references, relative to the state."""
        return {p for t in self.traces.values() for p in t.paths()}

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces, one line) with its ``digest``, made of each
        batch's canonical text, made once per batch object (`_batch_text`)."""
        rest = _canonical_manifest(self)
        digest = hashlib.sha256(rest.encode()).hexdigest()
        # "digest" sorts before every field of the body ("epoch", "format", ...): the whole
        # canonical JSON is the rest's with it put in front.
        return '{"digest":"' + digest + '",' + rest[1:] + "\n"

    @staticmethod
    def from_json(text: str, source: str, previous: str | None = None) -> Manifest:
        """Parse and check a manifest read from `source`; `previous` names the previous
        generation's file (for the message), None when there is none."""
        try:
            return _decode_manifest(text, source)
        except _Bad as bad:
            way_back = (
                f"the previous generation {previous} is the way back"
                if previous
                else "no earlier generation is kept"
            )
            where = f" at {bad.where}" if bad.where else ""
            raise DamagedState(
                f"{source}: damaged manifest: {bad.what}{where}; {way_back}"
            ) from None


def referenced(text: str, source: str) -> tuple[set[str], set[str]]:
    """The traces a manifest names and every folder it references, read without the full
    shape check (what pruning needs of older generations): its digest must hold and every
    folder must be a name wcoj makes, else `DamagedState`."""
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or body.get("digest") != digest_of(body):
            raise ValueError("its digest does not match")
        traces: set[str] = set()
        paths: set[str] = set()
        for name, t in body["traces"].items():
            traces.add(str(name))
            for b in t["batches"]:
                paths.add(str(b["path"]))
            index = t.get("index")
            for seg in index["segments"] if index else ():
                paths.add(str(seg["path"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedState(f"{source}: damaged manifest: {e}") from None
    bad = [p for p in paths if not (names.is_batch_path(p) or names.is_segment_path(p))]
    if bad:
        raise DamagedState(f"{source}: damaged manifest: {bad[0]!r} is not a folder wcoj makes")
    return traces, paths


def canonical(value: Any) -> str:
    """The canonical JSON of a value: keys sorted, no spaces, ASCII.

    >>> canonical({"b": [1, None], "a": "é"})
    '{"a":"\\\\u00e9","b":[1,null]}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest_of(body: Mapping[str, Any]) -> str:
    """The sha256 of the canonical JSON of a manifest's fields other than ``digest``."""
    rest = {k: v for k, v in body.items() if k != "digest"}
    return hashlib.sha256(canonical(rest).encode()).hexdigest()


# -- encoding --------------------------------------------------------------------------------


def _ref(r: FileRef) -> list[Any]:
    return [r.name, r.size, r.sha256, *([list(r.stamp)] if r.stamp is not None else [])]


# Batches encoded, by identity: a generation's manifest holds the same `Batch` objects as the
# previous one but for the epoch's, so each is encoded once (by `id`, checked with `is`: a
# frozen dataclass's hash would hash every field again).
_ENCODED: dict[int, tuple[Batch, dict[str, Any]]] = {}


def _encode_batch(b: Batch) -> dict[str, Any]:
    """A batch as JSON values (made once per batch object; never changed by its callers)."""
    found = _ENCODED.get(id(b))
    if found is not None and found[0] is b:
        return found[1]
    if len(_ENCODED) >= 16384:
        _ENCODED.clear()
    out = _encode_batch_once(b)
    _ENCODED[id(b)] = (b, out)
    return out


# The canonical text of batches, by identity as `_ENCODED`.
_TEXTS: dict[int, tuple[Batch, str]] = {}


def _batch_text(b: Batch) -> str:
    """`canonical` of a batch's JSON values (made once per batch object)."""
    found = _TEXTS.get(id(b))
    if found is not None and found[0] is b:
        return found[1]
    if len(_TEXTS) >= 16384:
        _TEXTS.clear()
    text = canonical(_encode_batch(b))
    _TEXTS[id(b)] = (b, text)
    return text


def _canonical_object(fields: Mapping[str, str]) -> str:
    """The canonical JSON of an object whose values are given as canonical JSON text."""
    return "{" + ",".join(f"{canonical(k)}:{fields[k]}" for k in sorted(fields)) + "}"


def _canonical_trace(t: Trace) -> str:
    """`canonical` of `_encode_trace(t)`, its batches' text made once each."""
    encoded = _encode_trace(t, batches=False)
    fields = {k: canonical(v) for k, v in encoded.items()}
    fields["batches"] = "[" + ",".join(_batch_text(b) for b in t.batches) + "]"
    return _canonical_object(fields)


def _canonical_manifest(m: Manifest) -> str:
    """`canonical` of `_encode_manifest(m)` (no digest), each trace put together by
    `_canonical_trace`."""
    body = _encode_manifest(m, traces=False)
    fields = {k: canonical(v) for k, v in body.items()}
    traces = {name: _canonical_trace(t) for name, t in m.traces.items()}
    fields["traces"] = _canonical_object(traces)
    return _canonical_object(fields)


def _encode_batch_once(b: Batch) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": b.path,
        "time": b.time,
        "rows": b.rows,
        "files": [_ref(f) for f in b.files],
        "figures": list(b.figures) if b.figures is not None else None,
    }
    for key, value in (("landed", b.landed), ("inputs", b.inputs), ("chain", b.chain)):
        if value:
            out[key] = value
    return out


def encode_view(view: Pattern | None) -> list[Any] | None:
    """A view's pattern as JSON: ints, and ``{"const": v}`` for a constant.

    >>> encode_view((0, Const(3), 0))
    [0, {'const': 3}, 0]
    """
    if view is None:
        return None
    return [{"const": p.value} if isinstance(p, Const) else p for p in view]


def _encode_segment(s: Segment) -> dict[str, Any]:
    return {
        "level": s.level.value,
        "view": encode_view(s.view),
        "order": list(s.order),
        "rows": s.rows,
        "packing": (
            [list(s.packing.lows), list(s.packing.highs), list(s.packing.bits)]
            if s.packing is not None
            else None
        ),
        "unit": s.unit,
        "path": s.path,
        "files": {role: _ref(r) for role, r in s.files.items()},
    }


def _encode_trace(t: Trace, *, batches: bool = True) -> dict[str, Any]:
    """A trace as JSON values (without its batches when not `batches`)."""
    out: dict[str, Any] = {
        "columns": list(t.columns),
        "index": (
            None
            if t.index is None
            else {
                "time": t.index.time,
                "segments": [_encode_segment(s) for s in t.index.segments],
            }
        ),
    }
    if batches:
        out["batches"] = [_encode_batch(b) for b in t.batches]
    return out


def _encode_plan(p: StatePlan | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "relations": {
            name: {"arity": r.arity, "meaning": r.meaning.value, "undirected": r.undirected}
            for name, r in p.relations.items()
        },
        "queries": {
            name: {
                "text": q.text,
                "relations": list(q.relations),
                **({} if q.since is None else {"since": q.since}),
            }
            for name, q in p.queries.items()
        },
    }


def _encode_manifest(m: Manifest, *, traces: bool = True) -> dict[str, Any]:
    """A manifest as JSON values, without its digest (and without its traces when not
    `traces`)."""
    for name, t in m.traces.items():
        if name != t.name:
            raise ValueError(f"trace {t.name!r} is filed under {name!r}")
    out: dict[str, Any] = {
        "format": FORMAT,
        "generation": m.generation,
        "epoch": m.epoch,
        "frontier": m.frontier,
        "plan": _encode_plan(m.plan),
    }
    if traces:
        out["traces"] = {name: _encode_trace(t) for name, t in m.traces.items()}
    return out


# -- decoding: every field checked ---------------------------------------------------------------


class _Bad(Exception):
    """What is wrong with a manifest and where (a path into its JSON)."""

    def __init__(self, what: str, where: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.where = where


def _bad(what: str, where: str) -> NoReturn:
    raise _Bad(what, where)


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str | int | float | bool | None) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _obj(v: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(v, dict):
        _bad(f"expected an object, found {_show(v)}", where)
    missing = [k for k in required if k not in v]
    if missing:
        _bad(f"missing {', '.join(repr(k) for k in missing)}", where)
    extra = sorted(set(v) - set(required) - set(optional))
    if extra:
        _bad(f"unexpected {', '.join(repr(k) for k in extra)}", where)
    return v


def _int(v: Any, where: str, minimum: int | None = None) -> int:
    if type(v) is not int:
        _bad(f"expected an integer, found {_show(v)}", where)
    if minimum is not None and v < minimum:
        _bad(f"{v} is less than {minimum}", where)
    if not -(2**63) <= v < 2**63:
        _bad(f"{v} does not fit in 64 bits", where)
    return v


def _opt_int(v: Any, where: str) -> int | None:
    return None if v is None else _int(v, where)


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        _bad(f"expected a string, found {_show(v)}", where)
    return v


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        _bad(f"expected true or false, found {_show(v)}", where)
    return v


def _list(v: Any, where: str, length: int | None = None) -> list:
    if not isinstance(v, list):
        _bad(f"expected a list, found {_show(v)}", where)
    if length is not None and len(v) != length:
        _bad(f"expected {length} items, found {len(v)}", where)
    return v


def _sha(v: Any, where: str) -> str:
    s = _str(v, where)
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        _bad(f"expected a sha256 (64 lowercase hex digits), found {_show(s)}", where)
    return s


def _file_ref(v: Any, where: str, stamped: bool | None) -> FileRef:
    raw = _list(v, where)
    if len(raw) not in (3, 4):
        _bad(f"expected [name, size, sha256(, stamp)], found {len(raw)} items", where)
    name = _str(raw[0], f"{where}[0]")
    if not names.is_plain_file_name(name):
        _bad(f"{name!r} is not a file name", f"{where}[0]")
    size = _int(raw[1], f"{where}[1]", 0)
    sha = _sha(raw[2], f"{where}[2]")
    stamp: Stamp | None = None
    if len(raw) == 4:
        s = _list(raw[3], f"{where}[3]", 3)
        ino, mtime, ctime = (_int(x, f"{where}[3][{i}]") for i, x in enumerate(s))
        stamp = (ino, mtime, ctime)
    if stamped is True and stamp is None:
        _bad("a segment file needs its stamp [inode, mtime_ns, ctime_ns]", where)
    return FileRef(name, size, sha, stamp)


def _figures(v: Any, where: str) -> Figures | None:
    if v is None:
        return None
    raw = _list(v, where, 3)
    return (
        _int(raw[0], f"{where}[0]", 0),
        _int(raw[1], f"{where}[1]"),
        _int(raw[2], f"{where}[2]", 0),
    )


def _batch(v: Any, where: str) -> Batch:
    raw = _obj(
        v, where, ("path", "time", "rows", "files", "figures"), ("landed", "inputs", "chain")
    )
    path = _str(raw["path"], f"{where}.path")
    if not names.is_batch_path(path):
        _bad(f"{path!r} is not a batch folder wcoj makes", f"{where}.path")
    files = tuple(
        _file_ref(f, f"{where}.files[{i}]", None)
        for i, f in enumerate(_list(raw["files"], f"{where}.files"))
    )
    return Batch(
        path,
        _int(raw["time"], f"{where}.time", 0),
        _int(raw["rows"], f"{where}.rows", 0),
        files,
        _figures(raw["figures"], f"{where}.figures"),
        _str(raw.get("landed", ""), f"{where}.landed"),
        _str(raw.get("inputs", ""), f"{where}.inputs"),
        _str(raw.get("chain", ""), f"{where}.chain"),
    )


def decode_view(v: Any, where: str = "view") -> Pattern | None:
    """A view's pattern from JSON (see `encode_view`), checked: view columns are numbered in
    order of first occurrence, as `wcoj_core.query.plan.atom_view` numbers them.

    >>> decode_view([0, {"const": 3}, 0])
    (0, Const(value=3), 0)
    """
    if v is None:
        return None
    out: list[int | Const] = []
    seen = 0
    for i, p in enumerate(_list(v, where)):
        here = f"{where}[{i}]"
        if isinstance(p, dict):
            value = _int(_obj(p, here, ("const",))["const"], f"{here}.const")
            try:
                out.append(Const(value))
            except QueryError as e:  # cannot happen for an int64; kept for safety
                _bad(str(e), here)
            continue
        col = _int(p, here, 0)
        if col > seen:
            _bad(f"view column {col} before column {seen}", here)
        seen = max(seen, col + 1)
        out.append(col)
    return tuple(out)


def _packing(v: Any, where: str, width: int) -> Packing | None:
    if v is None:
        return None
    raw = _list(v, where, 3)
    lows, highs, bits = (
        tuple(_int(x, f"{where}[{k}][{j}]") for j, x in enumerate(_list(raw[k], f"{where}[{k}]")))
        for k in range(3)
    )
    if not len(lows) == len(highs) == len(bits) == width:
        _bad(f"expected {width} lows, highs and bits", where)
    for j, (lo, hi, b) in enumerate(zip(lows, highs, bits, strict=True)):
        if lo > hi or b != (hi - lo).bit_length():
            _bad(f"column {j} is not a packing (low {lo}, high {hi}, {b} bits)", where)
    if sum(bits) > 64:
        _bad(f"{sum(bits)} bits do not fit in 64", where)
    return Packing(lows, highs, bits)


def _segment(v: Any, where: str) -> Segment:
    raw = _obj(v, where, ("level", "view", "order", "rows", "packing", "unit", "path", "files"))
    level_raw = _str(raw["level"], f"{where}.level")
    try:
        level = Level(level_raw)
    except ValueError:
        _bad(f"expected 'base' or 'recent', found {level_raw!r}", f"{where}.level")
    view = decode_view(raw["view"], f"{where}.view")
    order = tuple(
        _int(x, f"{where}.order[{i}]", 0)
        for i, x in enumerate(_list(raw["order"], f"{where}.order"))
    )
    width = len(order)
    if sorted(order) != list(range(width)):
        _bad(f"{list(order)} is not an order of {width} columns", f"{where}.order")
    if view is not None:
        arity = len({p for p in view if isinstance(p, int)})
        if arity != width:
            _bad(f"the view has {arity} columns, the order {width}", f"{where}.view")
    rows = _int(raw["rows"], f"{where}.rows", 0)
    path = _str(raw["path"], f"{where}.path")
    if not names.is_segment_path(path):
        _bad(f"{path!r} is not a segment file wcoj makes", f"{where}.path")
    files_raw = raw["files"]
    if not isinstance(files_raw, dict):
        _bad(f"expected an object, found {_show(files_raw)}", f"{where}.files")
    files: dict[str, FileRef] = {}
    roles = (names.SEGMENT_LAYER,) if rows else ()
    if sorted(files_raw) != sorted(roles):
        _bad(
            f"expected files {list(roles)} for {rows} rows, found {sorted(files_raw)}",
            f"{where}.files",
        )
    for role in roles:
        ref = _file_ref(files_raw[role], f"{where}.files.{role}", True)
        if ref.name != path.rpartition("/")[2]:
            _bad(f"expected {path.rpartition('/')[2]!r}, found {ref.name!r}", f"{where}.files")
        files[role] = ref
    return Segment(
        level,
        view,
        order,
        rows,
        _packing(raw["packing"], f"{where}.packing", width),
        _bool(raw["unit"], f"{where}.unit"),
        path,
        files,
    )


def _trace(name: str, v: Any, where: str) -> Trace:
    raw = _obj(v, where, ("columns", "batches", "index"))
    columns = tuple(
        _str(c, f"{where}.columns[{i}]")
        for i, c in enumerate(_list(raw["columns"], f"{where}.columns"))
    )
    if len(set(columns)) != len(columns):
        _bad(f"repeated columns {list(columns)}", f"{where}.columns")
    batches = tuple(
        _batch(b, f"{where}.batches[{i}]")
        for i, b in enumerate(_list(raw["batches"], f"{where}.batches"))
    )
    for i in range(1, len(batches)):  # one batch per epoch, in order
        if batches[i].time <= batches[i - 1].time:
            _bad(
                f"epoch {batches[i].time} after epoch {batches[i - 1].time}: a trace holds one "
                "batch per epoch, in order",
                f"{where}.batches[{i}].time",
            )
    index: Index | None = None
    if raw["index"] is not None:
        ix = _obj(raw["index"], f"{where}.index", ("time", "segments"))
        index = Index(
            _int(ix["time"], f"{where}.index.time"),
            tuple(
                _segment(s, f"{where}.index.segments[{i}]")
                for i, s in enumerate(_list(ix["segments"], f"{where}.index.segments"))
            ),
        )
    return Trace(name, columns, batches, index)


def _plan(v: Any) -> StatePlan | None:
    if v is None:
        return None
    raw = _obj(v, "plan", ("relations", "queries"))
    relations: dict[str, RelationPlan] = {}
    rels = raw["relations"]
    if not isinstance(rels, dict):
        _bad(f"expected an object, found {_show(rels)}", "plan.relations")
    for name, r in rels.items():
        here = f"plan.relations[{name!r}]"
        r = _obj(r, here, ("arity", "meaning", "undirected"))
        meaning = _str(r["meaning"], f"{here}.meaning")
        if meaning not in ("set", "bag"):
            _bad(f"expected 'set' or 'bag', found {meaning!r}", f"{here}.meaning")
        relations[name] = RelationPlan(
            _int(r["arity"], f"{here}.arity", 0),
            Meaning(meaning),
            _bool(r["undirected"], f"{here}.undirected"),
        )
    queries: dict[str, QueryPlan] = {}
    qs = raw["queries"]
    if not isinstance(qs, dict):
        _bad(f"expected an object, found {_show(qs)}", "plan.queries")
    for name, q in qs.items():
        here = f"plan.queries[{name!r}]"
        q = _obj(q, here, ("text", "relations"), ("since",))
        used = tuple(
            _str(x, f"{here}.relations[{i}]")
            for i, x in enumerate(_list(q["relations"], f"{here}.relations"))
        )
        unknown = [x for x in used if x not in relations]
        if unknown:
            _bad(f"relation {unknown[0]!r} is not in plan.relations", f"{here}.relations")
        since = _opt_int(q.get("since"), f"{here}.since")
        queries[name] = QueryPlan(_str(q["text"], f"{here}.text"), used, since)
    return StatePlan(relations, queries)


def incompatible(source: str, found: int) -> IncompatibleState:
    """The refusal of a state written in format `found`, not this one's."""
    which, advice = ("an earlier", "re-create the state (apply its epochs into a new directory)")
    if found > FORMAT:
        which, advice = "a later", "use that wcoj"
    return IncompatibleState(
        f"{source}: this state was created by {which} wcoj (state format {found}) and is not "
        f"readable by this one (format {FORMAT}); {advice}"
    )


def _decode_manifest(text: str, source: str) -> Manifest:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        _bad(f"not JSON ({e.msg}, line {e.lineno} column {e.colno})", "")
    if not isinstance(raw, dict):
        _bad(f"expected an object, found {_show(raw)}", "")
    fmt = raw.get("format")
    if type(fmt) is int and fmt != FORMAT:
        raise incompatible(source, fmt)
    raw = _obj(raw, "", ("format", "generation", "epoch", "frontier", "plan", "traces", "digest"))
    _int(raw["format"], "format")
    if _sha(raw["digest"], "digest") != digest_of(raw):
        _bad("its digest does not match its content (edited, truncated or damaged)", "")
    traces_raw = raw["traces"]
    if not isinstance(traces_raw, dict):
        _bad(f"expected an object, found {_show(traces_raw)}", "traces")
    if "" in traces_raw:
        _bad("a trace without a name", "traces")
    traces = {name: _trace(name, t, f"traces[{name!r}]") for name, t in traces_raw.items()}
    epoch = _opt_int(raw["epoch"], "epoch")
    for name, t in traces.items():
        last = t.batches[-1].time if t.batches else None
        if last is not None and (epoch is None or last > epoch):
            _bad(
                f"a batch of epoch {last}, after the state's epoch {epoch}",
                f"traces[{name!r}].batches[{len(t.batches) - 1}].time",
            )
    return Manifest(
        _int(raw["generation"], "generation", 0),
        epoch,
        _opt_int(raw["frontier"], "frontier"),
        _plan(raw["plan"]),
        traces,
    )
