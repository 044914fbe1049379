"""SEND_BATCH_MESSAGE's columnar path stores what the Message path stores.

A batch send is decoded into columns (``_batch_rows``) and stored with
``MessageStore.put_serialized``, without a Message per row. Two stores on one
fixed clock, with the same UNIQ_KEY generator: one is sent the batch through
``SendProcessor``, the other is given the batch's Messages (``_batch_messages``,
the path a batch took before) through ``put_batch`` / ``prepare_batch``. Their
CommitLogs must be byte for byte equal, and the answers alike.
"""

from __future__ import annotations

import copy
import struct
from pathlib import Path

import pytest

from rocketspark.message.model import SysFlag
from rocketspark.message.record import MAX_PROPERTIES_LENGTH
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors import send
from rocketspark.remoting.processors.send import SendProcessor, _batch_messages, _batch_rows
from rocketspark.store.message_store import MessageStore

NOW = 1_700_000_000_000
TOPIC = "orders"
SMALL = {"maxHashSlotNum": 64, "maxIndexNum": 4096}  # index files small enough to compare
HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN


def _entry(body: bytes, props: str, flag: int = 0) -> bytes:
    """One message of a batch body (MessageDecoder.encodeMessage)."""
    raw = props.encode("utf-8")
    total = HEAD.size + len(body) + 2 + len(raw)
    return HEAD.pack(total, 0, 0, flag, len(body)) + body + len(raw).to_bytes(2, "big") + raw


def _uniq(i: int) -> str:
    return f"7F00000100002A9F0000{i:012X}"


def _java_rows(n: int) -> list[tuple[bytes, str, int]]:
    """Messages as Java's producer encodes them (properties in its HashMap's order: KEYS,
    UNIQ_KEY, WAIT, TAGS), with user properties, keys, flags and odd cases between."""
    rows = []
    for i in range(n):
        props = f"UNIQ_KEY\x01{_uniq(i)}\x02WAIT\x01true\x02TAGS\x01Tag{i % 3}\x02"
        if i % 4 == 1:
            props = f"KEYS\x01order-{i} id{i}\x02" + props
        if i % 5 == 2:
            props = f"color\x01blue\x02{props}size\x01{i}\x02"
        rows.append((f"body-{i}".encode() * (1 + i % 3), props, i % 7))
    rows[3] = (b"no own id", "WAIT\x01true\x02TAGS\x01A\x02", 0)  # the store makes a UNIQ_KEY
    rows[4] = (b"no properties", "", 0)
    rows[5] = (b"keys spaced", f"KEYS\x01 a  b \x02UNIQ_KEY\x01{_uniq(5)}\x02", 0)
    rows[6] = (b"empty tag", f"TAGS\x01\x02UNIQ_KEY\x01{_uniq(6)}\x02", 0)
    rows[7] = (b"non-ascii", "name\x01caf\u00e9 \u4e2d\x02TAGS\x01\u00e9t\u00e9\x02", 0)
    rows[8] = (b"no last separator", f"UNIQ_KEY\x01{_uniq(8)}\x02TAGS\x01B", 0)
    return rows


# Java's producer gives the batch a UNIQ_KEY of its own (DefaultMQProducer.batch) and
# WAIT; the batch's properties are added to each message's, their values win.
JAVA_BATCH = f"UNIQ_KEY\x01{'B' * 32}\x02WAIT\x01true\x02"


def _request(
    rows: list[tuple[bytes, str, int]],
    *,
    batch_props: str = JAVA_BATCH,
    queue_id: int = 1,
    sys_flag: int = 0,
) -> RemotingCommand:
    header = h.SendMessageRequestHeaderV2(
        producer_group="pg",
        topic=TOPIC,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=NOW - 5,
        properties=batch_props,
        batch=True,
    )
    body = b"".join(_entry(b, p, f) for b, p, f in rows)
    return RemotingCommand.request(
        RequestCode.SEND_BATCH_MESSAGE, header.to_ext_fields(), body=body
    )


def _commit_log(root: Path) -> bytes:
    """The start of the first CommitLog segment (sparse: what the tests write, then 0s;
    none when nothing was written)."""
    path = root / "commitlog" / f"{0:020d}"
    if not path.exists():
        return b""
    with open(path, "rb") as f:
        return f.read(1 << 20)


def _queues_and_index(root: Path) -> list[tuple[str, bytes]]:
    """The ConsumeQueue files by path, and the index files' bytes in name order (names
    are times of day)."""
    queues = sorted(
        (str(p.relative_to(root)), p.read_bytes())
        for p in (root / "consumequeue").rglob("*")
        if p.is_file()
    )
    index = [("index", p.read_bytes()) for p in sorted((root / "index").glob("*"))]
    return queues + index


