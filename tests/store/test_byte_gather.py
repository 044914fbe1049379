"""The segmented copy (byte_gather.interleave) against b"".join, piece for piece."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.store.byte_gather import Pieces, interleave


def _expected(columns):
    lists = [c.to_list() for c in columns]
    return b"".join(b for row in zip(*lists) for b in row)


@st.composite
def columns(draw):
    n = draw(st.integers(1, 40))
    k = draw(st.integers(1, 4))
    cols = []
    for _ in range(k):
        nbuf = draw(st.integers(1, 3))
        bufs = [draw(st.binary(min_size=0, max_size=200)) for _ in range(nbuf)]
        idx, offs, lens = [], [], []
        for _ in range(n):
            b = draw(st.integers(0, nbuf - 1))
            size = len(bufs[b])
            o = draw(st.integers(0, size))
            ln = draw(st.integers(0, size - o))
            idx.append(b), offs.append(o), lens.append(ln)
        cols.append(Pieces(bufs, np.asarray(offs, dtype=np.int64),
                           np.asarray(lens, dtype=np.int64),
                           np.asarray(idx, dtype=np.int64) if nbuf > 1 else 0))
    return cols


@settings(max_examples=300, deadline=None)
@given(columns())
def test_interleave_is_the_join_of_the_pieces(cols):
    assert bytes(interleave(cols)) == _expected(cols)


def test_constructors_and_around_the_inline_size():
    items = [b"x" * n for n in (0, 1, 11, 12, 13, 100)]
    body = Pieces.of_list(items)
    head = Pieces.fixed(bytes(range(6 * 4)), 4, 6)
    sep = Pieces.repeated(b"\x00\x01", 6)
    got = bytes(interleave([head, body, sep]))
    assert got == b"".join(bytes(range(4 * i, 4 * i + 4)) + items[i] + b"\x00\x01"
                           for i in range(6))
    assert body.take(2, 4).to_list() == items[2:4]
    wide = Pieces.fixed(np.asarray([258, 3], dtype=">u2"), 2, 2)  # offsets are in bytes
    assert wide.to_list() == [b"\x01\x02", b"\x00\x03"]
    assert bytes(interleave([wide])) == b"\x01\x02\x00\x03"
