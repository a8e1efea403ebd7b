"""One location type: no module of the product but `wcoj_core.store.location` tells a local path
from a remote URI by testing a string for a scheme (``"://" in path``,
``path.startswith("file://")``, ``path.removeprefix("file://")``, ...) or makes a URI by hand
(``f"file://{path}"``). Every module's source is parsed (`ast`, nothing imported); Spark master
URLs (``spark://``) and Postgres URLs are not locations and are left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from wcoj_core.store.location import Location

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("wcoj_core", "wcoj_assets")
OWNER = Path("wcoj_core/store/location.py")
NOT_LOCATIONS = ("spark://", "postgresql://", "postgres://")
# What a string is tested or cut with.
STRING_TESTS = frozenset(
    {
        "startswith",
        "endswith",
        "removeprefix",
        "removesuffix",
        "partition",
        "rpartition",
        "split",
        "rsplit",
        "find",
        "rfind",
        "index",
        "rindex",
        "count",
        "replace",
    }
)


def _schemes(node: ast.AST) -> Iterator[str]:
    """The strings of `node` (a constant, a tuple of them, an f-string's literal parts) that
    hold a scheme's ``://`` and are not a Spark master's or a Postgres URL."""
    parts = (
        node.values
        if isinstance(node, ast.JoinedStr)
        else node.elts
        if isinstance(node, ast.Tuple)
        else [node]
    )
    for part in parts:
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            text = part.value
            if "://" in text and not text.startswith(NOT_LOCATIONS):
                yield text


def scheme_tests(source: str) -> list[tuple[int, str]]:
    """Each line of `source` that tests a string for a scheme or makes a URI by hand, with the
    string.

    >>> scheme_tests('ok = "://" not in p\\nu = f"file://{p}"\\nm = "spark://h" in x')
    [(1, '://'), (2, 'file://')]
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STRING_TESTS
        ):
            operands = [node.func.value, *node.args]
        elif isinstance(node, ast.JoinedStr):
            operands = [node]
        found += [(node.lineno, text) for o in operands for text in _schemes(o)]  # type: ignore[attr-defined]
    return sorted(set(found))


def test_no_scheme_test_outside_the_location_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) != OWNER
        for line, text in scheme_tests(path.read_text())
    ]
    assert not found, "ask wcoj_core.store.location.Location instead:\n" + "\n".join(found)


def test_every_kind_of_scheme_test_is_found() -> None:
    source = "\n".join(
        [
            'a = "://" in p',
            'b = p.startswith(("file://", "s3a://"))',
            'c = Path(p.removeprefix("file://"))',
            'd = p.partition("://")[0]',
            'e = f"file://{folder}"',
            'f = p == "hdfs://nn/x"',
            'g = master.startswith("spark://")',
            'h = "postgresql://u@h/db" in url',
            'i = "see s3a://bucket"',  # a message naming a URI tests nothing
        ]
    )
    assert sorted({line for line, _ in scheme_tests(source)}) == [1, 2, 3, 4, 5, 6]


def test_locations() -> None:
    for local in ("edges.txt", "/tmp/s", "file:///tmp/s", "file:/tmp/s", "C:/data", "a:b"):
        assert Location.of(local).local, local
    for remote in ("s3a://b/s", "hdfs://nn:8020/w", "gs://b", "HDFS://nn/w", "abfs://c@a/p"):
        assert not Location.of(remote).local, remote
    assert Location.of("file:///tmp/s/").absolute() == "/tmp/s"
    assert Location.of("file:///tmp/s").spark_uri("traces/t") == "file:///tmp/s/traces/t"
    assert Location.of("s3a://b/s/").spark_uri("traces/t") == "s3a://b/s/traces/t"
