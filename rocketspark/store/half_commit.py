r"""Committing half messages by gathering bytes: the half record becomes the committed one.

A half written by either prepare path (``MessageStore.prepare_columns`` or
``TransactionService.prepare``) has properties that end::

    ... UNIQ_KEY\x01<32 hex> \x02PGROUP\x01<group> \x02__transactionId__\x01<the same 32 hex>
    [\x02<extra properties>]
    \x02TRAN_MSG\x01true \x02REAL_TOPIC\x01<topic> \x02REAL_QID\x01<digits> \x02

and its committed record keeps the properties before TRAN_MSG, the body, and
the header's BODYCRC, FLAG, BORNTIMESTAMP, BORNHOST and RECONSUMETIMES; it gets
the real topic and queue, SYSFLAG TRANSACTION_COMMIT and PREPARED TRANSACTION
OFFSET = the half's offset. :func:`final_columns` finds those pieces in numpy and
hands the append a ColumnBatch of slices of the mapped segments: no half is
decoded and re-encoded. Anything else (v2 records, IPv6 hosts, compressed
bodies, halves written by another producer) returns None, and the caller
commits record by record.

Hot path (a sink's commit of a whole batch): vectorised with numpy, a block of
rows at a time, with one record parsed per layout rather than per half.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from rocketspark.message.byte_gather import Pieces, byte_rows, gather_items
from rocketspark.message.java_hash import java_hash_many, java_hash_rows, java_string_hash
from rocketspark.message.model import (
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_TYPE_MASK,
    SysFlag,
)
from rocketspark.message.properties import (
    HALF_COMMIT_MARKER,
    PRODUCER_GROUP_PREFIX_BYTES,
    PROPERTY_BYTE,
    REAL_QUEUE_ID_SEPARATOR,
    TRANSACTION_ID_PREFIX_BYTES,
    UNIQ_KEY_PREFIX_BYTES,
    decode_properties,
)
from rocketspark.message.record import HEADER_V4, HEADER_V4_DTYPE, MESSAGE_MAGIC_CODE
from rocketspark.store.commit_log import ColumnBatch

if TYPE_CHECKING:
    from rocketspark.message.record import HostAddress
    from rocketspark.store.commit_log import CommitLog
    from rocketspark.store.encoder import TopicWriteInfo

__all__ = ["UNIQ_HEX_LEN", "final_columns"]

# The byte templates of a half's properties, from message/properties.py.
_SEP = PROPERTY_SEPARATOR.encode("ascii")  # ends each property (PROPERTY_BYTE)
_GROUP_HEAD = _SEP + PRODUCER_GROUP_PREFIX_BYTES  # the property before the transaction id
UNIQ_HEX_LEN = 32  # the UNIQ_KEYs we (and RocketMQ's clients) generate
_ROWS = 16384  # rows per block of a 2-D byte comparison
_REGION_GAP = 1 << 20
_MAX_VIEW = (1 << 31) - 1  # segments up to this size are gathered from in place
# Halves the gathering takes: v1 records (IPv4 hosts) with uncompressed bodies.
_NOT_GATHERED = int(SysFlag.COMPRESSED | SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
_COMMIT = int(SysFlag.TRANSACTION_COMMIT)


def final_columns(
    entries: np.ndarray,
    commit_log: CommitLog,
    topic_info: Callable[[str], TopicWriteInfo],
    born_host: HostAddress,
) -> tuple[Any, ...] | None:
    """The committed records of halves, as a ColumnBatch (None: not our layout).

    ``entries`` are the halves' ConsumeQueue entries, ascending; ``topic_info``
    gives a real topic's TopicWriteInfo (its TOPIC field and magic) and ``born_host``
    is this process's host, the committed records' BORNHOST.

    A half whose properties end with TRAN_MSG, REAL_TOPIC, REAL_QID (as both
    prepare paths write them) commits to a record whose properties are the
    prefix before them: its bytes are gathered from the half's (byte_gather),
    never decoded and re-encoded. Returns (batch, uniq prefix, uniq start,
    UNIQ_KEYs by record, keyed records, their KEYS, index hashes of UNIQ_KEY).
    """
    n = len(entries)
    phys = entries["offset"].astype(np.int64)
    seg_idx = phys // commit_log.segment_size
    # Each run of halves in one segment, without a gap over 1 MiB between them, is
    # copied out as one region (halves far apart are not copied with all between).
    gaps = phys[1:] - (phys[:-1] + entries["size"][:-1].astype(np.int64))
    cuts = np.flatnonzero((np.diff(seg_idx) != 0) | (gaps > _REGION_GAP)) + 1
    bounds = [0, *cuts.tolist(), n]
    parts = []
    for k, (a, b) in enumerate(pairwise(bounds)):
        f = commit_log.segment(int(phys[a]))
        rel = phys[a:b] - f.start_offset
        if f.size <= _MAX_VIEW:
            # The mapped segment itself (no copy of the region: a fresh 130 MB copy
            # costs ~0.3 s in page faults here). Views are gone when the commit returns;
            # a segment closed meanwhile is unmapped when they go (MappedFile.close).
            src: Any = f.mm
        else:  # byte_gather's views reach 2 GiB: copy the region out
            lo = int(rel.min())
            src = f.mm[lo : int((rel + entries["size"][a:b]).max())]
            rel = rel - lo
        part = _parse_halves(src, rel, k, a, entries["size"][a:b].astype(np.int64))
        if part is None:
            return None  # v2 records, IPv6 hosts, compressed or foreign halves
        parts.append(part)
    cat: dict[str, Any] = {}
    for key, first in parts[0].items():
        if isinstance(first, np.ndarray):
            cat[key] = first if len(parts) == 1 else np.concatenate([p[key] for p in parts])
        elif isinstance(first, list):
            cat[key] = [x for p in parts for x in p[key]]
        elif isinstance(first, dict):
            cat[key] = {i: v for p in parts for i, v in p[key].items()}
    srcs = [p["src"] for p in parts]
    topic_ids: dict[str, int] = {}
    tid_parts = []
    for p in parts:
        remap = np.asarray(
            [topic_ids.setdefault(t, len(topic_ids)) for t in p["topic_names"]], dtype=np.int64
        )
        tid_parts.append(remap[p["topic"]])
    names = list(topic_ids)
    tid = tid_parts[0] if len(tid_parts) == 1 else np.concatenate(tid_parts)
    infos = [topic_info(t) for t in names]
    hdr = cat["hdr"]
    seg = cat["seg"]
    plen = cat["prefix_len"]
    rests = (
        Pieces(
            [i.topic_field for i in infos],
            np.zeros(n, dtype=np.int64),
            np.asarray([len(i.topic_field) for i in infos], dtype=np.int64)[tid],
            tid if len(infos) > 1 else 0,
        ),
        Pieces.fixed(plen.astype(">u2"), 2, n),
        Pieces(srcs, cat["props_start"], plen, seg if len(srcs) > 1 else 0),
    )
    bodies = Pieces(
        srcs, cat["body_start"], hdr["body_len"].astype(np.int64), seg if len(srcs) > 1 else 0
    )
    topics: list[str] | str = names[0] if len(names) == 1 else [names[t] for t in tid.tolist()]
    magics = (
        infos[0].magic
        if len(infos) == 1
        else np.asarray([i.magic for i in infos], dtype=np.int32)[tid]
    )
    batch = ColumnBatch(
        topics=topics,
        queue_ids=cat["qid"].astype(np.int32),
        bodies=bodies,
        rests=rests,
        crcs=hdr["crc"].astype(np.int64),
        magics=magics,
        tags_codes=entries["tags"].astype(np.int64),
        born_host=born_host,
        born_ts=hdr["born_ts"].astype(np.int64),
        flags=hdr["flag"].astype(np.int64),
        reconsume=hdr["reconsume"].astype(np.int64),
        sys_flags=(hdr["sys_flag"].astype(np.int64) & ~TRANSACTION_TYPE_MASK) | _COMMIT,
        prepared=phys,
        born_ips=hdr["born_ip"].astype(np.int64),
        born_ports=hdr["born_port"].astype(np.int64),
    )
    # UNIQ_KEY hashes (topic#UNIQ_KEY) for the index: hashCode of "topic#" carried on
    # over the 32 ASCII characters of the key, in uint32 (Java's int overflow).
    uniq = cat["uniq"]
    fast = cat["uniq_ok"]
    topic_hash = np.asarray(
        [java_string_hash(t + "#") & 0xFFFFFFFF for t in names], dtype=np.uint32
    )
    hashes = java_hash_rows(topic_hash[tid], uniq)
    slow = np.flatnonzero(~fast)
    if len(slow):
        hashes[slow] = java_hash_many(
            [f"{names[int(tid[i])]}#{cat['uniq_text'][int(i)]}" for i in slow]
        ).view(np.uint32)
    uniq_given = _UniqAt(uniq, fast, cat["uniq_text"])
    keyed = cat["keyed"]
    key_strings = cat["key_strings"]
    return batch, "", 0, uniq_given, keyed, key_strings, hashes.view(np.int32)


def _rows_equal(
    buf: np.ndarray, at: np.ndarray, template: bytes, mask: np.ndarray | None = None
) -> np.ndarray:
    """Per row: do the bytes at ``at`` equal ``template`` (where ``mask`` is True)?"""
    width = len(template)
    t = np.frombuffer(template, dtype=np.uint8)
    out = np.zeros(len(at), dtype=bool)
    if len(buf) < width:
        return out
    inside = (at >= 0) & (at + width <= len(buf))
    safe = np.where(inside, at, 0)
    win = byte_rows(buf, width)
    for c in range(0, len(at), _ROWS):
        block = win[safe[c : c + _ROWS]] == t
        if mask is not None:
            block |= ~mask
        out[c : c + _ROWS] = block.all(axis=1)
    return out & inside


def _differs_rows(rows: np.ndarray, other: np.ndarray) -> bool:
    """Does any row of the 2-D byte array ``rows`` differ from ``other``'s (one row: from it)?

    Compared a block of rows at a time (numpy compares uint8 rows 3-6x faster
    than raw void items of 10-70 bytes, which it takes one by one).
    """
    for c in range(0, len(rows), _ROWS):
        part = other if len(other) == 1 else other[c : c + _ROWS]
        if bool((rows[c : c + _ROWS] != part).any()):
            return True
    return False


def _learn_uniq_template(p: bytes) -> tuple[bytes, np.ndarray, int, int] | None:
    """From one committed prefix, the fixed tail our prepare paths give every half.

    ``UNIQ_KEY=<32>`` ``PGROUP=<group>`` ``__transactionId__=<same 32>`` then the
    caller's extra properties, up to the end of the prefix. Returns (template,
    mask of its fixed bytes, position of each 32-character slot), or None.
    """
    txn_head = _SEP + TRANSACTION_ID_PREFIX_BYTES
    j = p.rfind(txn_head)
    if j < 0:
        return None
    u_end = j + len(txn_head) + UNIQ_HEX_LEN
    uniq = p[j + len(txn_head) : u_end]
    if len(uniq) != UNIQ_HEX_LEN or p[u_end : u_end + len(_SEP)] != _SEP or _SEP in uniq:
        return None
    extra = p[u_end + len(_SEP) :]
    k = p.rfind(_GROUP_HEAD, 0, j)
    if k < 0:
        return None
    group = p[k + len(_GROUP_HEAD) : j]
    uniq_head = UNIQ_KEY_PREFIX_BYTES
    if _SEP in group or p[k - UNIQ_HEX_LEN - len(uniq_head) : k] != uniq_head + uniq:
        return None
    slot = b"\x00" * UNIQ_HEX_LEN
    template = b"".join((uniq_head, slot, _GROUP_HEAD, group, txn_head, slot, _SEP, extra))
    first = len(uniq_head)
    second = first + UNIQ_HEX_LEN + len(_GROUP_HEAD) + len(group) + len(txn_head)
    mask = np.ones(len(template), dtype=bool)
    mask[first : first + UNIQ_HEX_LEN] = False
    mask[second : second + UNIQ_HEX_LEN] = False
    return template, mask, first, second


def _parse_halves(
    src: bytes, rel: np.ndarray, seg_no: int, base: int, sizes: np.ndarray
) -> dict[str, Any] | None:
    """Where each half's committed record comes from (None: not our layout).

    Halves of a few layouts (a sink's batch) are checked and read layout by
    layout (:func:`_parse_layouts`); anything else half by half
    (:func:`_parse_each`).
    """
    parsed = _parse_layouts(src, rel, seg_no, base, sizes)
    if parsed is None:
        parsed = _parse_each(src, rel, seg_no, base)
        if parsed is not None:
            del parsed["head_end"], parsed["qid_digits"]  # the layout parser's own
    return parsed


_MAX_LAYOUTS = 16  # record sizes in one region the layout parser takes on


def _parse_layouts(
    src: bytes, rel: np.ndarray, seg_no: int, base: int, sizes: np.ndarray
) -> dict[str, Any] | None:
    """:func:`_parse_each`'s result for halves of a few layouts, one per record size; or None.

    A sink's halves come from a few prepare calls, each writing one layout:
    the same properties but the UNIQ_KEY, the transaction id (the same 32
    characters) and the REAL_QID digits, whose count makes the sizes differ.
    The first half of each size is parsed by :func:`_parse_each`, which gives
    the layout; every other half of that size must have the same BODYLENGTH
    and, after the body, the same bytes but in those slots: compared as one
    raw item a half per byte range (a memcmp each). Then its UNIQ_KEY and
    REAL_QID are read from the slots. Any half that does not hold sends the
    region to :func:`_parse_each`.
    """
    m = len(rel)
    if m < 2 or len(sizes) != m:
        return None
    buf = np.frombuffer(src, dtype=np.uint8)
    if int(rel.min()) < 0 or int((rel + sizes).max()) > len(buf):
        return None
    kinds, which = np.unique(sizes, return_inverse=True)
    if len(kinds) > _MAX_LAYOUTS:
        return None
    hdr = gather_items(buf, rel, HEADER_V4_DTYPE)
    if (
        np.any(hdr["magic"] != MESSAGE_MAGIC_CODE)
        or np.any(hdr["sys_flag"] & _NOT_GATHERED)
        or np.any(hdr["total"] != sizes)
    ):
        return None  # the slots are found from each record's end: TOTALSIZE must agree
    body_len = hdr["body_len"].astype(np.int64)
    qid = np.empty(m, dtype=np.int64)
    uniq = np.empty((m, UNIQ_HEX_LEN), dtype=np.uint8)
    topic = np.empty(m, dtype=np.int64)
    prefix_len = np.empty(m, dtype=np.int64)
    props_start = np.empty(m, dtype=np.int64)
    names: list[str] = []
    keyed = np.zeros(m, dtype=bool)
    key_of: list[str] = [""] * len(kinds)
    for g in range(len(kinds)):
        rows = np.flatnonzero(which == g) if len(kinds) > 1 else np.arange(m)
        i0 = int(rows[0])
        first = _parse_each(src, rel[i0 : i0 + 1], seg_no, base + i0)
        if first is None or not first["uniq_ok"][0]:
            return None
        r0, size = int(rel[i0]), int(kinds[g])
        body_end = HEADER_V4.size + int(body_len[i0])
        lead = int(first["props_start"][0] + first["prefix_len"][0]) - r0
        head_end = int(first["head_end"][0]) - r0
        learned = _learn_uniq_template(src[int(first["props_start"][0]) : r0 + lead])
        if learned is None:
            return None
        template, _mask, u_first, u_second = learned
        if head_end != lead - len(template):
            return None
        digits = int(first["qid_digits"][0])
        u1, u2 = head_end + u_first, head_end + u_second
        q1 = size - 1 - digits
        slots = sorted([(u1, u1 + UNIQ_HEX_LEN), (u2, u2 + UNIQ_HEX_LEN), (q1, q1 + digits)])
        if slots[0][0] < body_end or slots[-1][1] > size:
            return None
        if bool((body_len[rows] != body_len[i0]).any()):
            return None
        at_rows = rel[rows]
        at = body_end
        for lo, hi in [*slots, (size, size)]:
            if lo < at:
                return None  # overlapping slots: not the layout we write
            at = hi
        u1, u2, q1 = u1 - body_end, u2 - body_end, q1 - body_end
        width = size - body_end
        scale = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
        like = None
        for c in range(0, len(rows), _ROWS):
            # Every byte after the body, a block of halves at a time: one pass over
            # them (a gather per byte range was a pass each), into a block that
            # stays in cache (a whole-batch copy costs its page faults).
            tail = gather_items(buf, at_rows[c : c + _ROWS] + body_end, np.dtype((np.void, width)))
            tail = tail.view(np.uint8).reshape(-1, width)
            block = tail[:, u1 : u1 + UNIQ_HEX_LEN]
            if _differs_rows(block, tail[:, u2 : u2 + UNIQ_HEX_LEN]) or bool(
                ((block >= 128) | (block == PROPERTY_BYTE)).any()
            ):
                return None
            qd = tail[:, q1 : q1 + digits].astype(np.int64) - 48
            if bool(((qd < 0) | (qd > 9)).any()):
                return None
            part = rows[c : c + _ROWS]
            qid[part] = qd @ scale
            uniq[part] = block
            for lo in (u1, u2, q1):  # every byte but the slots: as in the first half
                tail[:, lo : lo + (digits if lo == q1 else UNIQ_HEX_LEN)] = 0
            if like is None:
                like = tail[:1].copy()
            if _differs_rows(tail, like):
                return None
        name = first["topic_names"][0]
        if name not in names:
            names.append(name)
        topic[rows] = names.index(name)
        prefix_len[rows] = first["prefix_len"][0]
        props_start[rows] = at_rows + (int(first["props_start"][0]) - r0)
        if first["keyed"]:
            keyed[rows] = True
            key_of[g] = first["key_strings"][0]
    hits = np.flatnonzero(keyed)
    return {
        "src": src,
        "hdr": hdr,
        "seg": np.full(m, seg_no, dtype=np.int64),
        "body_start": rel + HEADER_V4.size,
        "props_start": props_start,
        "prefix_len": prefix_len,
        "qid": qid,
        "topic": topic,
        "topic_names": names,
        "uniq": uniq,
        "uniq_ok": np.ones(m, dtype=bool),
        "uniq_text": {},
        "keyed": (hits + base).tolist(),
        "key_strings": [key_of[g] for g in which[hits].tolist()],
    }


def _parse_each(src: bytes, rel: np.ndarray, seg_no: int, base: int) -> dict[str, Any] | None:
    """Find, in numpy, where each half's committed record comes from (None: not ours).

    ``src`` holds the halves' bytes, ``rel`` their offsets in it. Per half:
    the body, the properties prefix to keep (everything before TRAN_MSG),
    REAL_TOPIC and REAL_QID, and its 32-character UNIQ_KEY when it sits in
    the fixed tail both prepare paths write. Only halves with KEYS (or an
    unusual layout) are looked at one by one.
    """
    buf = np.frombuffer(src, dtype=np.uint8)
    m = len(rel)
    header = HEADER_V4.size
    hdr = gather_items(buf, rel, HEADER_V4_DTYPE)
    if np.any(hdr["magic"] != MESSAGE_MAGIC_CODE) or np.any(hdr["sys_flag"] & _NOT_GATHERED):
        return None  # v2 records, IPv6 hosts or compressed bodies: the record path
    body_start = rel + header
    body_end = body_start + hdr["body_len"].astype(np.int64)
    if np.any(body_end + 3 > len(buf)):
        return None
    plen_at = body_end + 1 + buf[body_end].astype(np.int64)
    props_start = plen_at + 2
    props_end = props_start + ((buf[plen_at].astype(np.int64) << 8) | buf[plen_at + 1])
    if np.any(props_end > len(buf)) or np.any(props_end <= props_start):
        return None
    last = props_end - 1
    if np.any(buf[last] != PROPERTY_BYTE):
        return None
    # REAL_QID: the digits before the last \x02, read backwards.
    digits = np.zeros(m, dtype=np.int64)
    qid = np.zeros(m, dtype=np.int64)
    going = np.ones(m, dtype=bool)
    scale = 1
    for j in range(1, 7):
        at = last - j
        c = buf[np.maximum(at, 0)].astype(np.int64)
        dig = going & (at >= props_start) & (c >= 48) & (c <= 57)
        qid += np.where(dig, (c - 48) * scale, 0)
        digits += dig
        going = dig
        scale *= 10
    if np.any(digits == 0) or np.any(going):
        return None
    topic_end = last - digits - len(REAL_QUEUE_ID_SEPARATOR)
    if not _rows_equal(buf, topic_end, REAL_QUEUE_ID_SEPARATOR).all():
        return None
    # REAL_TOPIC: learn each distinct topic from its first half, compare the rest.
    topic = np.full(m, -1, dtype=np.int64)
    lead = np.zeros(m, dtype=np.int64)
    names: list[str] = []
    todo = np.arange(m)
    while len(todo):
        i0 = int(todo[0])
        cut = src.rfind(HALF_COMMIT_MARKER, int(props_start[i0]), int(topic_end[i0]))
        if cut < 0:
            return None
        real = src[cut + len(HALF_COMMIT_MARKER) : int(topic_end[i0])]
        template = HALF_COMMIT_MARKER + real
        at = topic_end[todo] - len(template)
        ok = (at >= props_start[todo]) & _rows_equal(buf, at, template)
        if not ok[0]:
            return None
        try:
            names.append(real.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        topic[todo[ok]] = len(names) - 1
        lead[todo[ok]] = at[ok]
        todo = todo[~ok]
    prefix_len = lead - props_start
    if np.any((prefix_len > 0) & (buf[np.maximum(lead - 1, 0)] != PROPERTY_BYTE)):
        return None  # the prefix would not end on a whole property
    # UNIQ_KEY: the fixed tail of the prefix, learned from one half and compared.
    uniq = np.zeros((m, UNIQ_HEX_LEN), dtype=np.uint8)
    uniq_ok = np.zeros(m, dtype=bool)
    head_end = lead.copy()  # where the properties before UNIQ_KEY end
    todo = np.arange(m)
    tries = 0
    while len(todo) and tries < 8:
        tries += 1
        i0 = int(todo[0])
        learned = _learn_uniq_template(src[int(props_start[i0]) : int(lead[i0])])
        if learned is None:
            todo = todo[1:]
            continue
        template, mask, first, second = learned
        at = lead[todo] - len(template)
        ok = (at >= props_start[todo]) & _rows_equal(buf, at, template, mask)
        ok &= (at == props_start[todo]) | (buf[np.maximum(at - 1, 0)] == PROPERTY_BYTE)
        rows, at = todo[ok], at[ok]
        win = byte_rows(buf, UNIQ_HEX_LEN)
        one = win[at + first]
        good = (
            (one == win[at + second]).all(axis=1)
            & (one < 128).all(axis=1)
            & (one != PROPERTY_BYTE).all(axis=1)
        )
        uniq[rows[good]] = one[good]
        uniq_ok[rows[good]] = True
        head_end[rows[good]] = at[good]
        todo = todo[~uniq_ok[todo]]
        if len(todo) and todo[0] == i0:
            todo = todo[1:]  # its own template failed it: one by one
    # One by one: halves with properties before UNIQ_KEY (user properties, tags,
    # keys) for their KEYS, and halves whose UNIQ_KEY the template did not cover.
    uniq_text: dict[int, str] = {}
    keyed: list[int] = []
    key_strings: list[str] = []
    for i in np.flatnonzero((head_end > props_start) | ~uniq_ok).tolist():
        props = decode_properties(src[int(props_start[i]) : int(head_end[i])])
        if not uniq_ok[i]:
            uniq_text[base + i] = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or ""
        keys = props.get(PROPERTY_KEYS)
        if keys:
            keyed.append(base + i)
            key_strings.append(keys)
    return {
        "src": src,
        "hdr": hdr,
        "seg": np.full(m, seg_no, dtype=np.int64),
        "body_start": body_start,
        "props_start": props_start,
        "prefix_len": prefix_len,
        "qid": qid,
        "topic": topic,
        "topic_names": names,
        "uniq": uniq,
        "uniq_ok": uniq_ok,
        "uniq_text": uniq_text,
        "keyed": keyed,
        "key_strings": key_strings,
        "head_end": head_end,
        "qid_digits": digits,
    }


class _UniqAt:
    """UNIQ_KEY of each committed record, decoded only when a PutResult asks."""

    def __init__(self, uniq: np.ndarray, ok: np.ndarray, text: dict[int, str]):
        self._uniq, self._ok, self._text = uniq, ok, text

    def get(self, i: int, default: str | None = None) -> str | None:
        if self._ok[i]:
            return self._uniq[i].tobytes().decode("ascii")
        return self._text.get(i, default)

    def __bool__(self) -> bool:
        return True
