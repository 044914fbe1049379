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
from rocketspark.message.model import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
    Message,
    MessageExt,
    SysFlag,
    TransactionState,
    dlq_topic,
    retry_topic,
)
from rocketspark.message.properties import properties_text
from rocketspark.message.results import PutResult
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode
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


def test_a_delay_level_past_the_last_is_lowered_to_it(
    remote: RemoteClient, store: MessageStore
) -> None:
    # (RocketMQ's transformDelayLevelMessage; our producer's retry of a message that
    # failed 16 times asks for level 19: the embedded store refuses such a level)
    topic = _name("late")
    remote.create_topic(topic, queues=1)
    (mq,) = remote.queues(topic)
    remote.remoting.send(
        mq,
        b"late",
        producer_group=_name("pg"),
        properties=properties_text({PROPERTY_DELAY_TIME_LEVEL: "30"}),
        born_timestamp=int(time.time() * 1000),
    )
    levels = len(store.config.delay_levels_ms())
    (held,) = store.pull(SCHEDULE_TOPIC, levels - 1, 0, 10).messages  # the last level's
    assert held.delay_level == levels and held.properties[PROPERTY_REAL_TOPIC] == topic
    deadline = time.monotonic() + 20
    while remote.max_offset(mq) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [m.body for m in store.pull(topic, 0, 0, 10).messages] == [b"late"]


def test_a_send_to_a_retry_topic_past_max_reconsume_times_goes_to_the_dlq(
    remote: RemoteClient, store: MessageStore
) -> None:
    # (RocketMQ's handleRetryAndDLQ: our producer sends failed messages back to
    # %RETRY%group itself, with their reconsume times, and the broker decides)
    group = _name("g")
    remote.ensure_group(group)
    (mq,) = remote.queues(retry_topic(group))
    now = int(time.time() * 1000)
    for body, times in ((b"again", 16), (b"dead", 17)):
        remote.remoting.send(
            mq,
            body,
            producer_group=_name("pg"),
            properties=properties_text({PROPERTY_DELAY_TIME_LEVEL: str(3 + times - 1)}),
            born_timestamp=now,
            reconsume_times=times,
            max_reconsume_times=16,
        )
    (dead,) = store.pull(dlq_topic(group), 0, 0, 10).messages
    assert (dead.body, dead.reconsume_times, dead.delay_level) == (b"dead", 17, 0)
    deadline = time.monotonic() + 20
    while remote.max_offset(mq) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [m.body for m in store.pull(retry_topic(group), 0, 0, 10).messages] == [b"again"]


def test_a_commit_after_a_rollback_stores_the_committed_copy(
    remote: RemoteClient, store: MessageStore
) -> None:
    # (RocketMQ's EndTransactionProcessor reads the half, not how it was ended: a
    # producer's COMMIT after a check-back was answered ROLLBACK is delivered)
    topic, group = _name("orders"), _name("pg")
    remote.create_topic(topic, queues=2)
    (half,) = store.prepare_batch(
        [Message(topic, b"late", tags="t", keys=["k1", "k2"], queue_id=1)],
        producer_group=group,
    )
    (addr,) = remote.remoting.brokers()[store.config.broker_name].values()

    def end(half: PutResult, flag: int) -> None:
        remote.remoting.invoke(
            addr,
            RequestCode.END_TRANSACTION,
            h.EndTransactionRequestHeader(
                topic=topic,
                producer_group=group,
                tran_state_table_offset=half.queue_offset,
                commit_log_offset=half.commitlog_offset,
                commit_or_rollback=flag,
                msg_id=half.uniq_key,
            ),
        )

    end(half, SysFlag.TRANSACTION_ROLLBACK)
    assert store.transaction_status(half) == "rolled_back"
    assert store.pull(topic, 1, 0, 10).messages == []
    end(half, SysFlag.TRANSACTION_COMMIT)
    (m,) = store.pull(topic, 1, 0, 10).messages
    assert (m.body, m.tags, m.keys, m.uniq_key) == (b"late", "t", ["k1", "k2"], half.uniq_key)
    assert m.properties[PROPERTY_PRODUCER_GROUP] == group
    assert PROPERTY_REAL_TOPIC not in m.properties
    # and the other way: a rollback after a commit is answered, the copy stays
    (other,) = store.prepare_batch([Message(topic, b"kept", queue_id=0)], producer_group=group)
    store.commit_transaction(other)
    end(other, SysFlag.TRANSACTION_ROLLBACK)
    assert store.transaction_status(other) == "committed"
    assert [m.body for m in store.pull(topic, 0, 0, 10).messages] == [b"kept"]
