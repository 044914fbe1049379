"""The RocketMQs the end-to-end tests run against: one registry, one object per test.

``BACKENDS`` maps a backend's name to a function that makes a :class:`Backend`
(from a fresh directory and the broker settings a test needs); the ``client``
fixture of ``tests/client`` and the ``backend`` fixtures of the data source's
tests are parametrised over it (:data:`PARAMS`), so a backend joins every suite by
one entry here. Today: "embedded", a store directory made for the test; "cluster",
the run's real RocketMQ (marked ``cluster``); "serve", the run's ``rocketspark
serve`` reached by its NameServer address as a real broker is (marked ``serve``).

A cluster or a server is shared across tests (and a cluster across runs): a test
must not assume an empty RocketMQ. Tests take their topic, group and sink names from
:meth:`Backend.fresh_topic` / :meth:`Backend.fresh_name` (unique on every
backend, so the embedded run checks that too) and seed and verify through
:attr:`Backend.client` only. What the Client interface cannot tell (which
halves are open, which batch jobs are not ended) is asked of the Backend, so
each backend answers it its own way.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketspark.client import Client, ClientRef, MessageExt, MessageQueue, TransactionState
from rocketspark.message.model import PROPERTY_REAL_TOPIC

# Every delay level one second: a message sent back is due a second later.
FAST = {"messageDelayLevel": " ".join(["1s"] * 18)}


@dataclass(frozen=True)
class Backend:
    """One RocketMQ a test reaches: its client, and how Spark and the Python API reach it."""

    name: str
    ref: ClientRef
    options: dict[str, str]  # the data source's options that reach it (.options(**options))
    api: dict[str, Any]  # keyword arguments of deadletter's functions that reach it
    own: bool  # the test's alone (a store made for it), not shared with other tests
    _open_jobs: Callable[[], list[str]] = field(repr=False)
    # lists a shared backend's open halves of (topics, producer group)
    _open_halves: Callable[[Sequence[str], str | None], list[MessageExt]] | None = field(
        default=None, repr=False
    )
    settle: float = 0.0  # seconds settled_halves waits for halves the brokers end

    @property
    def client(self) -> Client:
        """This process's client of the backend (connected again after close_all)."""
        return self.ref.connect()

    # -- names: unique, as on a cluster shared with other tests --------------------------

    def fresh_name(self, prefix: str) -> str:
        """A topic, group or sink name no other test uses: ``prefix`` and a random suffix."""
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    def fresh_topic(self, prefix: str = "topic", *, queues: int | None = None) -> str:
        """A new topic's name (created with ``queues`` queues unless None)."""
        name = self.fresh_name(prefix)
        if queues is not None:
            self.client.create_topic(name, queues=queues)
        return name

    # -- what a test verifies ------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        return self.client.queues(topic)

    def broker(self, topic: str) -> str:
        """The broker of the topic's queues (the tests that name one expect one)."""
        (broker,) = {mq.broker for mq in self.queues(topic)}
        return broker

    def rows(self, topic: str, *, expression: str = "*") -> list[dict[str, Any]]:
        """Every stored row of ``topic`` (the source's schema), queue by queue in order."""
        client = self.client
        out: list[dict[str, Any]] = []
        for mq in client.queues(topic):
            start, end = client.min_offset(mq), client.max_offset(mq)
            while start < end:
                batches, nxt = client.read_batches(mq, start, end, expression=expression)
                out.extend(r for b in batches for r in b.to_pylist())
                if nxt <= start:
                    break
                start = nxt
        return out

    def messages(self, topic: str) -> list[MessageExt]:
        """Every stored message of ``topic`` with all its properties (by msgId)."""
        client = self.client
        return [client.get_message(r["msgId"]) for r in self.rows(topic)]

    def bodies(self, topic: str) -> list[str]:
        """The sorted bodies of ``topic`` (nothing if there is no such topic)."""
        if not self.client.has_topic(topic):
            return []
        return sorted(r["body"].decode() for r in self.rows(topic))

    def lag(self, group: str, topic: str) -> dict[MessageQueue, int]:
        """Per queue of ``topic``: messages the group has yet to consume."""
        client = self.client
        out = {}
        for mq in client.queues(topic):
            done = client.committed_offset(group, mq)
            out[mq] = client.max_offset(mq) - (client.min_offset(mq) if done is None else done)
        return out

    def open_halves(self, *topics: str, producer_group: str | None = None) -> list[MessageExt]:
        """The half messages still open for ``topics`` (of ``producer_group``), left open.

        A backend that is the test's own (``own``) answers every open half, whatever
        its topic; a shared one only the halves of the topics named (the test's own).
        """
        if self._open_halves is not None:
            return self._open_halves(topics, producer_group)
        seen: list[MessageExt] = []

        def keep(half: MessageExt) -> TransactionState:
            seen.append(half)
            return TransactionState.UNKNOWN

        # The embedded backend's check asks about every open half at once and leaves
        # those answered UNKNOWN where they are. (A cluster's would register ``keep``
        # for the brokers' check-backs: its backend lists them with open_halves.)
        self.client.check_transactions(producer_group, keep)
        if self.own:
            return seen
        return [h for h in seen if h.properties.get(PROPERTY_REAL_TOPIC) in topics]

    def settled_halves(
        self, *topics: str, producer_group: str | None = None, count: int = 0
    ) -> list[MessageExt]:
        """:meth:`open_halves`, once ``count`` are open or ``settle`` seconds have passed.

        An embedded store ends halves as it is told (no wait). A cluster's brokers end
        some by their check-backs (a half older than transactionTimeOut, checked every
        transactionCheckInterval) and its half and op topics are read a moment late:
        a test that asserts what is left open asks this.
        """
        deadline = time.monotonic() + self.settle
        while True:
            found = self.open_halves(*topics, producer_group=producer_group)
            if len(found) == count or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)

    def open_jobs(self, *jobs: str) -> list[str]:
        """The exactly-once batch jobs among ``jobs`` whose gate is not shut yet (sorted).

        A backend that is the test's own (``own``) answers every open job.
        """
        found = self._open_jobs()
        return found if self.own else [j for j in found if j in jobs]