def _both(
    tmp_path: Path, request: RemotingCommand, **config: object
) -> tuple[RemotingCommand, Exception | None]:
    """Send ``request`` to one store, its Messages to another; compare the CommitLogs.

    Returns the answer and what the Message path raised (None: it stored them).
    """
    header = h.SendMessageRequestHeaderV2.from_ext_fields(request.ext_fields)
    with (
        MessageStore.open(str(tmp_path / "sent"), clock=lambda: NOW, **SMALL, **config) as sent,
        MessageStore.open(str(tmp_path / "put"), clock=lambda: NOW, **SMALL, **config) as put,
    ):
        for s in (sent, put):
            s.create_topic(TOPIC, 4)
        put.encoder.ids = copy.copy(sent.encoder.ids)  # the same generated UNIQ_KEYs
        answer = SendProcessor(sent).send(request, None)  # type: ignore[arg-type]
        error = None
        try:
            messages = _batch_messages(header, bytes(request.body or b""))
            if header.sys_flag & SysFlag.TRANSACTION_PREPARED:
                put.prepare_batch(messages, producer_group=header.producer_group)
            else:
                put.put_batch(messages)
        except Exception as e:
            error = e
        assert _commit_log(tmp_path / "sent") == _commit_log(tmp_path / "put")
        sent.flush()
        put.flush()
        assert _queues_and_index(tmp_path / "sent") == _queues_and_index(tmp_path / "put")
    return answer, error


def test_a_java_batch_takes_the_columnar_path_and_stores_the_message_paths_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _java_rows(40)
    request = _request(rows, batch_props=JAVA_BATCH + "batchOnly\x01x\x02")
    header = h.SendMessageRequestHeaderV2.from_ext_fields(request.ext_fields)
    decoded = _batch_rows(header, bytes(request.body or b""))
    assert decoded is not None and len(decoded.bodies) == 40
    # the Message path is not taken
    real = send._batch_messages
    monkeypatch.setattr(send, "_batch_messages", lambda *a: pytest.fail("the Message path"))
    with MessageStore.open(str(tmp_path / "probe"), clock=lambda: NOW) as probe:
        probe.create_topic(TOPIC, 4)
        assert SendProcessor(probe).send(request, None).code == ResponseCode.SUCCESS  # type: ignore[arg-type]
    monkeypatch.setattr(send, "_batch_messages", real)
    answer, error = _both(tmp_path, request)
    assert error is None and answer.code == ResponseCode.SUCCESS
    ids = answer.ext_fields["msgId"].split(",")
    assert len(ids) == 40 and answer.ext_fields["queueId"] == "1"


@pytest.mark.parametrize(
    "case",
    [
        "round robin",
        "no batch properties",
        "batch properties without a UNIQ_KEY",
        "a batch property overrides a row's",
        "a name twice",
        "a delay level",
        "a prepared transaction",
        "a malformed property",
        "an empty body",
        "invalid utf-8",
        "properties too long",
        "a body too large",
        "a queue out of range",
        "one message",
    ],
)
def test_every_batch_stores_what_the_message_path_stores(tmp_path: Path, case: str) -> None:
    """Batches the columnar path takes or leaves to the Message path: the same bytes,
    the same answer to a batch either refuses."""
    rows = _java_rows(12)
    kw: dict = {}
    if case == "round robin":
        kw["queue_id"] = -1
    elif case == "no batch properties":
        kw["batch_props"] = ""
    elif case == "batch properties without a UNIQ_KEY":
        kw["batch_props"] = "WAIT\x01true\x02"
    elif case == "a batch property overrides a row's":
        kw["batch_props"] = "WAIT\x01false\x02"
    elif case == "a name twice":
        rows[2] = (b"twice", "a\x011\x02b\x012\x02a\x013\x02", 0)
    elif case == "a delay level":
        rows[9] = (b"later", f"DELAY\x013\x02UNIQ_KEY\x01{_uniq(9)}\x02", 0)
    elif case == "a prepared transaction":
        kw["sys_flag"] = SysFlag.TRANSACTION_PREPARED
    elif case == "a malformed property":
        rows[2] = (b"bad", "a\x01b\x01c\x02", 0)
    elif case == "an empty body":
        rows[2] = (b"", "a\x01b\x02", 0)
    elif case == "invalid utf-8":
        rows[2] = (b"bad", "a\x01b\x02", 0)
    elif case == "properties too long":
        rows[10] = (b"long", f"big\x01{'x' * (MAX_PROPERTIES_LENGTH - 10)}\x02", 0)
    elif case == "a body too large":
        rows[10] = (b"x" * (4 * 1024 * 1024 + 1), "a\x01b\x02", 0)
    elif case == "a queue out of range":
        kw["queue_id"] = 9
    elif case == "one message":
        rows = rows[:1]
    request = _request(rows, **kw)
    if case == "invalid utf-8":
        request = RemotingCommand.request(
            request.code,
            request.ext_fields,
            body=bytes(request.body or b"").replace(b"a\x01b", b"a\x01\xff"),
        )
    answer, error = _both(tmp_path, request)
    if error is None:
        assert answer.code == ResponseCode.SUCCESS, answer.remark
    else:
        assert answer.code != ResponseCode.SUCCESS
        assert answer.remark == str(error)


