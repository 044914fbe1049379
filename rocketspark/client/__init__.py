"""The one interface the Spark side sees: ``connect()`` a :class:`Client`.

>>> from rocketspark.client import connect
>>> client = connect("/tmp/store")                       # doctest: +SKIP
>>> client.queues("orders")                              # doctest: +SKIP

:func:`connect` takes a :class:`ClientRef` or a store directory and returns
this process's client for it; backends are imported when first used (as
pyiceberg's ``load_catalog``), so importing this package opens nothing.
"""

from __future__ import annotations

from rocketspark.client.api import (
    ARROW_SCHEMA,
    Answer,
    Client,
    ClientRef,
    Halves,
    JobWrites,
    Message,
    MessageExt,
    MessageQueue,
    PutResult,
    SinkLedger,
    SubscriptionExpression,
    TopicInfo,
    TransactionState,
    validate_group,
)

__all__ = [
    "ARROW_SCHEMA",
    "Answer",
    "Client",
    "ClientRef",
    "Halves",
    "JobWrites",
    "Message",
    "MessageExt",
    "MessageQueue",
    "PutResult",
    "SinkLedger",
    "SubscriptionExpression",
    "TopicInfo",
    "TransactionState",
    "canonical_key",
    "close_all",
    "connect",
    "validate_group",
]


def connect(target: ClientRef | str) -> Client:
    """Return this process's client for ``target``: a ClientRef or a store directory.

    Raises StorePathError when a directory holds no store.
    """
    ref = ClientRef.embedded(target) if isinstance(target, str) else target
    if ref.kind == "embedded":
        from rocketspark.client import embedded

        return embedded.connect(ref)
    if ref.kind == "cluster":
        from rocketspark.client import remote

        return remote.connect(ref)
    raise ValueError(f"unknown client kind {ref.kind!r}")  # pragma: no cover


def close_all() -> None:
    """Close every client this process connected (at exit, and in tests)."""
    import sys

    for name in ("rocketspark.client.embedded", "rocketspark.client.remote"):
        backend = sys.modules.get(name)
        if backend is not None:
            backend.close_all()


def canonical_key(key: str) -> str | None:
    """The embedded store's broker.conf key that ``key`` names in any case, or None.

    Spark lower-cases option names (``rocketmq.flushdisktype``); the options
    passed to a backend (``rocketmq.<key>``) are its settings, so their
    spelling is the backend's to know.
    """
    from rocketspark.client.embedded import canonical_key as embedded_key

    return embedded_key(key)
