"""The compiled text reader (`parse_text`) vouches only for what the exact rules read alike.

A block the compiled reader takes must give exactly the rows the line-by-line rules give
(`_text_exact`); a block it refuses is read by those rules, which name its first bad line. The
blocks are valid edge lists with a few bytes changed, random bytes, and numbers at the edges of
the int64 range. Also: a whole gzip file read ahead on a thread (`_read_ahead`) gives the rows
of the file read at once, and a truncated or damaged one is refused.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wcoj_core.errors import InputError
from wcoj_core.input_read import (
    _AHEAD_BYTES,
    _normalize,
    _text_exact,
    _text_fast,
    read_local,
    read_local_batches,
)
from wcoj_core.kernel.native import native

_SAMPLES = [
    b"# Directed graph\n# FromNodeId\tToNodeId\n1\t2\n2 3\n\n1\t2\n",
    b"1 2 3\r\n-4 5 +6\r\n",
    b"7\n8\n",
    b"  \t 9223372036854775807 -9223372036854775808 \r\n0 -0\n+12 00013\n",
]
_NOISE = st.sampled_from(list(b"0123456789-+ \t\r\n#,.x\x00\x0c\xff"))


@st.composite
def blocks(draw: st.DrawFn) -> bytes:
    """A sample with a few bytes deleted, inserted or replaced, or random bytes."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=80))
    data = bytearray(draw(st.sampled_from(_SAMPLES)))
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["delete", "insert", "replace", "digit"]))
        if action == "delete" and data:
            del data[max(i - 1, 0)]
        elif action == "insert":
            data.insert(i, draw(_NOISE))
        elif action == "replace" and i < len(data):
            data[i] = draw(_NOISE)
        elif action == "digit":  # push a number past the int64 range, or keep it inside
            data.insert(i, ord(str(draw(st.integers(0, 9)))))
    return bytes(data)


def _exact(block: bytes, arity: int) -> list[tuple[int, ...]] | InputError:
    try:
        columns = _text_exact(block, 1, arity, "e.txt")
    except InputError as error:
        return error
    return list(zip(*(c.to_pylist() for c in columns), strict=True))


@settings(max_examples=400, deadline=None)
@given(block=blocks(), arity=st.integers(1, 3))
def test_the_compiled_reader_takes_only_what_the_exact_rules_read_alike(
    block: bytes, arity: int
) -> None:
    block = _normalize(block)  # as `_Lines` hands blocks over: lone returns end lines
    fast = _text_fast(block, arity)
    exact = _exact(block, arity)
    if fast is not None:
        assert not isinstance(exact, InputError), (block, exact)
        assert list(zip(*(c.to_pylist() for c in fast), strict=True)) == exact


def test_edges_of_the_range_and_signs() -> None:
    block = b"9223372036854775807 -9223372036854775808\n+0 -0\n# x y z\n \t\r\n"
    fast = _text_fast(block, 2)
    assert fast is not None
    assert [c.to_pylist() for c in fast] == [[2**63 - 1, 0], [-(2**63), 0]]
    for bad in (b"9223372036854775808 1\n", b"1 -9223372036854775809\n", b"1 2 3\n", b"1\n"):
        assert _text_fast(bad, 2) is None
        assert isinstance(_exact(bad, 2), InputError)


def test_line_ends() -> None:
    assert native.newlines(b"a\nb\r\n\n") == 3
    assert not native.lone_returns(b"1 2\r\n3 4\r\n")
    assert native.lone_returns(b"1 2\r3 4\n") and native.lone_returns(b"1 2\r")


def _edges(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-(10**12), 10**12, size=(n, 2))


def test_a_gzip_file_read_ahead_gives_the_rows_read_at_once(tmp_path: Path) -> None:
    edges = _edges(3 * _AHEAD_BYTES // 20)  # a few blocks of the read-ahead
    text = "# comment\r\n" + "".join(f"{a}\t{b}\r\n" for a, b in edges)
    path = tmp_path / "e.txt.gz"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=1))
    batches = list(read_local_batches(str(path), 2, "edge"))
    assert len(batches) > 1
    got = np.column_stack(
        [np.concatenate([b.column(j).to_numpy() for b in batches]) for j in range(2)]
    )
    assert np.array_equal(got, edges)
    assert read_local(str(path), 2, "edge").num_rows == len(edges)


def test_a_damaged_gzip_file_read_ahead_is_refused(tmp_path: Path) -> None:
    text = "".join(f"{a} {b}\n" for a, b in _edges(400_000)).encode()
    whole = gzip.compress(text, compresslevel=1)
    path = tmp_path / "e.txt.gz"
    path.write_bytes(whole[: len(whole) // 2])  # truncated
    with pytest.raises(InputError, match="ends early"):
        list(read_local_batches(str(path), 2, "edge"))
    bad = bytearray(whole)
    bad[len(bad) // 2 : len(bad) // 2 + 64] = b"\x00" * 64
    path.write_bytes(bytes(bad))
    # refused by the inflating (a damaged stream) or by the lines it made, whichever comes first
    with pytest.raises(InputError, match=r"e\.txt\.gz"):
        list(read_local_batches(str(path), 2, "edge"))


@pytest.mark.parametrize("content", [b"1 2\n", b"1 2\n2 3\n3 1\n4 5\n"])
def test_a_file_named_gz_that_is_not_gzip_is_refused_as_such(tmp_path: Path, content) -> None:
    """Shorter than a gzip header or not: "not a gzip file" (as `gzip` says), not truncated."""
    path = tmp_path / "e.txt.gz"
    path.write_bytes(content)
    with pytest.raises(InputError, match="not a gzip file"):
        list(read_local_batches(str(path), 2, "edge"))
    with pytest.raises(InputError, match="not a gzip file"):
        read_local(str(path), 2, "edge")