def embedded(directory: Path, settings: Mapping[str, str]) -> Backend:
    """A store made for the test in ``directory``, with ``settings`` as broker.conf overrides."""
    from rocketspark.client.embedded import JOB_DIR
    from rocketspark.store import MessageStore

    path = str(directory / "store")
    MessageStore.open(path).close()  # an empty store: clients never create one
    jobs = os.path.join(path, "config", JOB_DIR)

    def open_jobs() -> list[str]:
        names = os.listdir(jobs) if os.path.isdir(jobs) else []
        return sorted(n.removesuffix(".lock") for n in names)

    return Backend(
        "embedded",
        ClientRef.embedded(path, settings),
        {"store": path, **{f"rocketmq.{k}": v for k, v in settings.items()}},
        {"store": path, "store_options": dict(settings)},
        True,
        open_jobs,
    )


def cluster(directory: Path, settings: Mapping[str, str], rocketmq: Any = None) -> Backend:
    """The run's real RocketMQ cluster (``rocketmq_cluster``: broker-a and broker-b).

    Shared by every test: ``own`` is False. Its brokers run with FAST's delay levels
    (``tests/helpers/cluster.py``); other broker ``settings`` cannot apply to a
    running cluster, so a test that needs them is not run here.
    """
    if rocketmq is None:
        raise RuntimeError("the cluster backend needs the rocketmq_cluster fixture")
    unusable = sorted(set(settings) - set(FAST))
    if unusable:
        import pytest

        pytest.skip(f"broker settings {unusable} apply to an embedded store only")
    namesrv = rocketmq.namesrv
    return Backend(
        "cluster",
        ClientRef.cluster(namesrv),
        {"nameServer": namesrv},
        {"name_server": namesrv},
        False,
        lambda: [],  # a cluster's batch jobs have no gate (client/remote_ledger.py)
        lambda topics, group: [
            h
            for h in _cluster_client(namesrv).open_halves(group)
            if h.properties.get(PROPERTY_REAL_TOPIC) in topics
        ],
        # check-backs after 3 s, every 2 s (tests/helpers/cluster.py), and the listing's lag
        settle=15.0,
    )


def _cluster_client(namesrv: str) -> Any:
    """The cluster's client (a RemoteClient: its open_halves is the cluster's own)."""
    return ClientRef.cluster(namesrv).connect()


def serve(directory: Path, settings: Mapping[str, str], server: Any = None) -> Backend:
    """The run's ``rocketspark serve`` (``rocketspark_serve``), reached as a cluster is:
    the remote client and the data source's ``nameServer`` option at its NameServer.

    Shared by every test: ``own`` is False. It serves with FAST's delay levels and the
    cluster's transactionTimeOut (``tests/helpers/serve.py``); other broker ``settings``
    cannot apply to a running server, so a test that needs them is not run here.
    """
    if server is None:
        raise RuntimeError("the serve backend needs the rocketspark_serve fixture")
    server.check()
    unusable = sorted(set(settings) - set(FAST))
    if unusable:
        import pytest

        pytest.skip(f"broker settings {unusable} apply to an embedded store only")
    namesrv = server.namesrv
    return Backend(
        "serve",
        ClientRef.cluster(namesrv),
        {"nameServer": namesrv},
        {"name_server": namesrv},
        False,
        lambda: [],  # the remote client's batch jobs have no gate (client/remote_ledger.py)
        lambda topics, group: [
            h
            for h in _cluster_client(namesrv).open_halves(group)
            if h.properties.get(PROPERTY_REAL_TOPIC) in topics
        ],
        # check-backs of halves older than 3 s, looked for every second
        settle=15.0,
    )


# The one list of backends; each takes a fresh directory and the broker settings.
BACKENDS: dict[str, Callable[..., Backend]] = {
    "embedded": embedded,
    "cluster": cluster,
    "serve": serve,
}
# The session fixture each shared backend is made from.
_SERVERS = {"cluster": "rocketmq_cluster", "serve": "rocketspark_serve"}


def _params() -> list[Any]:
    """BACKENDS' names as fixture parameters, a shared one marked with its name (its
    session fixture's mark), so that ``-m 'not serve'`` leaves the run's server alone."""
    import pytest

    return [
        pytest.param(name, marks=getattr(pytest.mark, name)) if name in _SERVERS else name
        for name in sorted(BACKENDS)
    ]


# What a fixture run on every backend is parametrised with: @pytest.fixture(params=PARAMS)
PARAMS = _params()


def make_backend(request: Any, directory: Path, settings: Mapping[str, str]) -> Backend:
    """The backend of a fixture parametrised over PARAMS (a shared one from its fixture).

    A test marked ``embedded_only("why")`` is skipped on the other backends, one marked
    ``not_on_serve("why")`` on serve, saying why.
    """
    only = request.node.get_closest_marker("embedded_only")
    if only is not None and request.param != "embedded":
        import pytest

        pytest.skip(only.args[0] if only.args else "about the embedded store")
    long = request.node.get_closest_marker("not_on_serve")
    if long is not None and request.param == "serve":
        import pytest

        pytest.skip(long.args[0] if long.args else "run on the other backends")
    if request.param in _SERVERS:
        server = request.getfixturevalue(_SERVERS[request.param])
        return BACKENDS[request.param](directory, settings, server)
    return BACKENDS[request.param](directory, settings)
