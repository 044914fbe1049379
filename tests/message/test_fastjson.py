"""fastjson's dialect: a broker's config JSON with bare integer keys, read and written."""

from __future__ import annotations

import json

import pytest

from rocketspark.message.fastjson import dumps_fastjson, loads_lenient

# consumerOffset.json as a RocketMQ 4.9 broker writes it: fastjson PrettyFormat,
# tabs, integer queue ids as bare keys, the closing brace of a map on its own line.
BROKER_CONSUMER_OFFSET_4 = (
    "{\n"
    '\t"offsetTable":{\n'
    '\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0\n'
    "\t\t},\n"
    '\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:250,2:250,3:249\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)


def test_lenient_reader_parses_a_brokers_consumer_offset_json():
    data = loads_lenient(BROKER_CONSUMER_OFFSET_4)
    assert data == {
        "offsetTable": {
            "%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4": {"0": 0},
            "TopicTest@please_rename_unique_group_name_4": {"0": 250, "1": 250, "2": 250, "3": 249},
        }
    }
    assert loads_lenient('{"offsetTable":{"TopicA@GroupA":{0:120,1:98}}}') == {
        "offsetTable": {"TopicA@GroupA": {"0": 120, "1": 98}}
    }


def test_lenient_reader_leaves_strings_and_strict_json_alone():
    text = r'{"a":"{0:1,2:3}","b\"{4:":{ -1 : 2 ,7:[1,2,{8:9}]},"c":"x\\"}'
    assert loads_lenient(text) == {
        "a": "{0:1,2:3}",
        'b"{4:': {"-1": 2, "7": [1, 2, {"8": 9}]},
        "c": "x\\",
    }
    strict = {"offsetTable": {"T@G": {"0": 1}}, "s": "é {1:2}", "n": [1, 2.5, None, True]}
    assert loads_lenient(json.dumps(strict)) == strict
    assert loads_lenient(json.dumps(strict, indent="\t")) == strict


@pytest.mark.parametrize("bad", ["", "{", '{"a":}', "{0:1", "{a:1}", '{"a":1} x'])
def test_lenient_reader_still_rejects_garbage(bad):
    with pytest.raises(ValueError):
        loads_lenient(bad)


def test_fastjson_writer():
    obj = {"offsetTable": {"TopicA@GroupA": {0: 120, 1: 98}}}
    assert dumps_fastjson(obj) == '{"offsetTable":{"TopicA@GroupA":{0:120,1:98}}}'
    assert dumps_fastjson(obj, bare_int_keys=False) == (
        '{"offsetTable":{"TopicA@GroupA":{"0":120,"1":98}}}'
    )
    assert json.loads(dumps_fastjson(obj, bare_int_keys=False)) == loads_lenient(
        dumps_fastjson(obj)
    )
    assert dumps_fastjson({"s": 'é"\n', "l": [True, None, -3]}) == (
        '{"s":"é\\"\\n","l":[true,null,-3]}'
    )
    with pytest.raises(TypeError):
        dumps_fastjson({1.5: 0})
