"""Where ``rocketspark serve`` answers as RocketMQ's broker does and the embedded store
would not: what our remote client (and the data source on it) relies on of a broker.

Each test serves a store made in ``tmp_path`` on free ports, sends with our remoting
client and looks at the store directly.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from rocketspark.client import ClientRef
from rocketspark.client.remote import RemoteClient
from rocketspark.message.model import Message, MessageExt, TransactionState
from rocketspark.remoting.processors import serve
from rocketspark.store.message_store import MessageStore


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # halves are checked back after a second; every delay level is a second
    with MessageStore.open(
        str(tmp_path / "store"),
        listenPort=port,
        transactionTimeOut=1000,
        messageDelayLevel=" ".join(["1s"] * 18),
    ) as s:
        yield s


@pytest.fixture
def remote(store: MessageStore):
    with serve(store, namesrv_port=0, broker_port=store.config.listen_port) as srv:
        client = RemoteClient(ClientRef("cluster", srv.namesrv_address))
        yield client
        client.close()


def test_a_check_back_carries_the_half_under_its_real_topic_and_queue(
    remote: RemoteClient, store: MessageStore
) -> None:
    # (RocketMQ's sendCheckMessage sets REAL_TOPIC and REAL_QID on the half it sends;
    # our producer looks for the half's committed copy in that topic before it commits:
    # a half under the half topic is its own "committed copy", and was rolled back)
    topic, group = _name("orders"), _name("pg")
    remote.create_topic(topic, queues=2)
    asked: list[MessageExt] = []

    def answer(half: MessageExt) -> TransactionState:
        asked.append(half)
        return TransactionState.COMMIT

    remote.register_answer(group, answer)
    remote.prepare_batch([Message(topic, b"checked", queue_id=1)], producer_group=group)
    q0, q1 = remote.queues(topic)
    deadline = time.monotonic() + 20
    while remote.max_offset(q1) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert asked and {(h.topic, h.queue_id, h.body) for h in asked} == {(topic, 1, b"checked")}
    assert (remote.max_offset(q0), remote.max_offset(q1)) == (0, 1)
    assert store.open_transactions(group) == []
    assert [m.body for m in store.pull(topic, 1, 0, 10).messages] == [b"checked"]
