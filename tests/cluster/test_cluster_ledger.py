"""The exactly-once sinks' ledger on a cluster, and the check-back answer it gives.

Marked ``cluster``.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from rocketspark.client import ClientRef, TransactionState, close_all
from rocketspark.datasource.ledger import ORPHAN_MARGIN_MS, cluster_answer
from rocketspark.message.model import PROPERTY_SINK_ID, PROPERTY_WRITER_ID, HostAddress, MessageExt

pytestmark = pytest.mark.cluster


def _half(sink: str, writer: str, born: int) -> MessageExt:
    host = HostAddress.parse("127.0.0.1", 1)
    return MessageExt(
        "t",
        0,
        0,
        0,
        "",
        b"",
        {PROPERTY_SINK_ID: sink, PROPERTY_WRITER_ID: writer},
        born,
        born,
        host,
        host,
        0,
        4,
        0,
        0,
        0,
    )


def test_begin_and_finish_record_accepted_writers_and_answers_follow(rocketmq_cluster):
    client = ClientRef.cluster(rocketmq_cluster.namesrv).connect()
    ledger = client.sink_ledger()
    sink = f"s-{uuid.uuid4().hex[:10]}"
    assert ledger.get(sink) == (-1, None) and ledger.query(sink) is None
    ledger.begin(sink, 0, [], "q", ["w1", "w2"])
    assert ledger.get(sink) == (-1, (0, [])) and ledger.pending_query(sink) == "q"
    answer = cluster_answer(ledger)
    now = client.now_ms()
    assert answer(_half(sink, "w1", now)) is TransactionState.UNKNOWN  # being ended now
    ledger.finish(sink, 0, "q")
    fresh = client.sink_ledger()  # another process's view: read back from the brokers
    assert fresh.get(sink) == (0, None) and fresh.query(sink) == "q"
    entry = fresh.entry(sink, fresh=True)
    assert sorted(entry["accepted"]["0"]) == ["w1", "w2"]
    answer = cluster_answer(fresh)
    assert answer(_half(sink, "w2", now)) is TransactionState.COMMIT
    old = now - 10 * ORPHAN_MARGIN_MS
    assert answer(_half(sink, "w9", old)) is TransactionState.ROLLBACK  # no batch took it
    assert answer(_half(sink, "w9", now + 60_000)) is TransactionState.UNKNOWN  # next batch?
    other = dataclasses.replace(_half(sink, "w1", now), properties={})
    assert answer(other) is TransactionState.UNKNOWN  # not a sink's half
    close_all()
