"""Starting a NameServer and a broker over one store: :func:`serve` and :class:`Served`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rocketspark.errors import ConfigError
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.broker import BrokerProcessors
from rocketspark.remoting.processors.common import BrokerIdentity
from rocketspark.remoting.processors.namesrv import NameServerProcessors
from rocketspark.remoting.server import Channel, RemotingServer, is_wildcard
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)


class Served:
    """A NameServer and a broker over one store, started by :func:`serve`."""

    def __init__(
        self,
        store: MessageStore,
        namesrv: RemotingServer,
        broker_server: RemotingServer,
        broker: BrokerProcessors,
    ):
        self.store = store
        self.namesrv = namesrv
        self.broker_server = broker_server
        self.broker = broker

    @property
    def namesrv_address(self) -> str:
        return self.namesrv.address

    @property
    def broker_address(self) -> str:
        return self.broker_server.address

    def stop(self) -> None:
        """Stop both ports and the hold service (the store stays open: its owner closes it)."""
        self.broker.stop()
        if self.namesrv is not self.broker_server:
            self.namesrv.stop()
        self.broker_server.stop()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    store: MessageStore,
    *,
    host: str = "127.0.0.1",
    namesrv_port: int = 9876,
    broker_port: int = 10911,
    advertised_host: str | None = None,
    acl: Callable[[RemotingCommand, Channel], RemotingCommand | None] | None = None,
) -> Served:
    """Start a NameServer on ``namesrv_port`` and a broker on ``broker_port`` over ``store``.

    Port 0 picks a free one; the same port for both serves both on one socket.
    Routes name the broker ``store.config.broker_name`` of cluster
    ``broker_cluster_name`` at ``advertised_host`` (default ``host``) and the broker
    port. A wildcard ``host`` (0.0.0.0, ::) needs ``advertised_host`` (ConfigError). ``acl`` (an
    ``access.AccessControl``) checks every request of the broker port first.
    """
    shown = advertised_host or host
    if is_wildcard(shown):
        raise ConfigError(
            f"the broker binds {host or 'every address'}: give the address clients reach it "
            f"at as advertised_host"
        )
    same = namesrv_port == broker_port and namesrv_port != 0
    broker_server = RemotingServer(host, broker_port, name="broker", access=acl).start()
    try:
        namesrv = broker_server if same else RemotingServer(host, namesrv_port, name="namesrv")
        identity = BrokerIdentity(
            store.config.broker_cluster_name,
            store.config.broker_name,
            f"{shown}:{broker_server.port}",
        )
        if store.config.listen_port != broker_server.port:
            log.warning(
                "store %s writes msgIds naming port %d (listenPort), the broker listens on "
                "%d: clients that look a message up by its msgId will not find this broker",
                store.root,
                store.config.listen_port,
                broker_server.port,
            )
        broker = BrokerProcessors(store, identity)
        broker.register(broker_server)
        ns = NameServerProcessors(store, identity)
        queue = namesrv.work_queue("namesrv", threads=2, capacity=10_000)
        for code, processor in ns.table().items():
            namesrv.register(code, processor, queue)
        if not same:
            namesrv.start()
    except BaseException:
        if "broker" in locals():
            broker.stop()
        broker_server.stop()
        raise
    return Served(store, namesrv, broker_server, broker)
