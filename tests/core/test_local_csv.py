"""CSV lines in the project's dialect (`wcoj_core.input_read.csv_fields`): what a data line may
hold and what each refusal says, without Spark.

The dialect is the project's own (it once followed Spark's univocity parser, quirks included;
the one reader now runs in Spark's tasks too, so there is nothing left to follow): fields
separated by ``,``, a quote enclosing a whole field, blanks around a value dropped, exactly one
field per header column. The last test checks that the block reader (its pyarrow fast path and
its line-by-line rules) reads every random line as `check_csv_line` judges it.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from wcoj_core.errors import InputError
from wcoj_core.input_read import Role, check_csv_line, csv_fields, read_local

QUOTING = "has malformed quoting ({}); quote a whole field, on one line"


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        ("1,2", ["1", "2"]),
        ('"1","2"', ["1", "2"]),
        (' 1 ,\t"2"', [" 1 ", '\t"2"']),  # a quote after a blank is part of the value
        ('"1,2",3', ["1,2", "3"]),
        ('"a""b",c', ['a"b', "c"]),
        ("1,2,", ["1", "2", ""]),
        ("", []),
    ],
)
def test_fields(line: str, fields: list[str]) -> None:
    assert csv_fields(line) == fields


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("1,2", None),
        (" 1 ,\t2\t", None),
        ('"1","-2"', None),
        ('" 1",+2', None),
        ("1,x", ("value in column 'b' is not an integer: 'x'", 2)),
        ("1", ("has 1 fields but the header has 2", 2)),
        ("1,2,3", ("has 3 fields but the header has 2", 3)),
        ("1,2,", ("has 3 fields but the header has 2", 3)),  # Spark dropped it; no longer
        ('1,2,"3', (QUOTING.format("unexpected end of data"), 5)),
        ('1,"2', (QUOTING.format("unexpected end of data"), 3)),  # Spark read 2; no longer
        ('"1" ,2', (QUOTING.format("',' expected after '\"'"), 4)),  # Spark read 1; no longer
        ('"1"2,3', (QUOTING.format("',' expected after '\"'"), 4)),
        ("1,", ("value in column 'b' is empty", 2)),
        ('1,"2"', None),
    ],
)
def test_the_problem_with_a_line(line: str, problem: tuple[str, int] | None) -> None:
    assert check_csv_line(line, ["a", "b"], [Role.DATA, Role.DATA]) == problem


def test_a_zero_diff_is_a_problem() -> None:
    roles = [Role.DATA, Role.DIFF]
    assert check_csv_line("4,0", ["a", "diff"], roles) == (
        "value in column 'diff' is zero; a diff must be a non-zero multiplicity",
        2,
    )
    assert check_csv_line("4,-3", ["a", "diff"], roles) is None


def test_random_lines_read_as_each_is_judged(tmp_path: Path) -> None:
    """Random lines: well-formed ones (integers, some quoted, some with blanks) and thousands
    of random strings of digits, signs, quotes, commas and blanks. A file of the lines
    `check_csv_line` accepts reads as exactly their values (through the fast path and the exact
    rules alike), and a file ending in a refused line is refused at that line, as judged."""
    rng = random.Random(2024)

    def value() -> str:
        blank = rng.choice(["", "", " ", "\t"])
        number = (
            str(rng.randint(-(2**63), 2**63 - 1))
            if rng.random() < 0.1
            else str(rng.randint(-9, 99))
        )
        quote = '"' if rng.random() < 0.3 else ""
        return f"{quote}{blank}{number}{blank}{quote}" if quote else f"{blank}{number}{blank}"

    made = [f"{value()},{value()}" for _ in range(2000)]
    alphabet = ["1", "2", '"', ",", " ", "x", "\t", "-", "+", '"', ","]
    drawn = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)}
    lines = made + sorted(line for line in drawn if not all(c <= " " for c in line))
    header, roles = ["a", "b"], [Role.DATA, Role.DATA]
    good = [line for line in lines if check_csv_line(line, header, roles) is None]
    bad = [line for line in lines if check_csv_line(line, header, roles) is not None]
    assert len(good) >= 2000 and len(bad) > 1000
    path = tmp_path / "good.csv"
    path.write_text("a,b\n" + "".join(f"{line}\n" for line in good))
    table = read_local(str(path), 2, "e")
    expected = Counter((*(int(f) for f in csv_fields(line)), 1) for line in good)
    assert Counter(zip(*(c.to_pylist() for c in table.columns), strict=True)) == expected
    for line in bad[:: len(bad) // 40]:
        path.write_text("a,b\n" + "".join(f"{g}\n" for g in good[:20]) + f"{line}\n")
        with pytest.raises(InputError) as refused:
            read_local(str(path), 2, "e")
        message, column = check_csv_line(line, header, roles) or ("", None)
        assert (refused.value.line, refused.value.column) == (22, column), line
        assert str(refused.value).endswith(message), line
