"""Java's String.hashCode(): one string, and the vectorised helpers that must agree with it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.message.java_hash import (
    hex_suffixed_hash,
    java_hash_hex_suffixed,
    java_hash_many,
    java_hash_rows,
    java_string_hash,
    tags_code,
)

# Values printed by a JVM (javac + java 17): String.hashCode().
JAVA_HASHES = {
    "TagA": 2598919,
    "TagB": 2598920,
    "created": 1028554472,
    "标签": 857175,
    "\U0001f600tag": 1276941143,  # a surrogate pair counts as two UTF-16 units
    "polygenelubricants": -2147483648,
    "订单已支付": -688090072,
    "": 0,
}


@pytest.mark.parametrize("text,expected", sorted(JAVA_HASHES.items()))
def test_java_string_hash_matches_the_jvm(text, expected):
    assert java_string_hash(text) == expected


def test_tags_code_is_sign_extended_hash_and_zero_without_tags():
    assert tags_code("订单已支付") == -688090072
    assert tags_code(None) == 0
    assert tags_code("") == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(),
            st.text(alphabet=st.characters(max_codepoint=127)),
            st.sampled_from(["polygenelubricants", "", "TopicA#k1"]),
        ),
        max_size=40,
    )
)
def test_java_hash_many_equals_java_string_hash(strings):
    got = java_hash_many(strings)
    assert got.dtype == np.int32
    assert got.tolist() == [java_string_hash(s) for s in strings]


def test_java_hash_many_long_and_surrogate_strings():
    strings = ["x" * 5000, "\ud800", "a\U0001f600b", "y" * 300, ""]
    assert java_hash_many(strings).tolist() == [java_string_hash(s) for s in strings]


@settings(deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(max_codepoint=127), max_size=6), min_size=1, max_size=20
    ),
    st.integers(0, 40),
    st.data(),
)
def test_java_hash_rows_carries_each_prefix_hash_over_its_row(prefixes, length, data):
    rows = [
        data.draw(
            st.text(
                alphabet=st.characters(min_codepoint=32, max_codepoint=126),
                min_size=length,
                max_size=length,
            )
        )
        for _ in prefixes
    ]
    seeds = np.asarray([java_string_hash(p) & 0xFFFFFFFF for p in prefixes], dtype=np.uint32)
    chars = np.frombuffer("".join(rows).encode(), dtype=np.uint8).reshape(len(rows), length)
    got = java_hash_rows(seeds, chars)
    assert got.view(np.int32).tolist() == [
        java_string_hash(p + r) for p, r in zip(prefixes, rows, strict=True)
    ]


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(min_size=0, max_size=40),
    counters=st.lists(st.integers(0, 200_000), min_size=1, max_size=20),
)
def test_hex_suffixed_hash_equals_hash_of_the_whole_string(prefix, counters):
    got = java_hash_hex_suffixed(prefix, np.asarray(counters))
    want = java_hash_many([f"{prefix}{c & 0xFFFF:04X}" for c in counters])
    assert got.tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(prefix=st.text(min_size=0, max_size=40), counter=st.integers(0, 1 << 20))
def test_scalar_hex_suffixed_hash(prefix, counter):
    assert hex_suffixed_hash(java_string_hash(prefix), counter) == java_string_hash(
        f"{prefix}{counter & 0xFFFF:04X}"
    )
