"""Query text -> `Query`: a hand-written tokenizer and a recursive-descent parser.

The accepted language is Datalog-style conjunctive queries::

    query := IDENT '(' [head (',' head)*] ')' ':-' item (',' item)* ['.']
    head  := IDENT | 'count' '(' ')' | 'sum' '(' IDENT ')'   an aggregate: the head's last
    item  := IDENT '(' [term (',' term)*] ')'      an atom
           | term OP term                          a filter
    term  := IDENT | INT                           a variable or a 64-bit integer such as -3
    OP    := '<' | '<=' | '>' | '>=' | '=' | '!='  ('==' means '=', '<>' means '!=')

Identifiers are ASCII: ``[A-Za-z_][A-Za-z0-9_]*``. Whitespace may appear between any two tokens,
and ``%`` or ``#`` starts a comment that runs to the end of the line. Lines end at ``\\n``; lines
and columns are 1-based.

Contract:

* text that does not match the grammar raises `QuerySyntaxError` carrying the line and column of
  the offending token (or of the end of the text) and a message naming what was found and what
  was expected;
* text that parses but is not a valid query (no atom in the body, a relation used with two
  arities, an unbound head or filter variable, a filter between two constants, an aggregate
  that is not linear or not last in the head) raises
  `QueryError` whose message starts with the line and column of the offending part;
* anything else yields a `Query`, and ``parse_query(str(q)) == q`` for every parsed ``q``.

`wcoj_core.query.builtins.resolve_query` also accepts the name of a built-in query.

>>> q = parse_query("p(a, c) :- e(a, b), e(b, c), a < c.")
>>> str(q)
'p(a, c) :- e(a, b), e(b, c), a < c'
>>> parse_query("p(a) :- e(a b)")
Traceback (most recent call last):
  ...
wcoj_core.errors.QuerySyntaxError: query line 1, column 13: expected ',' or ')' after a term, found 'b'
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NoReturn

from wcoj_core.errors import QueryError, QuerySyntaxError
from wcoj_core.query.ir import AGGREGATES, Aggregate, Atom, CmpOp, Const, Filter, Query, Term, Var

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
# A 64-bit integer has at most 19 digits; longer literals are rejected before conversion, which
# also keeps Python's int() digit limit out of reach.
_MAX_DIGITS = 19
_DIGITS = frozenset("0123456789")
_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_IDENT_PART = _IDENT_START | _DIGITS
_WHITESPACE = frozenset(" \t\r\n\f\v")
_COMMENT_START = frozenset("%#")
# Longest spelling first, so that '<=' wins over '<'.
_OPERATORS: tuple[tuple[str, CmpOp], ...] = (
    ("<=", CmpOp.LE),
    (">=", CmpOp.GE),
    ("!=", CmpOp.NE),
    ("<>", CmpOp.NE),
    ("==", CmpOp.EQ),
    ("<", CmpOp.LT),
    (">", CmpOp.GT),
    ("=", CmpOp.EQ),
)
_PUNCTUATION = {"(": "LPAREN", ")": "RPAREN", ",": "COMMA", ".": "DOT"}


class _Kind(Enum):
    IDENT = "an identifier"
    INT = "an integer"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    DOT = "'.'"
    IMPLIES = "':-'"
    OP = "a comparison operator"
    END = "end of query"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Kind
    text: str
    line: int
    column: int
    op: CmpOp | None = None
    value: int = 0


def parse_query(text: str) -> Query:
    """Parse Datalog-style query text into a validated `Query`.

    >>> q = parse_query('''
    ...     % each triangle once
    ...     t(a, b, c) :- e(a, b), e(b, c), e(a, c),
    ...                   a < b, b <> c.
    ... ''')
    >>> [str(f) for f in q.filters]
    ['a < b', 'b != c']
    >>> parse_query("p(a) :- e(a, 99999999999999999999)")
    Traceback (most recent call last):
      ...
    wcoj_core.errors.QuerySyntaxError: query line 1, column 14: integer literal 99999999999999999999 does not fit in 64 bits; use a value between -9223372036854775808 and 9223372036854775807
    """
    return _Parser(text).parse()


def _located(token: _Token, message: str) -> QueryError:
    """A `QueryError` whose message starts with the position of `token`."""
    return QueryError(f"query line {token.line}, column {token.column}: {message}")


def _tokenize(text: str) -> list[_Token]:
    """Split `text` into tokens, ending with an END token; reject characters outside the grammar."""
    tokens: list[_Token] = []
    i, line, line_start = 0, 1, 0
    n = len(text)
    while i < n:
        ch = text[i]
        column = i - line_start + 1
        if ch == "\n":
            i += 1
            line, line_start = line + 1, i
        elif ch in _WHITESPACE:
            i += 1
        elif ch in _COMMENT_START:
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif ch in _IDENT_START:
            j = i + 1
            while j < n and text[j] in _IDENT_PART:
                j += 1
            tokens.append(_Token(_Kind.IDENT, text[i:j], line, column))
            i = j
        elif ch in _DIGITS or (ch == "-" and i + 1 < n and text[i + 1] in _DIGITS):
            j = i + 1
            while j < n and text[j] in _DIGITS:
                j += 1
            if j < n and text[j] in _IDENT_START:
                k = j
                while k < n and text[k] in _IDENT_PART:
                    k += 1
                raise QuerySyntaxError(
                    f"malformed integer literal {text[i:k]!r}; an identifier cannot start with a "
                    "digit",
                    line,
                    column,
                    text,
                )
            literal = text[i:j]
            value = _parse_int(literal)
            if value is None:
                raise QuerySyntaxError(
                    f"integer literal {literal} does not fit in 64 bits; use a value between "
                    f"{_INT_MIN} and {_INT_MAX}",
                    line,
                    column,
                    text,
                )
            tokens.append(_Token(_Kind.INT, literal, line, column, value=value))
            i = j
        elif text.startswith(":-", i):
            tokens.append(_Token(_Kind.IMPLIES, ":-", line, column))
            i += 2
        elif ch in _PUNCTUATION:
            tokens.append(_Token(_Kind[_PUNCTUATION[ch]], ch, line, column))
            i += 1
        else:
            for spelling, op in _OPERATORS:
                if text.startswith(spelling, i):
                    tokens.append(_Token(_Kind.OP, spelling, line, column, op=op))
                    i += len(spelling)
                    break
            else:
                raise QuerySyntaxError(_describe_bad_char(ch), line, column, text)
    tokens.append(_Token(_Kind.END, "", line, n - line_start + 1))
    return tokens


def _parse_int(literal: str) -> int | None:
    """The value of a decimal literal (optionally negative), or None when it exceeds 64 bits."""
    if len(literal.lstrip("-").lstrip("0")) > _MAX_DIGITS:
        return None
    value = int(literal)
    return value if _INT_MIN <= value <= _INT_MAX else None


def _describe_bad_char(ch: str) -> str:
    """The message for a character that starts no token."""
    if ch == ":":
        return "unexpected character ':'; write ':-' between the head and the body"
    if ch == "!":
        return "unexpected character '!'; the not-equal operator is '!=' (or '<>')"
    if ch == "-":
        return (
            "unexpected character '-'; a minus sign must be followed directly by digits, as in -3"
        )
    return (
        f"unexpected character {ch!r}; expected an identifier, an integer, '(', ')', ',', ':-', "
        "'.', a comparison operator or a comment starting with '%' or '#'"
    )


class _Parser:
    """Recursive descent over the token list; collects positions for the semantic checks."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        token = self.peek()
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def fail(self, expected: str) -> NoReturn:
        """Raise a syntax error at the current token, which is not `expected`."""
        token = self.peek()
        if token.kind is _Kind.END:
            message = f"unexpected end of query; expected {expected}"
        else:
            message = f"expected {expected}, found {token.text!r}"
        raise QuerySyntaxError(message, token.line, token.column, self.text)

    def expect(self, kind: _Kind, expected: str) -> _Token:
        if self.peek().kind is not kind:
            self.fail(expected)
        return self.advance()

    def parse(self) -> Query:
        name = self.expect(_Kind.IDENT, "the query name (an identifier)")
        self.expect(_Kind.LPAREN, f"'(' after the query name {name.text!r}")
        head, aggregate = self.parse_head()
        self.expect(_Kind.IMPLIES, "':-' between the head and the body")
        atoms: list[tuple[Atom, _Token]] = []
        filters: list[tuple[Filter, _Token]] = []
        after = "':-'"
        while True:
            start = self.peek()
            item = self.parse_item(after)
            if isinstance(item, Atom):
                atoms.append((item, start))
            else:
                filters.append((item, start))
            token = self.peek()
            if token.kind is _Kind.COMMA:
                self.advance()
                after = "','"
            elif token.kind is _Kind.DOT:
                self.advance()
                self.expect(_Kind.END, "end of query after the final '.'")
                break
            elif token.kind is _Kind.END:
                break
            else:
                self.fail("',', '.' or end of query after a body item")
        return self.build(name, head, atoms, filters, aggregate)

    def parse_head(self) -> tuple[list[tuple[Var, _Token]], tuple[Aggregate, _Token] | None]:
        """The head's variables and its aggregate (if any), up to and including ')'."""
        head: list[tuple[Var, _Token]] = []
        aggregate: tuple[Aggregate, _Token] | None = None
        if self.peek().kind is _Kind.RPAREN:
            self.advance()
            return head, aggregate
        expected = "a variable or ')' after '('"
        while True:
            if self.peek().kind is not _Kind.IDENT:
                self.fail(f"{expected} (head arguments must be variables)")
            token = self.advance()
            if aggregate is not None:
                raise _located(token, f"{aggregate[0]} must be the head's last argument")
            if self.peek().kind is _Kind.LPAREN:
                aggregate = (self.parse_aggregate(token), token)
            else:
                head.append((Var(token.text), token))
            if self.peek().kind is _Kind.RPAREN:
                self.advance()
                return head, aggregate
            if self.peek().kind is not _Kind.COMMA:
                self.fail("',' or ')' after a head variable")
            self.advance()
            expected = "a variable after ','"

    def parse_aggregate(self, name: _Token) -> Aggregate:
        """``count()`` or ``sum(x)`` after its name; any other function is refused."""
        if name.text not in AGGREGATES:
            raise _located(
                name,
                f"{name.text}() is not an aggregate wcoj keeps: the aggregates are count() and "
                "sum(x), the linear ones (their change is the aggregate of the join's change)",
            )
        self.advance()  # '('
        var = None
        if name.text == "sum":
            var = Var(self.expect(_Kind.IDENT, "a variable in sum( )").text)
        self.expect(_Kind.RPAREN, f"')' closing {name.text}(" + (" x)" if var else ")"))
        return Aggregate(var)

    def parse_item(self, after: str) -> Atom | Filter:
        """One body item: an atom ``rel(t, ...)`` or a filter ``t OP t``."""
        token = self.peek()
        if token.kind is _Kind.IDENT and self.peek(1).kind is _Kind.LPAREN:
            return self.parse_atom()
        if token.kind is _Kind.IDENT and self.peek(1).kind is not _Kind.OP:
            self.advance()
            self.fail(f"'(' to start an atom or a comparison operator after {token.text!r}")
        if token.kind not in (_Kind.IDENT, _Kind.INT):
            self.fail(f"an atom or a comparison after {after}")
        return self.parse_filter()

    def parse_atom(self) -> Atom:
        relation = self.advance()
        self.advance()  # the '(' seen by parse_item
        terms: list[Term] = []
        if self.peek().kind is _Kind.RPAREN:
            self.advance()
            return Atom(relation.text, ())
        expected = "a term or ')' after '('"
        while True:
            terms.append(self.parse_term(expected))
            if self.peek().kind is _Kind.RPAREN:
                self.advance()
                return Atom(relation.text, tuple(terms))
            if self.peek().kind is not _Kind.COMMA:
                self.fail("',' or ')' after a term")
            self.advance()
            expected = "a term after ','"

    def parse_filter(self) -> Filter:
        start = self.peek()
        left = self.parse_term("a term")
        op = self.expect(_Kind.OP, "a comparison operator (<, <=, >, >=, =, !=)")
        right = self.parse_term(f"a term after {op.text!r}")
        if isinstance(left, Const) and isinstance(right, Const):
            raise _located(
                start,
                f"filter {left} {op.text} {right} compares two constants; "
                "a filter needs at least one variable",
            )
        assert op.op is not None
        return Filter(left, op.op, right)

    def parse_term(self, expected: str) -> Term:
        token = self.peek()
        if token.kind is _Kind.IDENT:
            self.advance()
            return Var(token.text)
        if token.kind is _Kind.INT:
            self.advance()
            return Const(token.value)
        self.fail(f"{expected} (a variable or an integer)")

    def build(
        self,
        name: _Token,
        head: list[tuple[Var, _Token]],
        atoms: list[tuple[Atom, _Token]],
        filters: list[tuple[Filter, _Token]],
        aggregate: tuple[Aggregate, _Token] | None = None,
    ) -> Query:
        """Check what makes the query meaningful, reporting positions, then build the IR."""
        if not atoms:
            raise _located(
                filters[0][1],
                "the body has only filters; a query needs at least one atom such as "
                "'edge(a, b)' to bind its variables",
            )
        arities: dict[str, tuple[int, _Token]] = {}
        for atom, token in atoms:
            known, first = arities.setdefault(atom.relation, (atom.arity, token))
            if known != atom.arity:
                raise _located(
                    token,
                    f"relation {atom.relation!r} is used here with arity {atom.arity} ({atom}) "
                    f"but with arity {known} at line {first.line}, column {first.column}; "
                    "a relation has one arity",
                )
        bound = {v for atom, _ in atoms for v in atom.vars}
        summed = [] if aggregate is None or aggregate[0].var is None else [aggregate]
        for v, token in [*head, *((a.var, t) for a, t in summed if a.var is not None)]:
            if v not in bound:
                raise _located(
                    token,
                    f"head variable {v.name!r} does not appear in any atom of the body; "
                    "bind it in an atom or drop it from the head",
                )
        for f, token in filters:
            unbound = sorted(v.name for v in f.vars if v not in bound)
            if unbound:
                raise _located(
                    token,
                    f"filter {f} uses variable {unbound[0]!r}, which no atom of the body binds; "
                    "a filter can only compare variables bound by atoms",
                )
        return Query(
            name.text,
            tuple(v for v, _ in head),
            tuple(a for a, _ in atoms),
            tuple(f for f, _ in filters),
            None if aggregate is None else aggregate[0],
        )
