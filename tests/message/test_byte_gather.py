"""The segmented copy (byte_gather.interleave) against b"".join, piece for piece."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.message.byte_gather import (
    Pieces,
    decimal_list,
    fixed_width,
    gather_items,
    interleave,
    interleave_rows,
)


def _expected(columns):
    lists = [c.to_list() for c in columns]
    return b"".join(b for row in zip(*lists, strict=True) for b in row)


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
        cols.append(
            Pieces(
                bufs,
                np.asarray(offs, dtype=np.int64),
                np.asarray(lens, dtype=np.int64),
                np.asarray(idx, dtype=np.int64) if nbuf > 1 else 0,
            )
        )
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
    assert got == b"".join(
        bytes(range(4 * i, 4 * i + 4)) + items[i] + b"\x00\x01" for i in range(6)
    )
    assert body.take(2, 4).to_list() == items[2:4]
    wide = Pieces.fixed(np.asarray([258, 3], dtype=">u2"), 2, 2)  # offsets are in bytes
    assert wide.to_list() == [b"\x01\x02", b"\x00\x03"]
    assert bytes(interleave([wide])) == b"\x01\x02\x00\x03"


@st.composite
def fixed_columns(draw):
    """Columns whose pieces each have one width: consecutive (a joined list, a
    matrix), evenly spaced (a field of records of one size), scattered in one
    buffer, or spread over several."""
    n = draw(st.integers(1, 40))
    cols = []
    for _ in range(draw(st.integers(1, 4))):
        w = draw(st.integers(0, 20))
        kind = draw(st.sampled_from(["consecutive", "evenly", "scattered", "buffers"]))
        if kind in ("consecutive", "evenly"):
            lead = draw(st.integers(0, 5))
            step = w if kind == "consecutive" else draw(st.integers(1, 30))
            end = lead + (n - 1) * step + w
            data = draw(st.binary(min_size=end, max_size=end + 5))
            cols.append(
                Pieces(
                    [data],
                    lead + np.arange(n, dtype=np.int64) * step,
                    np.full(n, w, dtype=np.int64),
                )
            )
            continue
        nbuf = 1 if kind == "scattered" else draw(st.integers(2, 3))
        bufs = [draw(st.binary(min_size=w, max_size=w + 60)) for _ in range(nbuf)]
        idx = [draw(st.integers(0, nbuf - 1)) for _ in range(n)]
        offs = [draw(st.integers(0, len(bufs[b]) - w)) for b in idx]
        cols.append(
            Pieces(
                bufs,
                np.asarray(offs, dtype=np.int64),
                np.full(n, w, dtype=np.int64),
                np.asarray(idx, dtype=np.int64) if nbuf > 1 else 0,
            )
        )
    return cols


@settings(max_examples=300, deadline=None)
@given(fixed_columns())
def test_interleave_rows_is_the_join_of_the_pieces(cols):
    widths = [fixed_width(c) for c in cols]
    assert None not in widths
    out = np.full(len(cols[0]) * sum(widths), 0xEE, dtype=np.uint8)
    interleave_rows(cols, widths, out)
    assert out.tobytes() == _expected(cols)


def test_fixed_width_and_a_piece_outside_its_buffer():
    assert fixed_width(Pieces.of_list([b"ab", b"cd"])) == 2
    assert fixed_width(Pieces.of_list([b"ab", b"c"])) is None
    out = np.zeros(4, dtype=np.uint8)
    with pytest.raises(ValueError, match="outside"):
        interleave_rows([Pieces([b"abc"], np.asarray([0, 2]), np.asarray([2, 2]))], [2], out)
    with pytest.raises(ValueError, match="outside"):
        interleave_rows([Pieces([b"abc"], np.asarray([2, 0]), np.asarray([2, 2]))], [2], out)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_gather_items_is_the_slices_at_the_offsets(data):
    """Evenly spaced offsets take the strided view, others the indexed gather: the
    same items either way."""
    w = data.draw(st.integers(1, 12))
    n = data.draw(st.integers(1, 30))
    if data.draw(st.booleans()):
        first = data.draw(st.integers(0, 10))
        step = data.draw(st.integers(1, 25))
        offsets = first + np.arange(n, dtype=np.int64) * step
        size = int(offsets[-1]) + w + data.draw(st.integers(0, 5))
    else:
        size = data.draw(st.integers(w, 200))
        offsets = np.asarray(
            data.draw(st.lists(st.integers(0, size - w), min_size=n, max_size=n)), dtype=np.int64
        )
    raw = data.draw(st.binary(min_size=size, max_size=size))
    buf = np.frombuffer(raw, dtype=np.uint8)
    got = gather_items(buf, offsets, np.dtype((np.void, w)))
    assert [bytes(x) for x in got] == [raw[o : o + w] for o in offsets.tolist()]
    got[0] = b"\xff" * w  # a copy, not a view of the buffer
    assert buf.tobytes() == raw


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1) | st.integers(0, 10**6), max_size=40), st.booleans())
def test_decimal_list_is_the_joined_decimal_text(values, ordered):
    """Any mix of digit counts, sorted (a commit's offsets) or not."""
    if ordered:
        values = sorted(values)
    arr = np.asarray(values, dtype=np.int64)
    assert decimal_list(arr) == ",".join(map(str, values)).encode()
    assert decimal_list(arr, b";") == ";".join(map(str, values)).encode()


def test_decimal_list_takes_negative_values_through_python():
    assert decimal_list(np.asarray([5, -12, 0], dtype=np.int64)) == b"5,-12,0"
