"""The exactly-once sink's one answer for its open halves, read from the ledger."""

from __future__ import annotations

import numpy as np

from rocketspark.client import TransactionState
from rocketspark.datasource.ledger import sink_answer
from rocketspark.message.model import MessageExt


def _half(offset: int, sink: str = "s1", **props: str) -> MessageExt:
    return MessageExt(
        topic="RMQ_SYS_TRANS_HALF_TOPIC",
        queue_id=0,
        queue_offset=offset,
        commitlog_offset=0,
        msg_id="",
        body=b"x",
        properties={"RS_SINK": sink, **props},
        born_timestamp=0,
        store_timestamp=0,
        born_host="127.0.0.1:1",
        store_host="127.0.0.1:10911",
        reconsume_times=0,
        sys_flag=4,
        flag=0,
        body_crc=0,
        store_size=0,
    )


def test_commit_if_pending_unknown_while_in_flight_rollback_otherwise():
    answer = sink_answer("s1", [(10, 13), (20, 21)], np.array([31, 30], dtype=np.int64))
    assert [answer(_half(o)) for o in (10, 12, 13, 20, 30, 31, 5)] == [
        TransactionState.COMMIT,
        TransactionState.COMMIT,
        TransactionState.ROLLBACK,
        TransactionState.COMMIT,
        TransactionState.UNKNOWN,
        TransactionState.UNKNOWN,
        TransactionState.ROLLBACK,
    ]
    # another sink's half (a shared producer group) is not this sink's to decide
    assert answer(_half(5, sink="s2")) is TransactionState.UNKNOWN
    # a copy a check put back answers for the half the sink was given
    assert answer(_half(99, RS_FIRST_HALF="11")) is TransactionState.COMMIT
    assert answer(_half(98, RS_FIRST_HALF="30")) is TransactionState.UNKNOWN


def test_with_nothing_pending_or_in_flight_every_half_of_the_sink_is_rolled_back():
    answer = sink_answer("s1", (), np.empty(0, dtype=np.int64))
    assert answer(_half(0)) is TransactionState.ROLLBACK


def test_the_sink_registers_its_answer_on_an_embedded_client_too(tmp_path):
    # (no broker asks an embedded store's producer back: registering does nothing)
    from rocketspark.client import ClientRef, close_all
    from rocketspark.datasource.ledger import register_answer
    from rocketspark.store import MessageStore

    path = str(tmp_path / "store")
    MessageStore.open(path).close()
    try:
        register_answer(ClientRef.embedded(path, {}).connect(), "rocketspark-sink-s1")
    finally:
        close_all()
