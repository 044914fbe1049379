"""The vectorised Arrow read path agrees with the per-record decoder."""

from __future__ import annotations

import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.errors import CorruptRecordError
from rocketspark.message.arrow import (
    ARROW_SCHEMA,
    COLUMN_NAMES,
    COLUMN_PROPERTIES,
    _NotUtf8,
    _parse_grouped,
    _parse_items,
    _parse_properties,
    _parse_uniform,
    messages_to_batch,
    record_positions,
)
from rocketspark.message.properties import decode_properties
from rocketspark.store import Message, MessageStore

_token = st.sampled_from(
    ["TAGS", "KEYS", "UNIQ_KEY", "a", "", "é", "x y", "\x01", "\x02", "v1", "TAG", "TAGSS"]
)
_raw = st.lists(_token, max_size=12).map(lambda parts: "".join(parts).encode("utf-8"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_raw, min_size=1, max_size=8))
def test_parse_properties_matches_the_record_decoder(raws):
    _assert_parsed_like_the_decoder(raws, _parse_properties(pa.array(raws, pa.large_binary())))


def _assert_parsed_like_the_decoder(raws, parsed):
    prop_map, tags, uniq, keys = parsed
    for i, raw in enumerate(raws):
        want = decode_properties(raw)
        assert dict(prop_map[i].as_py()) == _map_part(want), raw
        assert tags[i].as_py() == want.get("TAGS")
        assert uniq[i].as_py() == want.get("UNIQ_KEY")
        assert keys[i].as_py() == want.get("KEYS")


def _map_part(props: dict) -> dict:
    """What a row's properties map holds: all but the properties with their own column."""
    assert COLUMN_PROPERTIES == {"TAGS", "KEYS", "UNIQ_KEY"}
    return {k: v for k, v in props.items() if k not in COLUMN_PROPERTIES}


# One layout for every row: (name, value length) items; values of those byte lengths,
# drawn from bytes that include separators and halves of UTF-8 sequences.
_layout = st.lists(
    st.tuples(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "é"]), st.integers(0, 5)),
    min_size=1,
    max_size=4,
)
_value_byte = st.sampled_from([ord("a"), ord("Z"), ord(" "), 1, 2, 0xC3, 0xA9])


def _layout_row(draw, layout) -> tuple[bytes, bool]:
    """One row of ``layout`` with drawn values; True when no value holds a separator."""
    values = [
        bytes(draw(st.lists(_value_byte, min_size=width, max_size=width))) for _, width in layout
    ]
    row = b"".join(
        name.encode("utf-8") + b"\x01" + value + b"\x02"
        for (name, _), value in zip(layout, values, strict=True)
    )
    return row, not any(set(v) & {1, 2} for v in values)


@st.composite
def _same_layout_rows(draw):
    layout = draw(_layout)
    lifted = [name for name, _ in layout if name in COLUMN_PROPERTIES]
    # No separator inside a value, and no column's property named twice (those the
    # template leaves to the item parser, which checks every value's UTF-8).
    clean = len(lifted) == len(set(lifted))
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        row, no_separator = _layout_row(draw, layout)
        rows.append(row)
        clean = clean and no_separator
    return rows, clean


def _check_fast_parser(raws, fast):
    """``fast(arr)`` (a template parser) agrees with the item parser whenever it answers,
    and _parse_properties with the decoder; bad UTF-8 fails both. Returns whether the
    rows were UTF-8, and fast's answer."""
    arr = pa.array(raws, pa.large_binary())
    try:
        items = _parse_items(arr)
    except _NotUtf8:
        with pytest.raises(_NotUtf8):
            _parse_properties(arr)
        return False, None
    got = fast(arr)
    if got is not None:
        assert all(a.equals(b) for a, b in zip(got, items, strict=True))
    _assert_parsed_like_the_decoder(raws, _parse_properties(arr))
    return True, got


@settings(max_examples=300, deadline=None)
@given(_same_layout_rows())
def test_rows_of_one_layout_parse_like_the_decoder(case):
    """The template parser takes rows of one layout (or leaves them to the item parser,
    when a value holds a separator or bad UTF-8), and both agree with the decoder."""
    raws, clean = case
    utf8, uniform = _check_fast_parser(raws, _parse_uniform)
    if utf8 and clean:
        assert uniform is not None  # the fast path is taken whenever it can be


@st.composite
def _few_layout_rows(draw):
    layouts = draw(st.lists(_layout, min_size=2, max_size=4))
    return [
        _layout_row(draw, layouts[draw(st.integers(0, len(layouts) - 1))])[0]
        for _ in range(draw(st.integers(2, 12)))
    ]


