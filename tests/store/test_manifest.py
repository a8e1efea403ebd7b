"""Manifests of state format 5 (formats 2 to 4 read by the repair): canonical JSON with a digest, every field checked on reading,
one line naming the file and the way back for anything wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from wcoj_core.errors import DamagedState, IncompatibleState
from wcoj_core.kernel.keys import Packing
from wcoj_core.query.ir import Const
from wcoj_core.store import names
from wcoj_core.store.manifest import (
    Batch,
    FileRef,
    Index,
    Level,
    Manifest,
    Meaning,
    QueryPlan,
    RelationPlan,
    Segment,
    StatePlan,
    Trace,
    canonical,
    digest_of,
)

SHA = "ab" * 32
SRC = "/s/manifests/0000000007.json"
PREV = "/s/manifests/0000000006.json"


def example() -> Manifest:
    edge = "rel/edge"
    tdir = names.trace_dir(edge)
    files = {
        "layer": FileRef(
            "s-0123456789abcdef.seg", 2112, SHA, (1234, 1700000000000000000, 1700000000000000001)
        )
    }
    base = Segment(
        Level.BASE,
        None,
        (0, 1),
        64,
        Packing((0, 3), (99, 90), (7, 7)),
        True,
        f"arrangements/{tdir}/s-0123456789abcdef.seg",
        files,
    )
    recent = Segment(
        Level.RECENT,
        (0, Const(-5), 1),
        (1, 0),
        0,
        None,
        True,
        f"arrangements/{tdir}/s-fedcba9876543210.seg",
        {},
    )
    b0 = Batch(
        f"traces/{tdir}/b-k-0-0123456789ab",
        0,
        64,
        (FileRef("part-0-000.snappy.parquet", 2001, SHA),),
        (64, 64, 0),
        landed="l0",
    )
    b1 = Batch(f"traces/{tdir}/b-x-1-0123456789ab", 1, 0, (), None, chain="c1")
    out = Trace(
        "out/tri",
        ("a", "b", "c"),
        (
            Batch(
                f"traces/{names.trace_dir('out/tri')}/b-s-1-ba9876543210",
                1,
                3,
                (),
                (3, 3, 0),
                inputs="i1",
            ),
        ),
    )
    plan = StatePlan(
        {"edge": RelationPlan(2, Meaning.SET, True), "w": RelationPlan(0, Meaning.BAG)},
        {"tri": QueryPlan("tri(a, b, c) :- edge(a, b), edge(b, c), edge(a, c).", ("edge",))},
    )
    return Manifest(
        7,
        1,
        None,
        plan,
        {edge: Trace(edge, ("c0", "c1"), (b0, b1), Index(1, (base, recent))), "out/tri": out},
    )


def test_round_trip_and_canonical_form() -> None:
    m = example()
    text = m.to_json()
    assert Manifest.from_json(text, SRC) == m
    assert text.endswith("\n") and text.count("\n") == 1
    raw = json.loads(text)
    assert raw["digest"] == digest_of(raw)
    assert raw["format"] == 5
    # Insertion order does not matter: the JSON is canonical.
    shuffled = Manifest(7, 1, None, m.plan, dict(reversed(list(m.traces.items()))))
    assert shuffled.to_json() == text
    assert Manifest().to_json() == Manifest.from_json(Manifest().to_json(), SRC).to_json()


def test_the_text_is_the_canonical_json_of_the_whole_body() -> None:
    # `to_json` puts the text together from each batch's text, made once per batch object:
    # byte for byte what `canonical` makes of the whole body, the same batches met again in a
    # later generation (a warm process) and names that JSON escapes included.
    m = example()
    odd = Trace(
        'out/é"q',
        ("a",),
        (Batch(f"traces/{names.trace_dir('out/q')}/b-k-2-0123456789ab", 2, 1, (), (1, 1, 0)),),
    )
    for manifest in (m, m.with_trace(odd), replace(m.with_trace(odd), generation=8), Manifest()):
        body = json.loads(manifest.to_json())
        text = canonical(body) + "\n"
        assert manifest.to_json() == text
        assert body["digest"] == digest_of(body)


def test_the_documented_shape() -> None:
    raw = json.loads(example().to_json())
    assert sorted(raw) == ["digest", "epoch", "format", "frontier", "generation", "plan", "traces"]
    edge = raw["traces"]["rel/edge"]
    assert edge["batches"][0] == {
        "path": f"traces/{names.trace_dir('rel/edge')}/b-k-0-0123456789ab",
        "time": 0,
        "rows": 64,
        "files": [["part-0-000.snappy.parquet", 2001, SHA]],
        "figures": [64, 64, 0],
        "landed": "l0",
    }
    seg = edge["index"]["segments"][0]
    assert seg["level"] == "base" and seg["order"] == [0, 1] and seg["unit"] is True
    assert seg["packing"] == [[0, 3], [99, 90], [7, 7]]
    assert seg["files"]["layer"] == [
        "s-0123456789abcdef.seg",
        2112,
        SHA,
        [1234, 1700000000000000000, 1700000000000000001],
    ]
    assert edge["index"]["segments"][1]["view"] == [0, {"const": -5}, 1]
    assert raw["plan"]["relations"]["edge"] == {"arity": 2, "meaning": "set", "undirected": True}


def damaged(text: str, previous: str | None = PREV) -> str:
    with pytest.raises(DamagedState) as e:
        Manifest.from_json(text, SRC, previous)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{SRC}: damaged manifest: ")
    if previous:
        assert message.endswith(f"; the previous generation {PREV} is the way back")
    else:
        assert message.endswith("; no earlier generation is kept")
    return message


def test_an_edited_or_truncated_manifest_is_damaged() -> None:
    text = example().to_json()
    assert "its digest does not match" in damaged(text.replace('"rows":64', '"rows":65', 1))
    assert "not JSON" in damaged(text[: len(text) // 2])
    assert "not JSON" in damaged("", previous=None)
    assert "expected an object" in damaged("[1, 2]")
    assert "missing 'digest'" in damaged(text.replace('"digest"', '"dijest"'))


# A segment's three files as state format 2 wrote them (not read any more).
LEGACY = {
    role: [f"{role}.npy", size, SHA, [1234 + i, 1700000000000000000, 1700000000000000001]]
    for i, (role, size) in enumerate((("rows", 1152), ("diff", 640), ("keys", 640)))
}


def resealed(edit: Callable[[dict[str, Any]], None]) -> str:
    """The example's JSON edited, with a digest that matches: only the shape can be wrong."""
    raw = json.loads(example().to_json())
    edit(raw)
    raw["digest"] = digest_of(raw)
    return json.dumps(raw)


