"""What serve stores is what the embedded API stores: the same CommitLog bytes.

Two stores on one fixed clock: one written through ``serve`` (our remoting client's
single and batch sends), one with ``MessageStore.put`` / ``put_batch`` given the same
messages (the client's UNIQ_KEY included). Their records must be byte for byte equal.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from rocketspark.message.model import Message, MessageQueue
from rocketspark.message.properties import properties_text
from rocketspark.remoting.client import RemotingClient
from rocketspark.remoting.processors import serve
from rocketspark.store.message_store import MessageStore

NOW = 1_700_000_000_000


def _records(store: MessageStore, topic: str) -> list[bytes]:
    msgs = store.pull(topic, 0, 0, 100).messages
    return [bytes(store.record_view(m.commitlog_offset, m.store_size)) for m in msgs]


def test_serve_writes_the_embedded_bytes(tmp_path: Path) -> None:
    topic = f"golden-{uuid.uuid4().hex[:8]}"
    messages = [
        Message(
            topic,
            f"body-{i}".encode(),
            tags="TagA" if i % 2 else None,
            keys=(f"key{i}",) if i % 3 else (),
            properties={"UNIQ_KEY": f"7F0000010000{i:020X}", "color": "blue"},
            queue_id=0,
            born_timestamp=NOW - 5,
        )
        for i in range(6)
    ]
    with MessageStore.open(str(tmp_path / "embedded"), clock=lambda: NOW) as embedded:
        embedded.create_topic(topic, 1)
        embedded.put(messages[0])
        embedded.put_batch(messages[1:])
        expected = _records(embedded, topic)

    with MessageStore.open(str(tmp_path / "served"), clock=lambda: NOW) as store:
        store.create_topic(topic, 1)
        with serve(store, namesrv_port=0, broker_port=0) as srv:
            client = RemotingClient(srv.namesrv_address, timeout=10)
            try:
                mq = MessageQueue(topic, store.config.broker_name, 0)
                for m in messages:
                    client.send(
                        mq,
                        m.body,
                        producer_group="pg",
                        properties=properties_text(m.all_properties()),
                        born_timestamp=NOW - 5,
                    )
            finally:
                client.close()
        assert _records(store, topic) == expected