@settings(max_examples=300, deadline=None)
@given(_few_layout_rows())
def test_rows_of_a_few_layouts_parse_like_the_decoder(raws):
    """Rows grouped by length, each group by its template (or left to the item parser)."""
    _check_fast_parser(raws, _parse_grouped)


def test_keys_of_a_few_lengths_are_parsed_by_length():
    raws = [
        b"TAGS\x01t\x02KEYS\x01%s\x02UNIQ_KEY\x01%032X\x02" % (b"k" * (1 + i * 7 % 6), i)
        for i in range(300)
    ]
    arr = pa.array(raws, pa.large_binary())
    assert _parse_uniform(arr) is None
    grouped = _parse_grouped(arr)
    assert grouped is not None and all(
        a.equals(b) for a, b in zip(grouped, _parse_items(arr), strict=True)
    )
    _assert_parsed_like_the_decoder(raws, grouped)
    # One length, two layouts (tag "ab" + key "c", tag "a" + key "bc"): not by template.
    mixed = [b"TAGS\x01ab\x02KEYS\x01c\x02", b"TAGS\x01a\x02KEYS\x01bc\x02", b"TAGS\x01a\x02"]
    assert _parse_grouped(pa.array(mixed, pa.large_binary())) is None
    _assert_parsed_like_the_decoder(mixed, _parse_properties(pa.array(mixed, pa.large_binary())))


def test_a_separator_where_the_first_row_has_none_is_left_to_the_item_parser():
    raws = [b"TAGS\x01ab\x02UNIQ_KEY\x01xyz\x02", b"TAGS\x01a\x02b\x01UNIQ_KEY\x01xyz\x02"]
    raws[1] = raws[1][: len(raws[0])]  # same length, different layout
    arr = pa.array(raws, pa.large_binary())
    assert _parse_uniform(arr) is None
    _assert_parsed_like_the_decoder(raws, _parse_properties(arr))


@pytest.mark.parametrize("key", ["k%03d", "k%d"], ids=["one-length", "a-few-lengths"])
def test_a_queue_of_same_shaped_messages_is_read_by_template(monkeypatch, key):
    """read_batches equals the per-record pull, and never parses item by item."""
    import rocketspark.message.arrow as arrow

    def no_items(props):
        raise AssertionError("the item parser was used")

    with tempfile.TemporaryDirectory() as root, MessageStore.open(root) as store:
        store.create_topic("t", queues=1)
        store.put_batch(
            [
                Message(
                    "t",
                    b"b%03d" % i,
                    tags="tg",
                    keys=[key % i],
                    properties={"p": f"v{i % 100:02d}"},
                )
                for i in range(500)
            ]
        )
        with monkeypatch.context() as m:
            m.setattr(arrow, "_parse_items", no_items)
            batches, _ = store.read_batches("t", 0, 0, None)
        got = pa.Table.from_batches(batches)
        pulled = store.pull("t", 0, 0, max_msgs=500).messages
        want = pa.Table.from_batches([messages_to_batch(pulled, store.config.broker_name)])
        assert got.to_pylist() == want.to_pylist()
        assert got.column("properties").to_pylist()[7] == [("p", "v07")]