def _uniform_rows(n: int, keys: str = "k{i:04d}") -> list[tuple[bytes, str, int]]:
    """Like messages of one shape (the same sizes and property names), as a Java
    producer's batch of them is."""
    return [
        (
            f"body {i:06d}".encode() * 8,
            f"KEYS\x01{keys.format(i=i % 10)}\x02UNIQ_KEY\x01{_uniq(i)}\x02WAIT\x01true\x02"
            f"TAGS\x01T{i % 3}\x02",
            -(i % 3),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("case", "same_shape"),
    [
        ("java", True),
        ("own ids", True),
        ("a batch property overrides a row's", True),
        ("keys with spaces", True),
        ("only UNIQ_KEY and WAIT", True),
        ("a body of another length", False),
        ("a separator in a value", False),
        ("a non-ascii value", False),
        ("another name", False),
    ],
)
def test_a_batch_of_one_shape_stores_what_the_message_path_stores(
    tmp_path: Path, case: str, same_shape: bool
) -> None:
    """Batches decoded as one byte matrix (``_same_shape``), and ones that look alike
    but are not (the row loop or the Message path takes them): the same bytes."""
    rows = _uniform_rows(64, " {i}  z " if case == "keys with spaces" else "k{i:04d}")
    batch_props = JAVA_BATCH
    if case == "own ids":
        batch_props = "WAIT\x01true\x02"
    elif case == "a batch property overrides a row's":
        batch_props = "WAIT\x01false\x02more\x01y\x02"
    elif case == "only UNIQ_KEY and WAIT":
        rows = [
            (b, f"UNIQ_KEY\x01{_uniq(i)}\x02WAIT\x01true\x02", 0)
            for i, (b, _, _) in enumerate(rows)
        ]
    elif case == "a body of another length":
        body, props, flag = rows[9]
        rows[9] = (body[:-1], props.replace("TAGS\x01T0", "TAGS\x01T0x"), flag)
    elif case == "a separator in a value":
        body, props, flag = rows[9]
        rows[9] = (body, props.replace("TAGS\x01T0", "TAGS\x01\x020"), flag)
    elif case == "a non-ascii value":
        body, props, flag = rows[9]
        rows[9] = (body[:-1], props.replace("TAGS\x01T0", "TAGS\x01\u00e9"), flag)
    elif case == "another name":
        body, props, flag = rows[9]
        rows[9] = (body, props.replace("WAIT", "WAIt"), flag)
    request = _request(rows, batch_props=batch_props)
    header = h.SendMessageRequestHeaderV2.from_ext_fields(request.ext_fields)
    named = dict(p.split("\x01") for p in batch_props.split("\x02") if p)
    extra = [(k.encode(), v.encode(), f"{k}\x01{v}\x02".encode()) for k, v in named.items()]
    decoded = send._same_shape(
        bytes(request.body or b""), extra, named.get("UNIQ_KEY"), header.born_timestamp, 0
    )
    assert (decoded is not None) == same_shape
    answer, error = _both(tmp_path, request)
    assert error is None and answer.code == ResponseCode.SUCCESS, answer.remark


@pytest.mark.parametrize("rows", [_java_rows(20), _uniform_rows(20)], ids=["mixed", "one shape"])
def test_an_ipv6_store_stores_a_batch_per_record(tmp_path: Path, rows: list) -> None:
    """A store with an IPv6 host has no columnar path: put_serialized gives the rows
    to put_batch as Messages, the same bytes as the Message path."""
    answer, error = _both(tmp_path, _request(rows), brokerIP1="::1")
    assert error is None and answer.code == ResponseCode.SUCCESS, answer.remark
