"""The embedded RocketMQ message store (no Spark inside).

>>> from rocketspark.store import MessageStore, Message
>>> with MessageStore.open("/tmp/store") as store:                # doctest: +SKIP
...     store.create_topic("orders", queues=4)
...     store.put(Message("orders", b"body", tags="created", keys=["o-1"]))

Names are imported lazily so that a module such as ``rocketspark.message.record`` can be
used without loading the whole store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Message": "rocketspark.message.model",
    "MessageExt": "rocketspark.message.model",
    "SysFlag": "rocketspark.message.model",
    "MessageStore": "rocketspark.store.message_store",
    "TopicInfo": "rocketspark.message.model",
    "PullResult": "rocketspark.message.results",
    "PullStatus": "rocketspark.message.results",
    "PutResult": "rocketspark.message.results",
    "PutStatus": "rocketspark.message.results",
    "RecoveryReport": "rocketspark.store.recovery",
    "MessageStoreConfig": "rocketspark.store.config",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.message.model import Message, MessageExt, SysFlag, TopicInfo
    from rocketspark.message.results import PullResult, PullStatus, PutResult, PutStatus
    from rocketspark.store.config import MessageStoreConfig
    from rocketspark.store.message_store import MessageStore
    from rocketspark.store.recovery import RecoveryReport


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rocketspark.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
