"""The encoder: messages and columns into CommitLog records, before the write lock.

Everything a put can do without the lock runs here: validation, the topic's
write info, queue selection, UNIQ_KEY ids and the bytes of each record but
its position-dependent header fields (queue offset, physical offset, store
time), which the appender fills in under the lock. The columnar paths
(:meth:`Encoder.columns`, :meth:`Encoder._uniform_batch`, and
:meth:`Encoder.serialized` for a served batch send) and the single put
(:meth:`Encoder.one`) are hot paths, written for speed on purpose.

The module is over the ~700 lines the layout aims at because of those two batch
loops (about 270 and 250 lines), kept inline on purpose (STYLE rule 7: bound
locals, no call per row). Property names and separators come from
``message/properties.py``; none is typed into a template here.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocketspark.errors import (
    ConfigError,
    InvalidMessageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
)
from rocketspark.message.byte_gather import Pieces
from rocketspark.message.columns import (
    Columns,
    SerializedRows,
    check_property,
    check_utf8_fields,
    encodes_utf8,
    joined_keys,
    only_empty,
    property_pairs,
)
from rocketspark.message.java_hash import java_string_hash, tags_code
from rocketspark.message.model import (
    FIRST_HALF_ERROR,
    INT64_MAX,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_FIRST_HALF,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RESERVED_PROPERTIES,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    Message,
    SysFlag,
    check_int,
    message_body,
    reserved_property_error,
    transaction_type,
)
from rocketspark.message.names import validate_topic
from rocketspark.message.properties import (
    DELAY_PREFIX,
    HALF_COMMIT_MARKER_TEXT,
    KEYS_PREFIX,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_SEPARATOR_BYTES,
    REAL_QUEUE_ID_SEPARATOR_TEXT,
    TAGS_PREFIX,
    UNIQ_KEY_PREFIX,
    encode_properties,
    half_head_text,
)
from rocketspark.message.record import (
    END_FILE_MIN_BLANK_LENGTH,
    HALF_SIZE_NOTE,
    HEADER_V4,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    SHORT,
    V1_MAX_TOPIC_LENGTH,
    HostAddress,
    UniqueIdGenerator,
    check_sizes,
)
from rocketspark.message.results import SameForEach
from rocketspark.store.commit_log import ColumnBatch, PreparedRecord
from rocketspark.store.config import MessageStoreConfig
from rocketspark.store.topic_config import TopicConfigTable, unknown_topic

# A columnar put encoded: the batch, the UNIQ_KEY prefix and first counter, the rows
# that have their own UNIQ_KEY (row -> key), the rows with keys and their KEYS text.
EncodedColumns = tuple[ColumnBatch, str, int, Mapping[int, str], list[int], list[str]]


@dataclass(frozen=True, slots=True)
class TopicWriteInfo:
    """What the records of one topic need: its write queues and its TOPIC field."""

    write_queues: int
    topic_field: bytes  # TOPICLENGTH (1 byte, or 2 for a v2 record) + TOPIC
    magic: int  # MESSAGE_MAGIC_CODE, or MESSAGE_MAGIC_CODE_V2 for a topic over 127 bytes


class Encoder:
    """Messages and columns into records (PreparedRecord, ColumnBatch) before the lock.

    ``ids`` generates UNIQ_KEYs; ``columnar``: both hosts are IPv4, so the
    columnar paths (one fixed header layout) apply.
    """

    def __init__(
        self,
        *,
        root: str,
        config: MessageStoreConfig,
        topics: TopicConfigTable,
        store_host: HostAddress,
        born_host: HostAddress,
        segment_size: int,
    ):
        self.root = root
        self.config = config
        self.topics = topics
        self.store_host = store_host
        self.born_host = born_host
        self.segment_size = segment_size
        self.ids = UniqueIdGenerator(store_host.ip if not store_host.is_v6 else b"\x7f\x00\x00\x01")
        # The columnar put needs IPv4 hosts (one fixed header layout).
        self.columnar = not (store_host.is_v6 or born_host.is_v6)
        self._delay_ms = config.delay_levels_ms()
        self._round_robin: dict[str, int] = {}
        self._topic_cache: dict[str, TopicWriteInfo] = {}
        self._topic_cache_until = 0.0

    def forget_topics(self) -> None:
        """Read topic configs again at the next put (a topic was created or changed)."""
        self._topic_cache.clear()

    def one(self, msg: Message, now: int) -> tuple[Any, ...]:
        """Encode one message for put()'s fast path (``Append.one`` takes the result).

        The columnar path's bytes without its batch machinery: same property
        order as the row loop of :meth:`columns` (user properties, TAGS, KEYS,
        UNIQ_KEY unless given).
        """
        # Hot path: every single put. Plain ints and struct, no numpy, no batch objects.
        topic = msg.topic
        info = self._write_info(topic)
        write_queues, topic_part, magic = info.write_queues, info.topic_field, info.magic
        queue_id = self._select_queue(msg, write_queues)
        user = msg.properties
        text = (
            "".join([f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in user.items()])
            if user
            else ""
        )
        tags = msg.tags
        if tags:
            text += f"{TAGS_PREFIX}{tags}{PROPERTY_SEPARATOR}"
        keys = msg.keys
        if keys:
            text += f"{KEYS_PREFIX}{' '.join(keys)}{PROPERTY_SEPARATOR}"
        uniq_prefix, counter = self.ids.next_block(1, now)
        own = user.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) if user else None
        if own is None:
            uniq = uniq_prefix + _HEX4[counter & 0xFFFF]
            text += f"{UNIQ_KEY_PREFIX}{uniq}{PROPERTY_SEPARATOR}"
        else:
            uniq = own
        props = text.encode("utf-8")
        body = msg.body
        if len(props) > 32767 or len(body) > self.config.max_message_size:
            check_sizes(topic, len(body), len(props), self.config.max_message_size)
        rest = b"".join((topic_part, len(props).to_bytes(2, "big"), props))
        total = HEADER_V4.size + len(body) + len(rest)
        seg_size = self.segment_size
        if total + END_FILE_MIN_BLANK_LENGTH > seg_size:
            raise MessageTooLargeError(
                f"a record of {total} bytes does not fit in a CommitLog segment of "
                f"{seg_size} bytes (mappedFileSizeCommitLog)"
            )
        crc = zlib.crc32(body) & 0x7FFFFFFF
        return (
            topic,
            queue_id,
            body,
            rest,
            total,
            magic,
            crc,
            msg.flag,
            msg.born_timestamp or now,
            msg.reconsume_times,
            tags_code(tags) if tags else 0,
            now,
            uniq,
            uniq_prefix,
            counter,
            own,
            keys,
        )

    def columns(
        self, cols: Columns, now: int, half: tuple[str, str] | None = None
    ) -> EncodedColumns:
        """Encode a columnar put (no delay, IPv4 hosts) into one ColumnBatch.

        Writes exactly the bytes of the per-record path (same property order:
        user properties, TAGS, KEYS, UNIQ_KEY; for a half message then PGROUP,
        __transactionId__, the caller's extra properties, and last TRAN_MSG,
        REAL_TOPIC, REAL_QID, so that committing keeps a prefix of them) with
        one numpy header build and one ``bytes.join`` per CommitLog segment.
        """
        # Hot path: one lean loop per message, locals bound, no per-message objects.
        n = len(cols.bodies)
        uniq_prefix, uniq_start = self.ids.next_block(n, now)
        max_body = self.config.max_message_size
        topics: list[str] = [""] * n
        queue_ids = [0] * n
        bodies: list[bytes] = [b""] * n
        rests: list[bytes] = [b""] * n
        codes = [0] * n
        crc32 = zlib.crc32
        code_of = tags_code
        java_hash = java_string_hash
        rr = self._round_robin
        uniq_given: dict[int, str] = {}
        keyed: list[int] = []
        key_strings: list[str] = []
        self._expire_topics()
        topic_info = self._topic_cache
        uniform = self._uniform_batch(cols, now, uniq_prefix, uniq_start, half)
        if uniform is not None:
            batch, keyed_rows, keys_text = uniform
            return batch, uniq_prefix, uniq_start, {}, keyed_rows, keys_text
        cache: dict[str, tuple[int, bytes, int, str]] = {}
        last_topic = None
        write_queues = 0
        topic_part = b""
        magic = MESSAGE_MAGIC_CODE
        uniq_tail = ""
        same_topic = True
        col_bodies, col_topics, default_topic = cols.bodies, cols.topics, cols.topic
        col_tags, col_keys, col_props = cols.tags, cols.keys, cols.properties
        col_qids, col_shard = cols.queue_ids, cols.sharding_keys
        hex4 = _HEX4
        # the property layout's strings (message/properties.py), bound once
        nv, end = NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
        tags_prefix, keys_prefix, delay_prefix = TAGS_PREFIX, KEYS_PREFIX, DELAY_PREFIX
        uniq_key_prefix = UNIQ_KEY_PREFIX
        topic_head = half_topic_head = ""
        size_note = ""
        if half is not None:
            group, extra = half
            half_head = half_head_text(group)
            # after a half's __transactionId__: the prepare's extra properties, then
            # HALF_TAIL up to REAL_TOPIC's value (the topic, REAL_QID's item follow)
            half_tail = f"{end}{extra}{HALF_COMMIT_MARKER_TEXT}"
            real_qid = REAL_QUEUE_ID_SEPARATOR_TEXT
            size_note = HALF_SIZE_NOTE

            half_info = self.topic_info(TRANS_HALF_TOPIC)
            half_topic_head = half_info.topic_field.decode("latin-1")
        named: Mapping[Any, Any] | None  # a row's properties by name, bound when it has any
        for i in range(n):
            # only None takes the default: an empty name is refused as Message's is
            topic: str | None = col_topics[i] if col_topics is not None else None
            if topic is None:
                topic = default_topic
            if topic is None or (topic is not last_topic and topic != last_topic):
                if topic is None:
                    raise InvalidMessageError(
                        f"row {i}: no topic (give a topic for every row, or a default topic)"
                    )
                if topic.__class__ is not str and not isinstance(topic, str):
                    raise InvalidMessageError(f"row {i}: topic must be a string, got {topic!r}")
                info = cache.get(topic)
                if info is None:
                    known = topic_info.get(topic)
                    if known is None:
                        known = topic_info[topic] = self.topic_info(topic)
                    info = cache[topic] = (
                        known.write_queues,
                        known.topic_field,
                        known.magic,
                        uniq_key_prefix + uniq_prefix,
                    )
                    if last_topic is not None:
                        same_topic = False
                write_queues, topic_part, magic, uniq_tail = info
                topic_head = topic_part.decode("latin-1")
                last_topic = topic
            topics[i] = topic
            q = col_qids[i] if col_qids is not None else None
            if q is not None:
                if q.__class__ is not int:
                    q = check_int(
                        "queue_id", q, -INT64_MAX, INT64_MAX, f"row {i} of topic {topic!r}: "
                    )
                if not 0 <= q < write_queues:
                    raise OffsetOutOfRangeError(
                        f"queue_id {q} is out of range for topic {topic!r} "
                        f"with {write_queues} write queues"
                    )
            else:
                shard = col_shard[i] if col_shard is not None else None
                if shard is not None:
                    if shard.__class__ is not str and not isinstance(shard, str):
                        raise InvalidMessageError(
                            f"row {i} of topic {topic!r}: sharding_key "
                            f"must be a string, got {shard!r}"
                        )
                    h = java_hash(shard)
                    q = h % write_queues if h >= 0 else -(-h % write_queues)
                    q = -q if q < 0 else q
                else:
                    q = rr.get(topic, -1) + 1
                    rr[topic] = q
                    q %= write_queues
            queue_ids[i] = q
            text = ""
            pairs = 0
            own_uniq = None
            props = col_props[i] if col_props is not None else None
            if props:
                # (name, value) pairs naming one property twice keep the last, as a
                # Message's dict does (RocketMQ's properties are a map).
                if isinstance(props, Mapping):
                    named = props
                else:
                    try:  # the common case without formatting the error's prefix per row
                        named = (
                            dict(props)
                            if (props.__class__ is list or props.__class__ is tuple)
                            else None
                        )
                    except (TypeError, ValueError):
                        named = None
                    if named is None:
                        named = property_pairs(props, f"row {i} of topic {topic!r}: ")
                parts = []
                for k, v in named.items():
                    if k.__class__ is not str or v.__class__ is not str or not k:
                        check_property(f"row {i} of topic {topic!r}: ", k, v)
                    parts.append(f"{k}{nv}{v}{end}")
                text = "".join(parts)
                pairs = len(parts)
                if uniq_key_prefix in text:
                    own_uniq = named.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                if tags_prefix in text or keys_prefix in text or delay_prefix in text:
                    for k in named:
                        if k in RESERVED_PROPERTIES:
                            raise InvalidMessageError(
                                reserved_property_error(k, f"row {i} of topic {topic!r}: property")
                            )
                if half is not None and PROPERTY_FIRST_HALF in named:
                    raise ConfigError(f"row {i} of topic {topic!r}: {FIRST_HALF_ERROR}")
            elif props is not None and not isinstance(props, (Mapping, list, tuple)):
                property_pairs(props, f"row {i} of topic {topic!r}: ")
            tag = col_tags[i] if col_tags is not None else None
            if tag:
                if tag.__class__ is not str and not isinstance(tag, str):
                    raise InvalidMessageError(
                        f"row {i} of topic {topic!r}: tags must be a string, got {tag!r}"
                    )
                text += f"{tags_prefix}{tag}{end}"
                codes[i] = code_of(tag)
                pairs += 1
            elif tag is not None and not isinstance(tag, str):
                raise InvalidMessageError(
                    f"row {i} of topic {topic!r}: tags must be a string, got {tag!r}"
                )
            key = col_keys[i] if col_keys is not None else None
            if key:
                if not isinstance(key, str):
                    # the common case (one space between keys, none in them) checked here,
                    # without formatting the error's prefix per row; the rest there
                    try:
                        joined = (
                            " ".join(key)
                            if (key.__class__ is list or key.__class__ is tuple) and "" not in key
                            else None
                        )
                    except TypeError:  # not strings
                        joined = None
                    if joined is not None and joined.count(" ") == len(key) - 1:
                        key = joined
                    else:
                        key = joined_keys(key, f"row {i} of topic {topic!r}: ")
                text += f"{keys_prefix}{key}{end}"
                keyed.append(i)
                key_strings.append(key)
                pairs += 1
            elif key is not None and not isinstance(key, (str, list, tuple)):
                joined_keys(key, f"row {i} of topic {topic!r}: ")
            if pairs and (text.count(nv) != pairs or text.count(end) != pairs):
                raise InvalidMessageError(
                    f"row {i} of topic {topic!r}: a property name or value, tag or key "
                    "contains a \\x01 or \\x02 separator character"
                )
            if own_uniq is None:
                suffix = hex4[(uniq_start + i) & 0xFFFF]
                text += f"{uniq_tail}{suffix}{end}"
                uniq = uniq_prefix + suffix if half is not None else ""
            else:
                uniq = own_uniq
                uniq_given[i] = own_uniq
            if half is not None:
                text += f"{half_head}{uniq}{half_tail}{topic}{real_qid}{q}{end}"
            body = col_bodies[i]
            if body.__class__ is not bytes or not body:
                body = message_body(body, f"row {i} of topic {topic!r}: ")
            bodies[i] = body
            head = topic_head if half is None else half_topic_head
            if text.isascii():
                size = len(text)
                if size > 32767 or len(body) > max_body:
                    check_sizes(topic, len(body), size, max_body, size_note)
                # one encode: TOPICLENGTH+TOPIC, PROPERTIESLENGTH (2 bytes) and the text
                rests[i] = f"{head}{chr(size >> 8)}{chr(size & 0xFF)}{text}".encode("latin-1")
            else:
                try:
                    pb = text.encode("utf-8")
                except UnicodeEncodeError:
                    check_utf8_fields(  # named is bound to a mapping whenever props is truthy
                        f"row {i} of topic {topic!r}: ",
                        named if props else {},  # type: ignore[arg-type]
                        tag,
                        key,
                    )
                    raise  # the extra properties of a half were checked before
                size = len(pb)
                if size > 32767 or len(body) > max_body:
                    check_sizes(topic, len(body), size, max_body, size_note)
                rests[i] = b"".join((head.encode("latin-1"), size.to_bytes(2, "big"), pb))
        crcs = np.fromiter(map(crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
        if half is not None:
            batch = ColumnBatch(
                topics=TRANS_HALF_TOPIC,
                queue_ids=np.zeros(n, dtype=np.int32),
                bodies=bodies,
                rests=rests,
                crcs=crcs,
                magics=half_info.magic,
                tags_codes=np.asarray(codes, dtype=np.int64),
                born_host=self.born_host,
                born_ts=now,
            )
        else:
            batch = ColumnBatch(
                topics=last_topic if same_topic else topics,  # type: ignore[arg-type]
                queue_ids=np.asarray(queue_ids, dtype=np.int32),
                bodies=bodies,
                rests=rests,
                crcs=crcs,
                magics=magic
                if same_topic
                else np.fromiter((cache[t][2] for t in topics), dtype=np.int32, count=n),
                tags_codes=np.asarray(codes, dtype=np.int64),
                born_host=self.born_host,
                born_ts=now,
            )
        if cols.extra is not None:  # flag, reconsume times, born timestamp (put_batch)
            flags, reconsume, born = cols.extra
            batch.flags = np.asarray(flags, dtype=np.int64)
            batch.reconsume = np.asarray(reconsume, dtype=np.int64)
            batch.born_ts = np.asarray([b or now for b in born], dtype=np.int64)
        return batch, uniq_prefix, uniq_start, uniq_given, keyed, key_strings

    def _uniform_batch(
        self,
        cols: Columns,
        now: int,
        uniq_prefix: str,
        uniq_start: int,
        half: tuple[str, str] | None,
    ) -> tuple[ColumnBatch, list[int], list[str]] | None:
        """The batch of rows that differ only in body and keys, built without a row loop.

        One topic, no properties, queue ids or sharding keys: every record's
        properties are then one template with the UNIQ_KEY counter (and for a
        half, REAL_QID) patched in, built as a numpy byte matrix, after the TAGS
        (one of a few values) and KEYS of each row. Same bytes as the row loop; None when
        the rows are not uniform (the loop then also reports any bad row).
        Returns the batch, the rows with keys and their KEYS.
        """
        # Hot path: the common put and the sink's; a few C-level scans of the columns.
        nv, end = NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR  # (message/properties.py)
        bodies = cols.bodies
        n = len(bodies)
        if n < UNIFORM_MIN or cols.extra is not None or not isinstance(bodies, list):
            return None
        topic = cols.topic
        if cols.topics is not None:
            if not isinstance(cols.topics, list) or cols.topics.count(cols.topics[0]) != n:
                return None
            topic = cols.topics[0] if cols.topics[0] is not None else cols.topic
        tag = None
        tag_of: np.ndarray | None = None  # per row, an index into tag_values (tags vary)
        tag_values: list[Any] = []
        if cols.tags is not None:
            if not isinstance(cols.tags, list):
                return None
            if cols.tags.count(cols.tags[0]) == n:
                tag = cols.tags[0]
            else:
                tag_values = list(dict.fromkeys(cols.tags))
                if len(tag_values) > UNIFORM_MAX_TAGS or not all(
                    t is None
                    or (isinstance(t, str) and nv not in t and end not in t and encodes_utf8(t))
                    for t in tag_values
                ):
                    return None
                number = {t: i for i, t in enumerate(tag_values)}
                tag_of = np.fromiter(map(number.__getitem__, cols.tags), dtype=np.int64, count=n)
        for col in (cols.queue_ids, cols.sharding_keys):
            if col is not None and (not isinstance(col, list) or col.count(None) != n):
                return None
        # An empty row is None or an empty mapping / sequence; any other false value
        # (0, False, b"") is one the row loop refuses. (Columns of Messages hold no such.)
        props_col = cols.properties
        if props_col is not None and (
            any(props_col) or not (cols.checked or only_empty(props_col, n, ({}, None, [], ())))
        ):
            return None
        key_texts: list[bytes] | None = None
        keyed: list[int] = []
        key_strings: list[str] = []
        has_keys = cols.keys is not None and any(cols.keys)
        if (
            cols.keys is not None
            and not has_keys
            and not (cols.checked or only_empty(cols.keys, n, (None, (), [], "")))
        ):
            return None
        if has_keys:
            if not isinstance(cols.keys, list):
                return None
            listed = []  # keys given as sequences, and the spaces joining them
            spaces = 0
            try:
                for i, k in enumerate(cols.keys):
                    if not k:
                        if k is not None and not isinstance(k, (str, list, tuple)):
                            return None
                    else:
                        keyed.append(i)
                        if isinstance(k, str):
                            key_strings.append(k)
                        elif k.__class__ is not list and k.__class__ is not tuple:
                            return None
                        else:
                            k = " ".join(k)
                            key_strings.append(k)
                            listed.append(k)
                            spaces += len(cols.keys[i]) - 1
            except TypeError:  # not a sequence of strings
                return None
            joined = nv.join(key_strings)
            if (
                end in joined
                or joined.count(nv) != len(key_strings) - 1
                or (not joined.isascii() and not encodes_utf8(joined))
            ):
                return None  # the row loop reports the bad key
            if listed:
                # a key of a sequence is non-empty and without spaces (as Message's):
                # its joined text then has exactly one space between keys, none at the ends
                seq = nv + nv.join(listed) + nv
                if (
                    seq.count(" ") != spaces
                    or "  " in seq
                    or nv + " " in seq
                    or " " + nv in seq
                    or nv + nv in seq
                ):
                    return None
            key_texts = [b""] * n
            for i, k in zip(keyed, key_strings, strict=False):
                key_texts[i] = f"{KEYS_PREFIX}{k}{end}".encode()
        if topic.__class__ is not str or (tag is not None and not isinstance(tag, str)):
            return None
        if tag and (nv in tag or end in tag or not encodes_utf8(tag)):
            return None
        if not all(b.__class__ is bytes for b in bodies):
            return None
        lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
        if n and (
            int(lengths.max()) > self.config.max_message_size or not lengths.all()
        ):  # an empty body: the row loop reports it
            return None
        known = self._topic_cache.get(topic)
        if known is None:
            known = self._topic_cache[topic] = self.topic_info(topic)
        write_queues, topic_part, magic = known.write_queues, known.topic_field, known.magic
        first = self._round_robin.get(topic, -1) + 1  # taken below, once nothing can fail
        queue_ids = (first + np.arange(n, dtype=np.int64)) % write_queues
        counters = (uniq_start + np.arange(n, dtype=np.int64)) & 0xFFFF
        hex4 = _hex4_bytes()[counters]
        head = f"{TAGS_PREFIX}{tag}{end}" if tag else ""
        # With keys, TAGS and KEYS (which vary) come before the template as pieces of
        # their own, and PROPERTIESLENGTH with them; without, the template has it all.
        separate = key_texts is not None or tag_of is not None
        uniq_head = (
            f"{UNIQ_KEY_PREFIX}{uniq_prefix}"
            if separate
            else f"{head}{UNIQ_KEY_PREFIX}{uniq_prefix}"
        ).encode()
        if half is None:
            text = [uniq_head, PROPERTY_SEPARATOR_BYTES]
            groups: list[tuple[int | None, np.ndarray]] = [(None, np.arange(n))]
            lead = topic_part
        else:
            group, extra = half
            half_topic = self.topic_info(TRANS_HALF_TOPIC)
            lead = half_topic.topic_field
            text = [
                uniq_head,
                f"{end}{half_head_text(group)}{uniq_prefix}".encode(),
                f"{end}{extra}{HALF_COMMIT_MARKER_TEXT}{topic}{REAL_QUEUE_ID_SEPARATOR_TEXT}".encode(),
            ]
            order = np.argsort(queue_ids, kind="stable")
            per_queue = np.bincount(queue_ids, minlength=write_queues)
            ends = np.cumsum(per_queue)
            groups = [
                (q, order[ends[q] - per_queue[q] : ends[q]])
                for q in range(write_queues)
                if per_queue[q]
            ]
        buffers = []
        offsets = np.empty(n, dtype=np.int64)
        rest_len = np.empty(n, dtype=np.int64)
        which = np.zeros(n, dtype=np.int64)
        for g, (q, rows) in enumerate(groups):
            pieces = text if q is None else [*text, f"{q}{end}".encode()]
            size = sum(len(p) for p in pieces) + 4 * (1 if q is None else 2)
            if size > 32767:
                return None
            template = bytearray(b"" if separate else lead + size.to_bytes(2, "big"))
            slots = []
            for k, piece in enumerate(pieces):
                template += piece
                if k < (1 if q is None else 2):
                    slots.append(len(template))
                    template += b"0000"
            m = len(rows)
            matrix = np.tile(np.frombuffer(bytes(template), dtype=np.uint8), (m, 1))
            for at in slots:
                matrix[:, at : at + 4] = hex4[rows]
            buffers.append(matrix)
            width = len(template)
            offsets[rows] = np.arange(m, dtype=np.int64) * width
            rest_len[rows] = width
            which[rows] = g
        rests: Pieces | tuple[Pieces, ...]  # the template alone, or with TAGS and KEYS before it
        rests = Pieces(buffers, offsets, rest_len, which if len(buffers) > 1 else 0)
        if tag_of is not None:
            heads = [f"{TAGS_PREFIX}{t}{end}".encode() if t else b"" for t in tag_values]
            head_p = Pieces(
                heads,
                np.zeros(n, dtype=np.int64),
                np.asarray([len(h) for h in heads], dtype=np.int64)[tag_of],
                tag_of,
            )
            codes = np.asarray([tags_code(t) if t else 0 for t in tag_values], dtype=np.int64)[
                tag_of
            ]
        else:
            head_p = Pieces.repeated(head.encode(), n)
            codes = np.full(n, tags_code(tag) if tag else 0, dtype=np.int64)
        if separate:
            # TAGS and KEYS vary: lead, PROPERTIESLENGTH, TAGS, KEYS, then the template
            keys_p = None if key_texts is None else Pieces.of_list(key_texts)
            sizes = head_p.lengths + rest_len
            if keys_p is not None:
                sizes = sizes + keys_p.lengths
            if int(sizes.max()) > 32767:
                return None
            rests = (
                Pieces.repeated(lead, n),
                Pieces.fixed(sizes.astype(">u2"), 2, n),
                head_p,
                *((keys_p,) if keys_p is not None else ()),
                rests,
            )
        self._round_robin[topic] = first + n - 1  # the row loop would have got as far
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
        if half is None:
            return (
                ColumnBatch(
                    topics=topic,
                    queue_ids=queue_ids.astype(np.int32),
                    bodies=bodies,
                    rests=rests,
                    crcs=crcs,
                    magics=magic,
                    tags_codes=codes,
                    born_host=self.born_host,
                    born_ts=now,
                ),
                keyed,
                key_strings,
            )
        half_batch = ColumnBatch(
            topics=TRANS_HALF_TOPIC,
            queue_ids=np.zeros(n, dtype=np.int32),
            bodies=bodies,
            rests=rests,
            crcs=crcs,
            magics=half_topic.magic,
            tags_codes=codes,
            born_host=self.born_host,
            born_ts=now,
        )
        return half_batch, keyed, key_strings  # halves are indexed by key too, as RocketMQ does

    def serialized(
        self,
        topic: str,
        queue_id: int | None,
        rows: SerializedRows,
        now: int,
    ) -> tuple[EncodedColumns, np.ndarray | None]:
        """Encode rows of one topic whose user properties come already in the PROPERTIES
        field's form (a SEND_BATCH_MESSAGE's, see :class:`SerializedRows`).

        Writes the bytes :meth:`columns` writes for the same messages (user
        properties as given, then TAGS, KEYS, and UNIQ_KEY unless a row has its
        own), with its checks of the queue id and the sizes and its errors. Returns
        the encoded columns and, when it has them, the rows' topic#UNIQ_KEY hashCodes.
        """
        # Hot path: batch sends of a served store; one lean loop per message.
        bodies, props, tags, keys, uniqs = (
            rows.bodies,
            rows.properties,
            rows.tags,
            rows.keys,
            rows.uniq,
        )
        n = len(bodies)
        uniq_prefix, uniq_start = self.ids.next_block(n, now)
        info = self._write_info(topic)
        write_queues, topic_part, magic = info.write_queues, info.topic_field, info.magic
        if queue_id is not None:
            if not 0 <= queue_id < write_queues:
                raise OffsetOutOfRangeError(
                    f"queue_id {queue_id} is out of range for topic {topic!r} "
                    f"with {write_queues} write queues"
                )
            queue_ids = np.full(n, queue_id, dtype=np.int32)
        else:  # round robin, as the row loop takes it
            first = self._round_robin.get(topic, -1) + 1
            queue_ids = ((first + np.arange(n, dtype=np.int64)) % write_queues).astype(np.int32)
        max_body = self.config.max_message_size
        crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
        flags = np.asarray(rows.flags, dtype=np.int64) if rows.flags is not None else 0
        born_ts = rows.born_timestamp or now
        own = uniqs[0] if uniqs is not None else None
        if (
            own is not None
            and keys is None
            and uniqs.count(own) == n  # type: ignore[union-attr]
            and props.count(props[0]) == n
            and (tags is None or tags.count(tags[0]) == n)
        ):
            # Every row stores the same properties (a Java producer's batch of like
            # messages, whose UNIQ_KEY is the batch's): one PROPERTIES field for all.
            tag = tags[0] if tags is not None else None
            field = props[0] + (f"{TAGS_PREFIX}{tag}{PROPERTY_SEPARATOR}".encode() if tag else b"")
            if len(field) <= 32767 and max(map(len, bodies)) <= max_body:  # else: the loop
                if queue_id is None:
                    self._round_robin[topic] = first + n - 1
                code = tags_code(tag) if tag else 0
                batch = ColumnBatch(
                    topics=topic,
                    queue_ids=queue_ids,
                    bodies=bodies,
                    rests=Pieces.repeated(topic_part + len(field).to_bytes(2, "big") + field, n),
                    crcs=crcs,
                    magics=magic,
                    tags_codes=np.full(n, code, dtype=np.int64),
                    born_host=self.born_host,
                    born_ts=born_ts,
                    flags=flags,
                    reconsume=rows.reconsume_times,
                )
                hashes = np.full(n, java_string_hash(f"{topic}#{own}"), dtype=np.int32)
                given = SameForEach(n, own)
                return (batch, uniq_prefix, uniq_start, given, [], []), hashes
        rests: list[bytes] = [b""] * n
        codes = [0] * n
        uniq_given: dict[int, str] = {}
        keyed: list[int] = []
        key_strings: list[str] = []
        tag_items: dict[str, tuple[bytes, int]] = {}  # a tag's TAGS item and tags code
        hex4 = _HEX4
        uniq_head = f"{UNIQ_KEY_PREFIX}{uniq_prefix}"
        end = PROPERTY_SEPARATOR
        keys_prefix = KEYS_PREFIX
        for i in range(n):
            p = props[i]
            tag = tags[i] if tags is not None else None
            if tag:
                item = tag_items.get(tag)
                if item is None:
                    item = tag_items[tag] = (
                        f"{TAGS_PREFIX}{tag}{end}".encode(),
                        tags_code(tag),
                    )
                p += item[0]
                codes[i] = item[1]
            key = keys[i] if keys is not None else None
            if key:
                p += f"{keys_prefix}{key}{end}".encode()
                keyed.append(i)
                key_strings.append(key)
            own = uniqs[i] if uniqs is not None else None
            if own is None:
                p += f"{uniq_head}{hex4[(uniq_start + i) & 0xFFFF]}{end}".encode()
            else:
                uniq_given[i] = own
            body = bodies[i]
            size = len(p)
            if size > 32767 or len(body) > max_body:
                if queue_id is None:  # the row loop has taken the queues of rows 0..i
                    self._round_robin[topic] = first + i
                check_sizes(topic, len(body), size, max_body)
            rests[i] = b"".join((topic_part, size.to_bytes(2, "big"), p))
        if queue_id is None:
            self._round_robin[topic] = first + n - 1
        batch = ColumnBatch(
            topics=topic,
            queue_ids=queue_ids,
            bodies=bodies,
            rests=rests,
            crcs=crcs,
            magics=magic,
            tags_codes=np.asarray(codes, dtype=np.int64),
            born_host=self.born_host,
            born_ts=born_ts,
            flags=flags,
            reconsume=rows.reconsume_times,
        )
        return (batch, uniq_prefix, uniq_start, uniq_given, keyed, key_strings), None

    def _expire_topics(self) -> None:
        """Forget the cached topic configs once a second: they are re-read at most that
        often (a stat of topics.json costs more than encoding a message); create_topic
        here clears them."""
        mono = time.monotonic()
        if mono > self._topic_cache_until:
            self._topic_cache.clear()
            self._topic_cache_until = mono + 1.0

    def _write_info(self, topic: str) -> TopicWriteInfo:
        """What a put to ``topic`` needs, from the cache (see _expire_topics)."""
        self._expire_topics()
        info = self._topic_cache.get(topic)
        if info is None:
            info = self._topic_cache[topic] = self.topic_info(topic)
        return info

    def topic_info(self, topic: str) -> TopicWriteInfo:
        """What the records of a topic to put to need (created if allowed, see _topic_for_put)."""
        cfg = self._topic_for_put(topic)
        tb = topic.encode("utf-8")
        v2 = len(tb) > V1_MAX_TOPIC_LENGTH
        return TopicWriteInfo(
            int(cfg["writeQueueNums"]),
            (SHORT.pack(len(tb)) if v2 else bytes((len(tb),))) + tb,
            MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
        )

    def _topic_for_put(self, topic: str, *, check_topic: bool = True) -> dict[str, Any]:
        """The topic's config; unknown: created when autoCreateTopicEnable (or not checked)."""
        cfg = self.topics.get(topic)
        if cfg is None:
            if check_topic and not self.config.auto_create_topic_enable:
                raise unknown_topic(
                    topic,
                    self.root,
                    "create it first (MessageStore.create_topic or `rocketspark topic create`)",
                )
            validate_topic(topic)
            self.topics.create(
                topic,
                self.config.default_topic_queue_nums,
                self.config.default_topic_queue_nums,
                perm=6,
                order=False,
            )
            cfg = self.topics.get(topic)
            assert cfg is not None
        return cfg

    def _select_queue(self, msg: Message, write_queues: int) -> int:
        if msg.queue_id is not None:
            if not 0 <= msg.queue_id < write_queues:
                raise OffsetOutOfRangeError(
                    f"queue_id {msg.queue_id} is out of range for topic {msg.topic!r} "
                    f"with {write_queues} write queues"
                )
            return msg.queue_id
        if msg.sharding_key is not None:
            # SelectMessageQueueByHash: hashCode % n, made non-negative.
            return abs(
                java_string_hash(msg.sharding_key) % write_queues
                if java_string_hash(msg.sharding_key) >= 0
                else -(-java_string_hash(msg.sharding_key) % write_queues)
            )
        n = self._round_robin.get(msg.topic, -1) + 1
        self._round_robin[msg.topic] = n
        return n % write_queues

    def message(
        self,
        msg: Message,
        now: int,
        uniq: str,
        *,
        sys_flag: int = 0,
        prepared_offset: int = 0,
        check_topic: bool = True,
    ) -> PreparedRecord:
        """Encode ``msg`` (UNIQ_KEY ``uniq`` unless it has one); a delayed message goes to
        SCHEDULE_TOPIC_XXXX queue level - 1, its destination in REAL_TOPIC / REAL_QID."""
        topic = msg.topic
        cfg = self._topic_for_put(topic, check_topic=check_topic)
        queue_id = self._select_queue(msg, int(cfg["writeQueueNums"]))
        props = msg.all_properties()
        props.setdefault(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
        delay_ms = 0
        if msg.delay_level > 0 and transaction_type(sys_flag) in (0, SysFlag.TRANSACTION_COMMIT):
            level = self.check_delay_level(msg.delay_level, f"topic {topic!r}: ")
            props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
            props[PROPERTY_REAL_TOPIC] = topic
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            topic = SCHEDULE_TOPIC
            queue_id = level - 1
            delay_ms = self._delay_ms[level - 1]
            self.ensure_system_topic(SCHEDULE_TOPIC, len(self._delay_ms))
        return self.record(
            topic,
            queue_id,
            msg.body,
            props,
            now,
            sys_flag=sys_flag,
            flag=msg.flag,
            born_timestamp=msg.born_timestamp or now,
            reconsume_times=msg.reconsume_times,
            prepared_offset=prepared_offset,
            delay_ms=delay_ms,
        )

    def record(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str],
        now: int,
        *,
        sys_flag: int = 0,
        flag: int = 0,
        born_timestamp: int = 0,
        born_host: HostAddress | None = None,
        reconsume_times: int = 0,
        prepared_offset: int = 0,
        delay_ms: int = 0,
    ) -> PreparedRecord:
        """Encode one record of ``topic`` / ``queue_id`` with the properties ``props`` as given."""
        props_bytes = encode_properties(props)
        if topic == TRANS_HALF_TOPIC:  # name the real topic, and what the half added
            check_sizes(
                props.get(PROPERTY_REAL_TOPIC, topic),
                len(body),
                len(props_bytes),
                self.config.max_message_size,
                HALF_SIZE_NOTE,
            )
        else:
            check_sizes(topic, len(body), len(props_bytes), self.config.max_message_size)
        topic_bytes = topic.encode("utf-8")
        v2 = len(topic_bytes) > V1_MAX_TOPIC_LENGTH
        topic_part = SHORT.pack(len(topic_bytes)) if v2 else bytes((len(topic_bytes),))
        tail = b"".join((body, topic_part, topic_bytes, SHORT.pack(len(props_bytes)), props_bytes))
        born = born_host or self.born_host
        sys_flag &= ~(SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)
        if born.is_v6:
            sys_flag |= SysFlag.BORNHOST_V6
        if self.store_host.is_v6:
            sys_flag |= SysFlag.STOREHOST_V6
        tran = transaction_type(sys_flag)
        keys_raw = props.get(PROPERTY_KEYS)
        return PreparedRecord(
            topic=topic,
            queue_id=queue_id,
            body_len=len(body),
            tail=tail,
            crc=zlib.crc32(body) & 0x7FFFFFFF,
            flag=flag,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp or now,
            born_host=born,
            reconsume_times=reconsume_times,
            prepared_offset=prepared_offset,
            magic=MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE,
            tags_code=tags_code(props.get(PROPERTY_TAGS)),
            uniq_key=props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            keys=tuple(k for k in keys_raw.split(" ") if k) if keys_raw else (),
            dispatch=tran in (0, SysFlag.TRANSACTION_COMMIT),
            delay_ms=delay_ms,
        )

    def messages(self, messages: Sequence[Message], now: int) -> list[PreparedRecord]:
        """Encode checked Messages for a per-record append, each with a new UNIQ_KEY."""
        for i, m in enumerate(messages):
            if m.delay_level:
                self.check_delay_level(m.delay_level, f"message {i} (topic {m.topic!r}): ")
        ids = self.ids.next_ids(len(messages), now)
        return [self.message(m, now, uid) for m, uid in zip(messages, ids, strict=False)]

    def check_delay_level(self, level: int, where: str = "") -> int:
        """Return ``level`` if it is one of the configured delay levels (1..n)."""
        n = len(self._delay_ms)
        if not 1 <= level <= n:
            raise InvalidMessageError(
                f"{where}delay_level {level} is not one of the store's delay levels 1..{n} "
                "(messageDelayLevel)"
            )
        return level

    def ensure_system_topic(self, topic: str, queues: int) -> None:
        """Create a system topic (schedule, half, retry, DLQ) the first time it is used."""
        if self.topics.get(topic) is None:
            self.topics.create(topic, queues, queues, perm=6, order=False, if_absent=True)


# The last four hex digits of generated UNIQ_KEYs, by counter value. Built from the
# 256 digit pairs: every process that opens a store imports this module, and formatting
# 65,536 numbers took 25 ms of it (this takes a third of that).
_HEX2 = [f"{i:02X}" for i in range(256)]
_HEX4 = tuple([hi + lo for hi in _HEX2 for lo in _HEX2])
_HEX4_BYTES: list[np.ndarray] = []
UNIFORM_MIN = 64  # rows from which a uniform batch is built without the row loop
UNIFORM_MAX_TAGS = 1024  # distinct tags a uniform batch may have (one piece each)


def _hex4_bytes() -> np.ndarray:
    """_HEX4 as a (65536, 4) uint8 matrix (built on first use)."""
    if not _HEX4_BYTES:
        _HEX4_BYTES.append(np.frombuffer("".join(_HEX4).encode(), dtype=np.uint8).reshape(65536, 4))
    return _HEX4_BYTES[0]