def edge(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["traces"]["rel/edge"]


def seg(raw: dict[str, Any]) -> dict[str, Any]:
    return edge(raw)["index"]["segments"][0]


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any):
    def edit(raw: dict[str, Any]) -> None:
        path(raw)[key] = value

    return edit


def _batch0(raw: dict[str, Any]) -> dict[str, Any]:
    return edge(raw)["batches"][0]


SHAPES = [
    (_set(lambda r: r, "generation", -1), "-1 is less than 0 at generation"),
    (_set(lambda r: r, "epoch", "3"), "expected an integer, found '3' at epoch"),
    (_set(lambda r: r, "epoch", 3.0), "expected an integer, found 3.0 at epoch"),
    (_set(lambda r: r, "frontier", True), "expected an integer, found True at frontier"),
    (_set(lambda r: r, "extra", 1), "unexpected 'extra'"),
    (_set(_batch0, "rows", -1), "-1 is less than 0 at traces['rel/edge'].batches[0].rows"),
    (_set(_batch0, "time", None), "batches[0].time"),
    (_set(_batch0, "path", "../../etc"), "is not a batch folder wcoj makes"),
    (_set(_batch0, "path", "traces/x-0123456789/mine"), "is not a batch folder wcoj makes"),
    (_set(_batch0, "files", [["../x", 1, SHA]]), "'../x' is not a file name"),
    (_set(_batch0, "files", [["p", 1, "nope"]]), "expected a sha256"),
    (_set(_batch0, "figures", [1, 2]), "expected 3 items"),
    (_set(_batch0, "figures", [1, 2, -1]), "figures[2]"),
    (lambda r: _batch0(r).pop("figures"), "missing 'figures'"),
    (_set(edge, "columns", ["a", "a"]), "repeated columns"),
    (_set(seg, "level", "middle"), "expected 'base' or 'recent'"),
    (_set(seg, "order", [0, 0]), "is not an order of 2 columns"),
    (_set(seg, "rows", 1.5), "segments[0].rows"),
    (_set(seg, "unit", 1), "expected true or false"),
    (_set(seg, "path", "arrangements/../../x"), "is not a segment file wcoj makes"),
    (_set(seg, "packing", [[0, 3], [99, 90], [7, 6]]), "is not a packing"),
    (_set(seg, "packing", [[0], [1], [1]]), "expected 2 lows, highs and bits"),
    (_set(seg, "view", [1, 0]), "view column 1 before column 0"),
    (_set(seg, "view", [0, {"const": "x"}]), "view[1].const"),
    (_set(seg, "view", [0, 0]), "the view has 1 columns, the order 2"),
    (lambda r: seg(r)["files"].pop("layer"), "expected files ['layer']"),
    (lambda r: seg(r)["files"].__setitem__("rows", LEGACY["rows"]), "expected files ['layer']"),
    (lambda r: seg(r)["files"]["layer"].pop(), "a segment file needs its stamp"),
    (
        lambda r: seg(r)["files"].__setitem__("layer", ["rows.npy", 1, SHA, [1, 2, 3]]),
        "expected 's-0123456789abcdef.seg'",
    ),
    (
        lambda r: r["plan"]["relations"]["edge"].__setitem__("meaning", "multiset"),
        "expected 'set' or 'bag'",
    ),
    (
        lambda r: r["plan"]["queries"]["tri"]["relations"].append("node"),
        "relation 'node' is not in plan.relations",
    ),
    (lambda r: r["traces"].__setitem__("", r["traces"]["out/tri"]), "a trace without a name"),
]


