"""Fuzzing every reader of a state (issue 27): random damage to manifests and batch folders, and
random query texts of up to hundreds of atoms.

A real state (epochs 0-3 of a small graph: undirected triangles, whose output is kept once per
tuple, or 2-paths over a bag, whose output is indexed) is copied and damaged by one to three
draws of:

* a batch folder given an extra file (a copy of a listed file under another name, a valid batch
  of other rows, random bytes), a listed file deleted, or altered (bytes flipped, truncated,
  grown, replaced by another valid batch file of the same trace);
* the current manifest damaged as bytes (a flipped byte, truncated), or edited as JSON with its
  digest recomputed (a batch's rows, epoch, a file's size, digest or name, a file listed twice
  under another name, a file left out with the rows kept, an output's figures);

then every reader runs: `read_table` and `change_table` of the output and the relation at every
epoch, `audit_epoch` at every epoch, `verify_state`, and the next epoch through ``wcoj apply``
(in this process, so any exception that is not a `WcojError` fails the test). Each gives the
exact answer (the naive oracle's) or refuses with a one-line `WcojError`; never another
exception; every reader's call within `CALL_SECONDS` (generous: the machine is shared). Damage
that changes what a reader reads is refused, never read as an answer; `verify_state` names every
damage the current generation sees; an edited figure fails that epoch's audit.

Query texts: random conjunctive queries of 1-300 atoms (chains, stars, random shapes; relation
arities sometimes inconsistent; constants, filters), some mutated character by character, go
through ``wcoj explain``: a plan or a one-line error, within `QUERY_SECONDS`; the small ones
also through ``wcoj count`` over tiny inputs, whose count must equal the naive oracle's.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from oracle import fold_epoch, naive_eval
from reliability_support import History, small_history, wcoj_here

from wcoj_core.audit_sample import audit_epoch
from wcoj_core.check.verify import verify_state
from wcoj_core.engine import Engine
from wcoj_core.errors import WcojError
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.state_read import change_table, read_table
from wcoj_core.store.manifest import digest_of
from wcoj_core.store.store import Store

CALL_SECONDS = 30.0  # the longest any one reader's call may take
QUERY_SECONDS = 30.0  # the longest `wcoj explain` of one query text may take
EPOCHS = 4

Multiset = Counter[tuple[int, ...]]


@dataclass(frozen=True)
class Base:
    """A state built once, its history and its naive answers."""

    name: str
    state: Path
    history: History
    query: str
    flags: tuple[str, ...]

    def specs(self) -> Any:
        if self.history.undirected:
            return relation_specs({"edge": 2}, undirected=["edge"])
        return relation_specs({"edge": 2}, bags=["edge"])

    def graph(self, t: int) -> Multiset:
        if self.history.undirected:
            return self.history.graph(t)
        held: Multiset = Counter()
        for rows in self.history.epochs[: t + 1]:
            held = fold_epoch(held, [((a, b), d) for a, b, d in rows], as_set=False)
        return held

    def answer(self, t: int) -> Multiset:
        return naive_eval(builtin(self.query), {"edge": self.graph(t)})

    def change(self, t: int) -> Multiset:
        out = self.answer(t)
        out.subtract(self.answer(t - 1) if t else Counter())
        return Counter({k: v for k, v in out.items() if v})


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Base]:
    root = tmp_path_factory.mktemp("fuzz-bases")
    out = {}
    for name, undirected, query in (("set", True, "triangles"), ("bag", False, "2-paths")):
        history = small_history(seed=11, epochs=EPOCHS + 1, undirected=undirected)
        history.write(root / f"in-{name}")
        state = root / name
        flags = ("--undirected", "edge") if undirected else ("--bag", "edge")
        for t in range(EPOCHS):
            done = wcoj_here(
                "apply", "--query", query, "--state", state, "--epoch", t,
                "--changes", f"edge={history.files[t]}", *flags,
            )  # fmt: skip
            assert done.code == 0, done.err
        out[name] = Base(name, state, history, query, flags)
    return out


# -- damage ----------------------------------------------------------------------------------------


def manifest_path(state: Path) -> Path:
    return max((state / "manifests").glob("*.json"))


def listed_files(state: Path) -> list[tuple[str, str, str, int]]:
    """(trace, batch folder, file name, epoch) of every file the current manifest lists."""
    m = Store.open(state, create=False).current()
    return [
        (name, b.path, f.name, b.time)
        for name, t in sorted(m.traces.items())
        for b in t.batches
        for f in b.files
    ]


@dataclass
class Damage:
    """What a draw did: `kinds` for the assertions, `seen` whether a reader of the current
    generation must notice (verify names it), `figure` the epoch of an edited output figure."""

    kinds: list[str]
    listed: list[tuple[str, str, str, int]]
    seen: bool = False
    figure: int | None = None


def damage_folder(state: Path, rng: random.Random, done: Damage) -> None:
    files = [f for f in done.listed if (state / f[1] / f[2]).exists()]
    if not files:
        return
    trace, folder, name, _ = rng.choice(files)
    path = state / folder / name
    how = rng.choice(["extra-copy", "extra-valid", "extra-bytes", "missing", "flip", "truncate",
                      "grow", "swap"])  # fmt: skip
    done.kinds.append(f"{how}:{trace}")
    done.seen = True
    if how == "extra-copy":
        shutil.copyfile(path, path.with_name(rng.choice(["part-0-001.snappy.parquet",
                                                          "x (copy).snappy.parquet", "data.parquet"])))  # fmt: skip
    elif how == "extra-valid":
        other = [f for f in files if f[0] == trace and f[1] != folder]
        source = state / rng.choice(other)[1] / rng.choice(other)[2] if other else path
        shutil.copyfile(source, path.with_name("part-9-000.snappy.parquet"))
    elif how == "extra-bytes":
        path.with_name("part-1-000.snappy.parquet").write_bytes(rng.randbytes(rng.randint(0, 300)))
    elif how == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        path.chmod(0o644)
        if how == "flip":
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        elif how == "truncate":
            data = data[: rng.randrange(len(data))]
        elif how == "grow":
            data += rng.randbytes(rng.randint(1, 64))
        else:  # another valid batch file of the same trace, under this one's name
            others = [f for f in files if f[0] == trace and (f[1], f[2]) != (folder, name)]
            if not others:
                done.kinds.pop()
                done.seen = False
                return
            _, f2, n2, _ = rng.choice(others)
            other = (state / f2 / n2).read_bytes()
            if other == bytes(data):
                done.kinds.pop()
                return
            data = bytearray(other)
        path.write_bytes(bytes(data))


def damage_manifest(state: Path, rng: random.Random, done: Damage) -> None:
    path = manifest_path(state)
    path.chmod(0o644)
    if rng.random() < 0.3:  # as bytes: its digest no longer matches
        data = bytearray(path.read_bytes())
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(len(data))]
        path.write_bytes(bytes(data))
        done.kinds.append("manifest-bytes")
        done.seen = True
        return
    try:
        raw = json.loads(path.read_text())
    except ValueError:  # damaged as bytes already
        return
    name = rng.choice(sorted(raw["traces"]))
    batches = raw["traces"][name]["batches"]
    if not batches:
        return
    b = rng.choice(batches)
    field = rng.choice(["rows", "time", "size", "sha", "name", "twice", "left-out", "figures"])
    if field == "figures" and not name.startswith("out/"):
        field = "rows"
    if field == "rows":
        b["rows"] = rng.choice(
            [r for r in (0, b["rows"] + 1, b["rows"] - 1, 10**6) if r >= 0 and r != b["rows"]]
        )
    elif field == "time":
        b["time"] = b["time"] + rng.choice([-1, 1, 7])  # a negative epoch is refused on open
    elif field == "size":
        b["files"][0][1] += rng.choice([-1, 1])
    elif field == "sha":
        b["files"][0][2] = "0" * 64
    elif field == "name":
        b["files"][0][0] = "part-7-000.snappy.parquet"
    elif field == "twice":
        b["files"].append(["part-8-000.snappy.parquet", *b["files"][0][1:]])
    elif field == "left-out":
        b["files"] = b["files"][1:]
        if not b["files"]:  # a batch of one file: its rows kept, its file gone from the list
            b["rows"] = b["rows"] or 1
    elif field == "figures":
        figures = list(b["figures"])
        figures[rng.randrange(3)] += rng.choice([-1, 1, 2])
        b["figures"] = figures
        done.figure = b["time"] if done.figure is None else min(done.figure, b["time"])
    raw["digest"] = digest_of(raw)
    path.write_text(json.dumps(raw, sort_keys=True, separators=(",", ":")) + "\n")
    done.kinds.append(f"manifest-{field}:{name}")
    done.seen = done.seen or field != "figures"


# -- the readers -----------------------------------------------------------------------------------


def timed(call: Any) -> tuple[Any, BaseException | None]:
    """`call()`'s result or its `WcojError` (any other exception fails the test), within
    `CALL_SECONDS`."""
    started = time.monotonic()
    try:
        result, error = call(), None
    except WcojError as e:
        result, error = None, e
        assert str(e).strip() and "\n" not in str(e).strip(), repr(e)
    assert time.monotonic() - started < CALL_SECONDS, call
    return result, error


def nonzero(c: Multiset) -> Multiset:
    return Counter({k: v for k, v in c.items() if v})


def as_counter(table: Any) -> Multiset:
    cols = [c for c in table.column_names if c != "diff"]
    rows = zip(*(table.column(c).to_pylist() for c in cols), strict=True)
    return Counter(dict(zip(rows, table.column("diff").to_pylist(), strict=True)))


@given(data=st.data())
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_damaged_states_through_every_reader(
    bases: dict[str, Base], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    base = bases[data.draw(st.sampled_from(sorted(bases)), label="base")]
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    state = tmp_path_factory.mktemp("fuzz") / "state"
    shutil.copytree(base.state, state, symlinks=True)
    done = Damage([], listed_files(state))
    for _ in range(data.draw(st.integers(0, 3), label="damages")):
        (damage_folder if rng.random() < 0.6 else damage_manifest)(state, rng, done)
    note(f"{base.name}: {done.kinds}")
    out = f"out/{builtin(base.query).name}"
    engine, _ = timed(lambda: Engine(None, str(state), builtin(base.query),
                                         relations=base.specs(), create=False))  # fmt: skip
    if engine is not None:
        for t in range(EPOCHS):
            for read, expected in (
                (lambda t=t: read_table(engine, out, t), base.answer(t)),
                (lambda t=t: change_table(engine, out, t), base.change(t)),
                (lambda t=t: read_table(engine, "rel/edge", t), base.graph(t)),
            ):
                table, _ = timed(read)
                if table is not None:
                    assert as_counter(table) == nonzero(expected), (done.kinds, t)
            audit, _ = timed(lambda t=t: audit_epoch(engine, builtin(base.query).name, t))
            if audit is not None and done.figure == t:
                assert not audit.passed and audit.figures != "ok", (done.kinds, audit)
            near = done.figure is not None and t in (done.figure, done.figure + 1)
            if audit is not None and not done.seen and not near:
                assert audit.passed, (done.kinds, audit)
    report, _ = timed(lambda: verify_state(Store.open(state, create=False)))
    if report is not None and done.seen:
        assert not report.ok, (done.kinds, report)
    if report is not None and not done.seen and done.figure is None:
        assert report.ok, (done.kinds, [d.describe() for d in report.damaged])
    # The next epoch: exact, or one line.
    argv = [
        "apply", "--query", base.query, "--state", str(state), "--epoch", str(EPOCHS),
        "--changes", f"edge={base.history.files[EPOCHS]}", *base.flags, "--json",
    ]  # fmt: skip
    started = time.monotonic()
    applied = wcoj_here(*argv)
    assert time.monotonic() - started < CALL_SECONDS
    if applied.code == 0:
        if done.figure is None:
            payload = json.loads(applied.out.strip().splitlines()[-1])
            assert payload["count"] == sum(base.answer(EPOCHS).values()), done.kinds
        after = Engine(None, str(state), builtin(base.query), relations=base.specs())
        table, _ = timed(lambda: read_table(after, out, EPOCHS))
        if table is not None:
            assert as_counter(table) == base.answer(EPOCHS), done.kinds
    else:
        assert applied.code == 2, (applied.code, applied.err)
        lines = [line for line in applied.err.splitlines() if line.startswith("wcoj: error:")]
        assert len(lines) == 1 and "Traceback" not in applied.err, applied.err


# -- query texts -----------------------------------------------------------------------------------

RELATIONS = ("e", "f", "g")


@st.composite
def query_texts(draw: st.DrawFn) -> tuple[str, bool]:
    """A query text and whether its relations keep one arity each (so `count` can read it)."""
    n = draw(st.one_of(st.integers(1, 6), st.integers(7, 40), st.integers(200, 300)))
    shape = draw(st.sampled_from(["chain", "star", "random"]))
    arity = {r: draw(st.integers(1, 3)) for r in RELATIONS}
    consistent = draw(st.booleans()) or n <= 6
    names = [f"v{i}" for i in range(max(2, n // 2 + 1))]
    atoms = []
    for i in range(n):
        rel = draw(st.sampled_from(RELATIONS))
        k = arity[rel] if consistent else draw(st.integers(1, 3))
        if shape == "chain":
            terms = [f"v{i + j}" for j in range(k)]
        elif shape == "star":
            terms = ["hub", *[f"v{i}_{j}" for j in range(k - 1)]]
        else:
            terms = [
                str(draw(st.integers(-3, 3)))
                if draw(st.integers(0, 9)) == 0
                else draw(st.sampled_from(names))
                for _ in range(k)
            ]
        atoms.append(f"{rel}({', '.join(terms)})")
    bound = sorted({t for a in atoms for t in a[2:-1].split(", ") if not t.lstrip("-").isdigit()})
    head = draw(st.lists(st.sampled_from(bound), max_size=3)) if bound else []
    filters = []
    for _ in range(draw(st.integers(0, 3))):
        if len(bound) >= 2:
            a, b = draw(st.sampled_from(bound)), draw(st.sampled_from(bound))
            if a != b:
                filters.append(f"{a} {draw(st.sampled_from(['<', '<=', '!=', '>']))} {b}")
    text = f"q({', '.join(head)}) :- {', '.join(atoms + filters)}"
    if draw(st.integers(0, 4)) == 0:  # mutated: a character deleted, inserted or replaced
        at = draw(st.integers(0, len(text) - 1))
        text = (
            text[:at] + draw(st.sampled_from(["", "(", ")", ",", " x", "1", ":-"])) + text[at + 1 :]
        )
        consistent = False
    return text, consistent


def tiny_inputs(folder: Path, arities: dict[str, int], rng: random.Random) -> dict[str, Multiset]:
    held = {}
    for rel, k in arities.items():
        rows = [tuple(rng.randrange(4) for _ in range(k)) for _ in range(rng.randint(1, 8))]
        write_changes_k(folder / f"{rel}.csv", k, rows)
        held[rel] = Counter(rows)
    return held


def write_changes_k(path: Path, k: int, rows: list[tuple[int, ...]]) -> None:
    header = ",".join(f"c{j}" for j in range(k))
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))


@given(drawn=query_texts(), seed=st.integers(0, 2**16))
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_query_texts_of_up_to_hundreds_of_atoms(
    drawn: tuple[str, bool], seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    text, consistent = drawn
    note(text[:300])
    started = time.monotonic()
    done = wcoj_here("explain", "--query", text)
    assert time.monotonic() - started < QUERY_SECONDS, len(text)
    assert done.code in (0, 2), done
    if done.code == 2:
        lines = [line for line in done.err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("wcoj: error: "), done.err
        assert len(lines[0]) < 3000
        return
    assert done.out.startswith("query q(")
    query = parse_query(text)
    if len(query.atoms) > 6 or not consistent:
        return
    folder = tmp_path_factory.mktemp("inputs")
    held = tiny_inputs(folder, dict(query.relations), random.Random(seed))
    inputs = [x for rel in query.relations for x in ("--input", f"{rel}={folder / rel}.csv")]
    counted = wcoj_here("count", "--query", text, *inputs, "--json")
    assert counted.code == 0, counted.err
    payload = json.loads(counted.out.strip().splitlines()[-1])
    assert payload["count"] == sum(naive_eval(query, held).values()), text
