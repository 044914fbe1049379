"""The vectorised Arrow read path agrees with the per-record decoder."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketspark.store import Message, MessageStore
from rocketspark.store.message_codec import decode_properties
from rocketspark.store.record_batch import _parse_properties, messages_to_batch

_token = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "", "é", "x y", "\x01", "\x02",
                          "v1", "TAG", "TAGSS"])
_raw = st.lists(_token, max_size=12).map(lambda parts: "".join(parts).encode("utf-8"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_raw, min_size=1, max_size=8))
def test_parse_properties_matches_the_record_decoder(raws):
    arr = pa.array(raws, pa.large_binary())
    prop_map, tags, uniq, keys = _parse_properties(arr)
    for i, raw in enumerate(raws):
        want = decode_properties(raw)
        assert dict(prop_map[i].as_py()) == want, raw
        assert tags[i].as_py() == want.get("TAGS")
        assert uniq[i].as_py() == want.get("UNIQ_KEY")
        assert keys[i].as_py() == want.get("KEYS")


_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02 ",
                                       blacklist_categories=("Cs",)), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.none() | _text,
                          st.lists(_text, max_size=3),
                          st.dictionaries(_text.filter(lambda t: t not in ("TAGS", "KEYS",
                                                                           "DELAY")),
                                          st.text(alphabet=st.characters(
                                              blacklist_characters="\x01\x02",
                                              blacklist_categories=("Cs",)), max_size=6),
                                          max_size=3)),
                min_size=1, max_size=30))
def test_read_batches_equals_pull(tmp_path_factory, specs):
    root = tmp_path_factory.mktemp("rb")
    with MessageStore.open(root, mappedFileSizeCommitLog=4096) as store:
        store.create_topic("t", queues=1)
        store.put_batch([Message("t", b, tags=tg, keys=ks, properties=pr)
                         for b, tg, ks, pr in specs])
        batches, nxt = store.read_batches("t", 0, 0, None)
        assert nxt == len(specs)
        got = pa.Table.from_batches(batches).to_pylist()
        pulled = store.pull("t", 0, 0, max_msgs=len(specs)).messages
        want = pa.Table.from_batches([messages_to_batch(pulled, store.config.broker_name)]
                                     ).to_pylist()
        for g, w in zip(got, want, strict=True):
            g["properties"] = dict(g["properties"])
            w["properties"] = dict(w["properties"])
            assert g == w