_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=40),
            st.none() | _text,
            st.lists(_text, max_size=3),
            st.dictionaries(
                _text.filter(lambda t: t not in ("TAGS", "KEYS", "DELAY")),
                st.text(
                    alphabet=st.characters(
                        blacklist_characters="\x01\x02", blacklist_categories=("Cs",)
                    ),
                    max_size=6,
                ),
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_read_batches_equals_pull(tmp_path_factory, specs):
    root = tmp_path_factory.mktemp("rb")
    with MessageStore.open(root, mappedFileSizeCommitLog=4096) as store:
        store.create_topic("t", queues=1)
        store.put_batch(
            [Message("t", b, tags=tg, keys=ks, properties=pr) for b, tg, ks, pr in specs]
        )
        batches, nxt = store.read_batches("t", 0, 0, None)
        assert nxt == len(specs)
        got = pa.Table.from_batches(batches).to_pylist()
        pulled = store.pull("t", 0, 0, max_msgs=len(specs)).messages
        want = pa.Table.from_batches(
            [messages_to_batch(pulled, store.config.broker_name)]
        ).to_pylist()
        for g, w in zip(got, want, strict=True):
            g["properties"] = dict(g["properties"])
            w["properties"] = dict(w["properties"])
            assert g == w


def test_the_data_sources_schema_is_the_arrow_schema():
    """SCHEMA_DDL (what Spark is told) names ARROW_SCHEMA's fields, in order, with the
    Spark types of their Arrow types (until it is derived from ARROW_SCHEMA)."""
    from rocketspark.datasource.source import SCHEMA_FIELDS

    def spark_type(t: pa.DataType) -> str:
        if pa.types.is_list(t):
            return f"array<{spark_type(t.value_type)}>"
        if pa.types.is_map(t):
            return f"map<{spark_type(t.key_type)},{spark_type(t.item_type)}>"
        if pa.types.is_timestamp(t):
            return "timestamp"
        return {pa.string(): "string", pa.int32(): "int", pa.int64(): "bigint"}.get(t, str(t))

    assert SCHEMA_FIELDS == [(f.name, spark_type(f.type)) for f in ARROW_SCHEMA]


def test_drop_properties_takes_names_out_of_every_map_of_a_sliced_batch():
    from rocketspark.message.arrow import drop_properties

    maps = pa.array(
        [[("a", "1"), ("CLUSTER", "x")], None, [], [("TRACE_ON", "t")], [("b", "2")]],
        pa.map_(pa.string(), pa.string()),
    )
    batch = pa.RecordBatch.from_arrays([maps], names=["properties"])
    names = frozenset({"CLUSTER", "TRACE_ON"})
    assert drop_properties(batch, names).column(0).to_pylist() == [
        [("a", "1")],
        None,
        [],
        [],
        [("b", "2")],
    ]
    assert drop_properties(batch.slice(2), names).column(0).to_pylist() == [[], [], [("b", "2")]]
    assert drop_properties(batch.slice(4), names).column(0).to_pylist() == [[("b", "2")]]


# -- some columns only -------------------------------------------------------------------

_SOME = [
    ("body", "queueOffset"),
    ("queueOffset", "body"),
    ("tags",),
    ("keys", "uniqKey", "properties"),
    ("msgId", "storeHost", "bornHost", "sysFlag"),
    ("storeTimestamp", "bornTimestamp", "commitLogOffset", "flag", "reconsumeTimes"),
    tuple(reversed(COLUMN_NAMES)),
]


def _varied_store(root: str) -> MessageStore:
    store = MessageStore.open(root, mappedFileSizeCommitLog=4096)
    store.create_topic("t", queues=1)
    store.put_batch(
        [
            Message(
                "t",
                b"b%d" % i,
                tags=["a", "bb", None][i % 3],
                keys=[f"k{i}"] * (i % 2),
                properties={"p": "v" * (i % 4)} if i % 5 else {},
            )
            for i in range(60)
        ]
    )
    return store


def _columns(batches, names) -> dict:
    table = pa.Table.from_batches(batches)
    assert table.column_names == list(names)
    return {n: table.column(n).to_pylist() for n in names}


@pytest.mark.parametrize("names", _SOME, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("expression", ["*", "a || bb"])
def test_a_read_of_some_columns_gives_the_full_reads_values_in_their_order(names, expression):
    with tempfile.TemporaryDirectory() as root, _varied_store(root) as store:
        full, nxt = store.read_batches("t", 0, 0, None, expression)
        some, nxt2 = store.read_batches("t", 0, 0, None, expression, columns=names)
        assert nxt == nxt2 == 60
        want = pa.Table.from_batches(full)
        assert want.num_rows == (60 if expression == "*" else 40)
        assert _columns(some, names) == {n: want.column(n).to_pylist() for n in names}


def test_a_read_of_no_property_column_parses_no_properties_and_builds_no_ids(monkeypatch):
    import rocketspark.message.arrow as arrow

    def unwanted(*args):
        raise AssertionError("built for a column no one asked for")

    with tempfile.TemporaryDirectory() as root, _varied_store(root) as store:
        want = pa.Table.from_batches(store.read_batches("t", 0, 0, None)[0])
        for name in ("_parse_properties", "_msg_ids", "_hosts", "_split_keys"):
            monkeypatch.setattr(arrow, name, unwanted)
        some, _ = store.read_batches("t", 0, 0, None, columns=("body", "queueOffset"))
        assert _columns(some, ("body", "queueOffset")) == {
            "body": want.column("body").to_pylist(),
            "queueOffset": want.column("queueOffset").to_pylist(),
        }


def test_the_per_record_path_gives_the_columns_asked_for(monkeypatch):
    """Properties that are not UTF-8 go record by record: the same columns come out."""
    import rocketspark.message.arrow as arrow

    def not_utf8(props):
        raise _NotUtf8("a property is not UTF-8")

    names = ("keys", "body", "tags")
    with tempfile.TemporaryDirectory() as root, _varied_store(root) as store:
        want = pa.Table.from_batches(store.read_batches("t", 0, 0, None)[0])
        monkeypatch.setattr(arrow, "_parse_properties", not_utf8)
        some, _ = store.read_batches("t", 0, 0, None, "a", columns=names)
        rows = [r for r in want.to_pylist() if r["tags"] == "a"]
        assert _columns(some, names) == {n: [r[n] for r in rows] for n in names}
        empty = arrow.messages_to_batch([], "b", names)
        assert empty.schema.names == list(names) and empty.num_rows == 0


def test_a_column_the_rows_do_not_have_is_refused():
    from rocketspark.errors import ConfigError
    from rocketspark.message.arrow import row_schema

    assert row_schema(None) is ARROW_SCHEMA
    assert row_schema(("body",)).names == ["body"]
    with pytest.raises(ConfigError, match="no column 'offset' in the row schema .*queueOffset"):
        row_schema(("body", "offset"))


def test_rows_of_one_size_unevenly_spread_are_read_like_the_record_decoder():
    """Queue 0's records are all of one size (bodies and properties gathered as one
    matrix each) but lie at uneven distances (the other queue's records between
    them vary): every column equals the per-record pull's."""
    n = 300
    queues = [0 if i % 3 else 1 for i in range(n)]
    with tempfile.TemporaryDirectory() as root, MessageStore.open(root) as store:
        store.create_topic("t", queues=2)
        store.put_columns(
            [b"q0-%04d" % i if q == 0 else b"x" * (1 + i % 17) for i, q in enumerate(queues)],
            topic="t",
            tags=["tg" if q == 0 else "t" * (1 + i % 5) for i, q in enumerate(queues)],
            keys=[f"k{i:04d}" if q == 0 else f"a b{i}" for i, q in enumerate(queues)],
            properties=[{"p": f"v{i % 10}"} for i in range(n)],
            queue_ids=queues,
        )
        for q in (0, 1):
            batches, _ = store.read_batches("t", q, 0, None)
            pulled = store.pull("t", q, 0, max_msgs=n).messages
            want = messages_to_batch(pulled, store.config.broker_name)
            assert pa.Table.from_batches(batches).to_pylist() == want.to_pylist()


def test_msg_ids_and_hosts_of_several_hosts_and_offsets_past_4_gib():
    import numpy as np

    from rocketspark.message.arrow import HEADER_DTYPE, _hosts, _msg_ids
    from rocketspark.message.model import HostAddress
    from rocketspark.message.record import message_id

    for hosts in (1, 3):
        hdr = np.zeros(64, dtype=HEADER_DTYPE)
        hdr["store_ip"] = [0x7F000001 + (i % hosts) * 0x01010101 for i in range(64)]
        hdr["store_port"] = [10911 + (i % hosts) * 40000 for i in range(64)]
        hdr["born_ip"], hdr["born_port"] = hdr["store_ip"][::-1], hdr["store_port"][::-1]
        for phy in (np.arange(64) * 1000, (1 << 32) - 5 + np.arange(64) * 3, np.arange(64) << 40):
            phy = phy.astype(np.int64)
            hosts_of = [
                HostAddress(int(ip).to_bytes(4, "big"), int(port))
                for ip, port in zip(hdr["store_ip"], hdr["store_port"], strict=True)
            ]
            want = [message_id(h, int(p)) for h, p in zip(hosts_of, phy, strict=True)]
            assert _msg_ids(hdr, phy).to_pylist() == want
        assert _hosts(hdr, "store_ip", "store_port").to_pylist() == [str(h) for h in hosts_of]
        assert _hosts(hdr, "born_ip", "born_port").to_pylist() == [str(h) for h in hosts_of[::-1]]


@pytest.mark.parametrize(
    "texts",
    [["k1", "k2", "k3"], ["a b", "c"], ["", "x"], ["x", None], [" y", "z  w"], ["é", "ü"]],
)
def test_keys_texts_split_as_the_record_decoder_splits_them(texts):
    from rocketspark.message.arrow import _split_keys

    got = _split_keys(pa.array(texts, pa.string()), len(texts)).to_pylist()
    assert got == [None if t is None else [k for k in t.split(" ") if k] for t in texts]


@pytest.mark.parametrize("data", [b"\0\0\0\x02" * 2, b"\0\0\0\x01" * 4, b"\0\0\0\x03" * 3])
def test_sizes_smaller_than_their_own_field_are_corrupt_records(data):
    # (a size of 1-3 that divides the answer once reached a gather past its end)
    with pytest.raises(CorruptRecordError, match="pull answer: record"):
        record_positions(data)
