"""CSV lines as Spark reads them, without Spark: `spark_csv_fields` and `check_csv_line`.

Spark parses each CSV line with univocity (quote ``"``, escape ``\\``, an unescaped quote kept
up to the next delimiter, blanks after a closing quote dropped, an unclosed quote running to the
end of the line). `wcoj_core.local_read.spark_csv_fields` follows that parser; the cases below
are Spark's own fields for lines drawn at random (the first three fields, as a schema of three
string columns reads them), and the ``spark`` test compares it with Spark on fresh random lines.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from wcoj_core.local_read import Role, check_csv_line, spark_csv_fields

# (line, Spark's first three fields), recorded from Spark 4 reading a file of such lines.
SPARK_FIELDS: list[tuple[str, list[str | None]]] = [
    ('" -,,"2-', ['" -,,"2-', None, None]),
    ('\t"\t0+x22"2\t', ['\t"\t0+x22"2\t', None, None]),
    ('-"x', ['-"x', None, None]),
    ('"\\"\\', ['"', None, None]),
    ('x,2222"221\tx"\\', ["x", '2222"221\tx"\\', None]),
    ('"-,2"1x,', ['"-,2"1x', None, None]),
    (' x\\"', [' x\\"', None, None]),
    ('1"\\x2 ,2"', ['1"\\x2 ', '2"', None]),
    ('\\ 12,"x\t', ["\\ 12", "x\t", None]),
    (',,\t,10"-x\\', [None, None, "\t"]),
    ('-1\t\\\\ \\\t"x0\\0', ['-1\t\\\\ \\\t"x0\\0', None, None]),
    ('" +x"2,""-"2-', ['" +x"2', '""-"2-', None]),
    ('x,"x', ["x", "x", None]),
    (',22"x"12', [None, '22"x"12', None]),
    ('\t\t+,10+,\t"', ["\t\t+", "10+", '\t"']),
    ('1,x"', ["1", 'x"', None]),
    (' \t,1""2\\', [" \t", '1""2\\', None]),
    ('11,"0202"+",x', ["11", '"0202"+"', "x"]),
    ('0\t+""0,\t,-\\,', ['0\t+""0', "\t", "-\\"]),
    ('x"","22', ['x""', "22", None]),
    ('\tx\t"x\t\txx02', ['\tx\t"x\t\txx02', None, None]),
    ('x"\\" ,1', ['x"\\" ', "1", None]),
    ('\t"\t\\', ['\t"\t\\', None, None]),
    (', " 12 ,\\', [None, ' " 12 ', "\\"]),
    (' x1 20\\\\-"  ,', [' x1 20\\\\-"  ', None, None]),
    (',"""2', [None, '"""2', None]),
    ('x1\tx\\2" ', ['x1\tx\\2" ', None, None]),
    ('"1,', ["1,", None, None]),
    (',x"', [None, 'x"', None]),
    ('"\t 2x ,', ["\t 2x ,", None, None]),
    ('"\t\tx ', ["\t\tx ", None, None]),
    ('212"2,', ['212"2', None, None]),
    ('"\\11,,', ["\\11,,", None, None]),
    ('+,2\t\\-2""1x', ["+", '2\t\\-2""1x', None]),
    ('1x22-""2\\2', ['1x22-""2\\2', None, None]),
    (' x"x2,', [' x"x2', None, None]),
    ('"1" ,2', ["1", "2", None]),
    ('1,"2', ["1", "2", None]),
    ('1,2,,"x', ["1", "2", None]),
    ('""', [None, None, None]),
    ('"', ['"', None, None]),
    ('"1\\', ["1", None, None]),
]


def first_three(line: str) -> list[str | None]:
    return (spark_csv_fields(line) + [None] * 3)[:3]


@pytest.mark.parametrize(("line", "fields"), SPARK_FIELDS)
def test_fields_as_spark_reads_them(line: str, fields: list[str | None]) -> None:
    assert first_three(line) == fields


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("1,2", None),
        ('"1" ,2', None),
        ('1,"2', None),
        ("1,2,", None),
        ('1,2,""', None),
        ("1,x", ("value in column 'b' is not an integer: 'x'", 2)),
        ("1", ("has 1 fields but the header has 2", 2)),
        ("1,2,3", ("has 3 fields but the header has 2", 3)),
        (
            '1,2,"3',
            ("has malformed quoting (unexpected end of data); quote a whole field, on one line", 5),
        ),
        (
            '"1"2,3',
            (
                "has malformed quoting (',' expected after '\"'); quote a whole field, on one line",
                4,
            ),
        ),
        (" 1 ,\t2\t", None),
        ("1,", ("value in column 'b' is empty", 2)),
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


def test_random_lines_against_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Thousands of random lines of digits, signs, quotes, commas, blanks and backslashes:
    Spark's fields, read through a schema of three string columns, and the model's agree."""
    rng = random.Random(2024)
    alphabet = ["1", "2", '"', ",", " ", "\\", "x", "\t", "-", "+", '"', ","]
    lines = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)}
    lines = sorted(line for line in lines if not all(c <= " " for c in line))
    path = tmp_path / "lines.csv"
    path.write_text("a,b\n" + "".join(f"{line}\n" for line in lines))
    schema = "_f0 string, _f1 string, _f2 string"
    spark_rows = spark.read.option("header", True).schema(schema).csv(str(path)).collect()
    assert len(spark_rows) == len(lines)
    differ = [
        (line, list(row), first_three(line))
        for line, row in zip(lines, spark_rows, strict=True)
        if list(row) != first_three(line)
    ]
    assert differ == []
