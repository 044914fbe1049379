"""Java's ``String.hashCode()``, one string at a time and vectorised.

RocketMQ keys its hashes on it: the ConsumeQueue tags code, the IndexFile key
hash (of ``topic#key``) and queue selection by sharding key. Java hashes UTF-16
code units with int overflow: ``h = 31 * h + c`` modulo 2**32, read signed.
The vectorised helpers compute the same in uint32 numpy arrays, whose
wrap-around is Java's overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

__all__ = [
    "hex_suffixed_hash",
    "java_hash_hex_suffixed",
    "java_hash_many",
    "java_hash_rows",
    "java_string_hash",
    "tags_code",
]


@lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Return Java's ``String.hashCode()`` of ``s`` as a signed 32-bit int.

    Java hashes UTF-16 code units, so characters outside the BMP count twice
    (their surrogate pair).
    """
    h = 0
    if s.isascii():
        for ch in s.encode("ascii"):
            h = (31 * h + ch) & 0xFFFFFFFF
    else:
        data = s.encode("utf-16-be", "surrogatepass")
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """Return the ConsumeQueue tags code of ``tags``: its Java hashCode, 0 when absent."""
    if not tags:
        return 0
    return java_string_hash(tags)


def _build_powers_of_31(size: int) -> np.ndarray:
    p = np.full(size, 31, dtype=np.uint32)
    p[0] = 1
    return np.cumprod(p, dtype=np.uint32)  # uint32 wrap-around: 31**k mod 2**32


_POW31 = _build_powers_of_31(256)


def _powers_of_31(n: int) -> np.ndarray:
    """Return at least n weights 31**k mod 2**32, k = 0, 1, ... (grown on demand)."""
    global _POW31
    if len(_POW31) < n:
        _POW31 = _build_powers_of_31(max(n, 2 * len(_POW31)))
    return _POW31


def java_hash_many(strings: Sequence[str]) -> np.ndarray:
    """Return Java ``String.hashCode()`` of each string as an int32 array.

    Equal to :func:`java_string_hash` one by one.
    ASCII strings are hashed with numpy; others fall back to ``java_string_hash``
    (Java hashes UTF-16 code units).
    """
    # Hot path (once per put batch): the ASCII strings are laid end to end in one
    # byte array; each group of one length L is gathered into an (m, L) matrix and
    # hashCode = chars @ [31**(L-1), ..., 31, 1] in uint32, whose wrap-around is
    # Java's int overflow. One loop turn per distinct length, none per string.
    n = len(strings)
    out = np.zeros(n, dtype=np.uint32)
    joined = "".join(strings)
    ascii_at: np.ndarray | None = None
    if joined.isascii():
        ascii_strings: Sequence[str] = strings
    else:
        is_ascii = [s.isascii() for s in strings]
        for i, (s, ok) in enumerate(zip(strings, is_ascii, strict=True)):
            if not ok:
                out[i] = java_string_hash(s) & 0xFFFFFFFF
        ascii_strings = [s for s, ok in zip(strings, is_ascii, strict=True) if ok]
        ascii_at = np.flatnonzero(is_ascii)
        joined = "".join(ascii_strings)
    if joined:
        lengths = np.fromiter(map(len, ascii_strings), dtype=np.int64, count=len(ascii_strings))
        chars = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        starts = np.cumsum(lengths) - lengths
        by_length = np.argsort(lengths, kind="stable")
        group_starts = np.flatnonzero(np.diff(lengths[by_length])) + 1
        weights = _powers_of_31(int(lengths[by_length[-1]]))
        hashes = np.zeros(len(lengths), dtype=np.uint32)
        for group in np.split(by_length, group_starts):
            length = int(lengths[group[0]])
            if length:
                matrix = chars[starts[group, None] + np.arange(length)].astype(np.uint32)
                hashes[group] = matrix @ weights[length - 1 :: -1]
        if ascii_at is None:
            out = hashes
        else:
            out[ascii_at] = hashes
    return out.view(np.int32)


def java_hash_rows(seeds: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """``hashCode`` carried on from each seed (uint32) over its row of ASCII ``chars``.

    ``chars`` is an (m, L) uint8 matrix; returns uint32. The same algebra as
    :func:`java_hash_many`: seed * 31**L + row @ [31**(L-1), ..., 1], in
    uint32, a block of rows at a time (the uint32 copy of a block stays small).
    """
    m, length = chars.shape
    weights = _powers_of_31(max(length, 1))[length - 1 :: -1] if length else None
    out = np.asarray(seeds, dtype=np.uint32) * np.uint32(pow(31, length, 1 << 32))
    if weights is not None:
        for c in range(0, m, 16384):
            out[c : c + 16384] += chars[c : c + 16384].astype(np.uint32) @ weights
    return out


_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8).astype(np.uint32)


_HEX_CODES = tuple(b"0123456789ABCDEF")


def hex_suffixed_hash(prefix_hash: int, counter: int) -> int:
    """Return ``hashCode(prefix + f"{counter:04X}")`` (signed) from the prefix's hashCode."""
    h = prefix_hash & 0xFFFFFFFF
    c = counter & 0xFFFF
    for shift in (12, 8, 4, 0):
        h = (h * 31 + _HEX_CODES[(c >> shift) & 0xF]) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def java_hash_hex_suffixed(prefix: str, counters: np.ndarray) -> np.ndarray:
    """Return ``hashCode(prefix + f"{c:04X}")`` for each 16-bit counter c, as int32.

    The UNIQ_KEYs of one put batch share a 28-character prefix and differ in
    their last four hex digits, so their ``topic#UNIQ_KEY`` hashes are the
    prefix hash times 31**4 plus the hash of the digits: no string is built.
    """
    c = np.asarray(counters, dtype=np.uint32) & 0xFFFF
    h = np.full(len(c), java_string_hash(prefix) & 0xFFFFFFFF, dtype=np.uint32)
    for shift in (12, 8, 4, 0):
        h = h * np.uint32(31) + _HEX_DIGITS[(c >> shift) & 0xF]
    return h.view(np.int32)
