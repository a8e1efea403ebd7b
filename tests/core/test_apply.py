"""``wcoj apply``: one epoch at a time onto a kept state, against the naive oracle; epochs are
applied once and in order; deleting absent tuples is accepted but reported."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from wcoj_core import cli
from wcoj_core.cli import workspace
from wcoj_core.engine import Engine
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import builtin

EPOCHS = [
    [(1, 2, 1), (2, 3, 1), (1, 3, 1), (3, 4, 1), (2, 4, 1)],
    [(1, 4, 1), (2, 3, -1), (4, 5, 2)],
    [(2, 3, 1), (5, 1, 1), (1, 5, 1)],
]


def write(path: Path, rows: list[tuple[int, int, int]]) -> str:
    path.write_text("c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
    return str(path)


def apply(
    capsys: pytest.CaptureFixture[str], state: Path, epoch: int, changes: str, *extra: str
) -> tuple[int, list[str], list[str]]:
    code = cli.main(
        [
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", str(epoch)],
            *["--changes", f"edge={changes}", "--undirected", "edge", "--json", *extra],
        ]
    )
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def undirected(rows: list[tuple[int, int, int]]) -> Counter[tuple[int, ...]]:
    total: Counter[tuple[int, ...]] = Counter()
    for a, b, d in rows:
        if a != b:
            total[(a, b)] += d
            total[(b, a)] += d
    return total


def multiset(spark: SparkSession, state: Path) -> Counter[tuple[int, ...]]:
    engine = Engine(spark, str(state), builtin("triangles"))
    return Counter({tuple(r[:-1]): r[-1] for r in engine.output().collect()})


def test_epochs_applied_one_by_one_match_the_oracle(
    small: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    edges: Counter[tuple[int, ...]] = Counter()
    for t, rows in enumerate(EPOCHS):
        code, out, err = apply(capsys, state, t, write(tmp_path / f"e{t}.csv", rows))
        assert code == 0, err
        edges.update(undirected(rows))
        expected = naive_eval(builtin("triangles"), {"edge": +edges})
        assert multiset(small, state) == expected
        payload = json.loads(out[-1])
        assert payload["epoch"] == t and payload["count"] == sum(expected.values())
        assert payload["negative"] == {"edge": []}
        assert out[0].startswith(f"epoch {t}: changes ")


def test_an_applied_or_older_epoch_is_refused_and_changes_nothing(
    small: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    for t in (0, 1):
        assert apply(capsys, state, t, write(tmp_path / f"e{t}.csv", EPOCHS[t]))[0] == 0
    manifests = sorted(p.name for p in (state / "manifests").iterdir())
    before = multiset(small, state)
    for t in (1, 0):  # the same epoch again, and an older one
        code, _, err = apply(capsys, state, t, write(tmp_path / "again.csv", EPOCHS[2]))
        assert code == 2
        assert err == [
            f"wcoj: error: epoch {t} cannot be applied to {state}: epoch 1 is already applied "
            "(epochs are applied once, in increasing order)"
        ]
    assert sorted(p.name for p in (state / "manifests").iterdir()) == manifests
    assert multiset(small, state) == before


def test_deleting_absent_tuples_is_applied_and_reported(
    small: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    assert apply(capsys, state, 0, write(tmp_path / "e0.csv", EPOCHS[0]))[0] == 0
    code, out, err = apply(capsys, state, 1, write(tmp_path / "e1.csv", [(7, 8, -1), (1, 2, -1)]))
    assert code == 0
    (warning,) = err
    assert warning.startswith("wcoj: warning: epoch 1 deleted tuples relation 'edge' did not hold")
    assert "2 now have a negative multiplicity: (7, 8): -1, (8, 7): -1" in warning
    assert json.loads(out[-1])["negative"] == {"edge": [[[7, 8], -1], [[8, 7], -1]]}


def test_apply_arguments_are_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(master: str | None) -> SparkSession:
        raise AssertionError("Spark was started although the arguments are invalid")

    monkeypatch.setattr(workspace, "start_spark", refuse)
    good = write(tmp_path / "e.csv", EPOCHS[0])
    base = ["apply", "--query", "triangles", "--state", str(tmp_path / "s")]
    for argv, fragment in [
        ([*base, "--epoch", "-1", "--changes", f"edge={good}"], "--epoch must be 0 or more"),
        (
            [*base, "--epoch", "0", "--changes", f"nope={good}"],
            "which query triangles does not use",
        ),
        ([*base, "--epoch", "0", "--changes", "edge=missing.csv"], "no such file"),
        ([*base, "--epoch", "0", "--changes", "edge=rmat:scale=3"], "not a generator"),
        (
            [*base, "--epoch", "0", "--changes", f"edge={good}", "--changes", f"edge={good}"],
            "twice",
        ),
        ([*base, "--epoch", "0", "--changes", "edge"], "not of the form REL=PATH"),
    ]:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and fragment in err[0], (fragment, err)
