"""Query text -> Query: round trips, built-ins, layout, every error with its position, fuzzing."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wcoj_core.errors import QueryError, QuerySyntaxError, WcojError
from wcoj_core.query.builtins import BUILTINS, builtin, resolve_query
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Var
from wcoj_core.query.parse import parse_query

SAMPLES = [
    "p(a, c) :- e(a, b), e(b, c)",
    "head(a, b, c) :- rel(a, b), rel(b, c), other(a, c, 7), a < b, b != c",
    "p() :- e(a, a), f(-3, a), a >= -9223372036854775808, 9223372036854775807 > a",
    "q(x) :- r(), s(x, 0), x = 2, x <= 5",
    *BUILTINS.values(),
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_through_str(text: str) -> None:
    q = parse_query(text)
    assert parse_query(str(q)) == q
    assert str(parse_query(str(q))) == str(q)


def test_parse_builds_the_expected_ir() -> None:
    q = parse_query("head(a, b, c) :- rel(a, b), rel(b, c), other(a, c, 7), a < b, b != c")
    a, b, c = Var("a"), Var("b"), Var("c")
    assert q == Query(
        "head",
        (a, b, c),
        (Atom("rel", (a, b)), Atom("rel", (b, c)), Atom("other", (a, c, Const(7)))),
        (Filter(a, CmpOp.LT, b), Filter(b, CmpOp.NE, c)),
    )


@pytest.mark.parametrize(
    ("spelling", "op"),
    [
        ("<", CmpOp.LT),
        ("<=", CmpOp.LE),
        (">", CmpOp.GT),
        (">=", CmpOp.GE),
        ("=", CmpOp.EQ),
        ("==", CmpOp.EQ),
        ("!=", CmpOp.NE),
        ("<>", CmpOp.NE),
    ],
)
def test_every_operator_spelling(spelling: str, op: CmpOp) -> None:
    q = parse_query(f"p(a) :- e(a, b), a {spelling} b, a{spelling}-1")
    assert q.filters == (Filter(Var("a"), op, Var("b")), Filter(Var("a"), op, Const(-1)))


@pytest.mark.parametrize("name", list(BUILTINS))
def test_every_builtin_parses(name: str) -> None:
    q = builtin(name)
    assert q.relations == {"edge": 2}
    assert resolve_query(name) == q
    assert resolve_query(f"  {name}\n") == q


def test_builtin_order_and_names() -> None:
    assert list(BUILTINS) == [
        "triangles",
        "directed-triangles",
        "3-cycles",
        "4-cycles",
        "4-cliques",
        "2-paths",
        "triangle-count",
        "triangles-per-vertex",
        "edge-support",
        "degrees",
    ]
    assert [builtin(n).name for n in BUILTINS] == [
        "triangles",
        "directed_triangles",
        "cycles3",
        "cycles4",
        "cliques4",
        "paths2",
        "triangle_count",
        "triangles_per_vertex",
        "edge_support",
        "degrees",
    ]


def test_comments_newlines_and_trailing_dot() -> None:
    text = """
    # a comment line
    p(a,   % the first vertex
      c)
      :-
        e(a,b),e(b,
        c)  # trailing comment
        , a<c .   % after the dot
    """
    assert parse_query(text) == parse_query("p(a, c) :- e(a, b), e(b, c), a < c")


def test_empty_head_and_nullary_atom() -> None:
    q = parse_query("p() :- r(), e(a)")
    assert q.head == ()
    assert q.relations == {"r": 0, "e": 1}


def test_resolve_query_parses_text() -> None:
    assert resolve_query("p(a) :- e(a)") == parse_query("p(a) :- e(a)")


@pytest.mark.parametrize("spec", ["triangle", "5-cycles", "paths2"])
def test_resolve_query_unknown_name_lists_builtins(spec: str) -> None:
    with pytest.raises(QueryError) as info:
        resolve_query(spec)
    message = str(info.value)
    assert repr(spec) in message
    for name in BUILTINS:
        assert name in message


def test_builtin_unknown_name() -> None:
    with pytest.raises(QueryError, match="the built-in queries are triangles, "):
        builtin("squares")


def syntax_error(text: str) -> QuerySyntaxError:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(text)
    assert info.value.text == text
    return info.value


def query_error(text: str) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse_query(text)
    assert not isinstance(info.value, QuerySyntaxError)
    return info.value


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        # unexpected character
        ("p(a) :- e(a) $", 1, 14, "unexpected character '$'"),
        ("p(a) :-\n  e(a),\n  a @ 1", 3, 5, "unexpected character '@'"),
        ("p(a) : e(a)", 1, 6, "':-'"),
        ("p(a) :- e(a), a < -", 1, 19, "minus sign"),
        # missing parentheses
        ("p(a) :- e(a, b", 1, 15, "unexpected end of query; expected ',' or ')' after a term"),
        ("p(a :- e(a)", 1, 5, "expected ',' or ')' after a head variable, found ':-'"),
        ("p(a) :- e a", 1, 11, "expected '(' to start an atom"),
        ("p a :- e(a)", 1, 3, "expected '(' after the query name 'p', found 'a'"),
        ("p(a) :- e(a x)", 1, 13, "expected ',' or ')' after a term, found 'x'"),
        # missing ':-'
        ("p(a) e(a)", 1, 6, "expected ':-' between the head and the body, found 'e'"),
        ("p(a)", 1, 5, "unexpected end of query; expected ':-'"),
        # bad operators
        ("p(a) :- e(a), a => 1", 1, 18, "expected a term after '=' (a variable or an integer)"),
        ("p(a) :- e(a), a ! 1", 1, 17, "'!='"),
        ("p(a) :- e(a), a 1", 1, 17, "found '1'"),
        ("p(a) :- e(a), 1 e", 1, 17, "expected a comparison operator"),
        # huge integers
        ("p(a) :- e(a, 99999999999999999999)", 1, 14, "does not fit in 64 bits"),
        ("p(a) :- e(a,\n 9223372036854775808)", 2, 2, "does not fit in 64 bits"),
        ("p(a) :- e(a, -9223372036854775809)", 1, 14, "does not fit in 64 bits"),
        ("p(a) :- e(a, " + "9" * 5000 + ")", 1, 14, "does not fit in 64 bits"),
        # malformed tokens
        ("p(a) :- e(12ab)", 1, 11, "malformed integer literal '12ab'"),
        # empty bodies and misplaced items
        ("p() :- ", 1, 8, "unexpected end of query; expected an atom or a comparison after ':-'"),
        ("p() :- .", 1, 8, "expected an atom or a comparison after ':-', found '.'"),
        ("p(a) :- e(a),", 1, 14, "expected an atom or a comparison after ','"),
        ("p(a) :- e(a,)", 1, 13, "expected a term after ',' (a variable or an integer)"),
        ("p(1) :- e(a)", 1, 3, "head arguments must be variables"),
        ("p(a) :- e(a).x", 1, 14, "expected end of query after the final '.', found 'x'"),
        ("p(a) :- e(a) f(a)", 1, 14, "expected ',', '.' or end of query after a body item"),
        ("", 1, 1, "unexpected end of query; expected the query name"),
        ("% only a comment\n", 2, 1, "unexpected end of query"),
    ],
)
def test_syntax_errors_carry_position(text: str, line: int, column: int, fragment: str) -> None:
    err = syntax_error(text)
    assert (err.line, err.column) == (line, column)
    assert fragment in str(err)
    assert str(err).startswith(f"query line {line}, column {column}: ")


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("p(a, z) :- e(a, b)", "line 1, column 6", "head variable 'z'"),
        ("p(a) :-\n  e(a),\n  a < z", "line 3, column 3", "filter a < z uses variable 'z'"),
        ("p(a) :- e(a),\n   e(a, b)", "line 2, column 4", "arity 2 (e(a, b)) but with arity 1"),
        ("p() :- a < 1", "line 1, column 8", "needs at least one atom"),
        ("p(a) :- 1 < 2, e(a)", "line 1, column 9", "compares two constants"),
    ],
)
def test_semantic_errors_carry_position(text: str, where: str, fragment: str) -> None:
    err = query_error(text)
    assert str(err).startswith(f"query {where}: ")
    assert fragment in str(err)


def test_arity_error_names_both_positions() -> None:
    err = query_error("p(a) :- e(a),\n   e(a, b)")
    assert "at line 1, column 9" in str(err)


# --- fuzzing ------------------------------------------------------------------------------------

_NOISE = st.sampled_from([*"(),.:-<>=!%#\n \t_aZ09-", "é", "\x00", "٣", "²", ":-", "9" * 25])


@st.composite
def mutated_queries(draw: st.DrawFn) -> str:
    """A valid query text with a few characters deleted and a few inserted."""
    text = draw(st.sampled_from(SAMPLES))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        if draw(st.booleans()) and text:
            text = text[: max(i - 1, 0)] + text[i:]
        else:
            text = text[:i] + draw(_NOISE) + text[i:]
    return text


def check_parses_or_reports(text: str) -> None:
    try:
        q = parse_query(text)
    except WcojError as err:
        if isinstance(err, QuerySyntaxError):
            assert err.line >= 1
            assert err.column >= 1
        return
    assert isinstance(q, Query)
    assert parse_query(str(q)) == q


@settings(max_examples=300)
@given(st.text())
def test_fuzz_arbitrary_text(text: str) -> None:
    check_parses_or_reports(text)


@settings(max_examples=300)
@given(mutated_queries())
def test_fuzz_mutated_queries(text: str) -> None:
    check_parses_or_reports(text)


@settings(max_examples=200)
@given(st.text())
def test_fuzz_resolve_query(text: str) -> None:
    with contextlib.suppress(WcojError):
        resolve_query(text)


_NAMES = st.sampled_from(["a", "b", "c", "x_1", "Var"])
_TERMS = st.one_of(
    _NAMES.map(Var), st.integers(-(2**63), 2**63 - 1).map(Const), st.sampled_from([Const(-3)])
)


@st.composite
def queries(draw: st.DrawFn) -> Query:
    """A random valid Query built directly in the IR."""
    arities = {"r": draw(st.integers(0, 3)), "s": draw(st.integers(1, 3))}
    atoms = [
        Atom(rel, tuple(draw(_TERMS) for _ in range(arities[rel])))
        for rel in draw(st.lists(st.sampled_from(["r", "s"]), min_size=1, max_size=4))
    ]
    bound = sorted({v.name for a in atoms for v in a.vars})
    if not bound:
        return Query("q", (), tuple(atoms))
    var = st.sampled_from(bound).map(Var)
    head = draw(st.lists(var, max_size=4))
    filters = draw(
        st.lists(
            st.builds(Filter, var, st.sampled_from(list(CmpOp)), st.one_of(var, _TERMS)),
            max_size=3,
        )
    )
    filters = [f if draw(st.booleans()) else Filter(f.right, f.op, f.left) for f in filters]
    filters = [f for f in filters if not (f.vars - {Var(n) for n in bound})]
    return Query("q", tuple(head), tuple(atoms), tuple(filters))


@given(queries())
def test_round_trip_of_random_ir(q: Query) -> None:
    assert parse_query(str(q)) == q