@pytest.mark.parametrize(("edit", "expected"), SHAPES)
def test_every_field_is_checked(edit: Callable[[dict[str, Any]], None], expected: str) -> None:
    assert expected in damaged(resealed(edit))


def test_manifests_of_other_formats_are_refused() -> None:
    old = json.dumps({"format": 1, "generation": 3, "epoch": 2, "frontier": None, "traces": {}})
    with pytest.raises(IncompatibleState) as e:
        Manifest.from_json(old, SRC, PREV)
    assert str(e.value) == (
        f"{SRC}: this state was created by an earlier wcoj (state format 1) and is not readable "
        f"by this one (format 5); re-create the state (apply its epochs into a new directory)"
    )
    later = resealed(lambda r: r.__setitem__("format", 6))
    with pytest.raises(IncompatibleState, match="a later wcoj"):
        Manifest.from_json(later, SRC)


def test_manifests_of_formats_2_to_4_are_refused() -> None:
    for fmt in (2, 3, 4):
        text = resealed(lambda r, f=fmt: r.__setitem__("format", f))
        with pytest.raises(IncompatibleState) as e:
            Manifest.from_json(text, SRC)
        assert str(e.value) == (
            f"{SRC}: this state was created by an earlier wcoj (state format {fmt}) and is not "
            "readable by this one (format 5); re-create the state (apply its epochs into a new "
            "directory)"
        )
    # A segment of a folder of three files (format 2's) is no segment of this format.
    folder = resealed(lambda r: seg(r).__setitem__("path", seg(r)["path"].removesuffix(".seg")))
    assert "is not a segment file wcoj makes" in damaged(folder)


def test_trace_helpers() -> None:
    t = example().traces["rel/edge"]
    assert [b.time for b in t.visible(0)] == [0] and t.visible(1, strict=True) == t.visible(0)
    assert t.rows() == 64 and t.rows(0, strict=True) == 0
    again = t.replacing(Batch(t.batches[0].path, 0, 5))
    assert [b.rows for b in again.batches] == [5, 0]
    assert len(t.paths()) == 4
    assert t.index is not None
    assert t.index.find(Level.RECENT, (0, Const(-5), 1), (1, 0)) is t.index.segments[1]
    assert t.index.find(Level.BASE, None, (1, 0)) is None
