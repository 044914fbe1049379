"""RemotingClient: one small method per request a client of a RocketMQ cluster makes.

What it adds to :mod:`~rocketspark.remoting.connection`:

- **NameServers with failover.** ``"ns1:9876;ns2:9876"``: requests for routes
  go to the NameServer that answered last, and on a connection error or
  timeout to the next one, until each was tried once (RocketMQ's
  ``NettyRemotingClient.getAndCreateNameserverChannel``).
- **Routes cached and refreshed.** A topic's route is kept for
  ``ROUTE_TTL`` seconds (the Java client polls every 30 s) and fetched again
  at once when a broker it names cannot be reached, so queues added and
  brokers gone are seen.
- **Which broker serves a queue.** Writes and offsets go to the master;
  pulls go to the broker id the last pull answer suggested
  (``suggestWhichBrokerId``: a slave when the master is behind on memory),
  falling back to the master when that member is gone.
- **ACL.** With :class:`~rocketspark.remoting.acl.Credentials`, every request
  is signed (AccessKey, Signature); the secret is never logged or printed.
- **Heartbeats.** A client that produces transactions or commits group
  offsets registers its producer and consumer groups with every master
  (HEART_BEAT, every ``HEARTBEAT_INTERVAL`` seconds while open): a broker
  sends CHECK_TRANSACTION_STATE only to a connected producer of the half's
  group, and creates a consumer group on its first heartbeat.

Errors name the request and the address: RemotingTimeoutError and
RemotingConnectError (retriable), RemotingCommandError with the broker's
response code and remark, UnknownTopicError for TOPIC_NOT_EXIST.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rocketspark.errors import (
    ConfigError,
    NoMasterError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
    UnknownTopicError,
)
from rocketspark.message.fastjson import loads_lenient
from rocketspark.message.model import MessageQueue
from rocketspark.message.results import PullStatus
from rocketspark.remoting import headers as h
from rocketspark.remoting.acl import Credentials
from rocketspark.remoting.codes import PullSysFlag, RequestCode, ResponseCode, request_name
from rocketspark.remoting.command import Body, RemotingCommand
from rocketspark.remoting.connection import (
    AwaitedResponse,
    Connection,
    Connections,
    Handler,
    check_response,
    split_address,
)
from rocketspark.remoting.fault import LatencyFaults
from rocketspark.remoting.heartbeat import Heartbeats
from rocketspark.remoting.route import MASTER_ID, TopicRoute
from rocketspark.remoting.template import PullFrames, SendFrames

__all__ = ["PullAnswer", "RemotingClient", "SendAnswer", "parse_namesrv"]

log = logging.getLogger(__name__)

ROUTE_TTL = 30.0  # seconds a topic route is used before it is fetched again
DEFAULT_TIMEOUT = 10.0  # seconds for a request's answer
# A long-polling pull waits this much longer than the broker holds it.
SUSPEND_MARGIN = 5.0
CLUSTER = "DefaultCluster"

_PULL_STATUS: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def parse_namesrv(text: str) -> list[str]:
    """``"host:port;host:port"`` (or commas) → the addresses; ConfigError naming the bad one."""
    addrs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise ConfigError(f"option nameServer: no NameServer address in {text!r} (host:port;...)")
    for a in addrs:
        try:
            split_address(a)
        except ConfigError:
            raise ConfigError(
                f"option nameServer: {a!r} is not host:port (several: host:port;host:port)"
            ) from None
    return addrs


@dataclass(frozen=True, slots=True)
class PullAnswer:
    """A PULL_MESSAGE answer: records (CommitLog layout) and where to pull next."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_broker_id: int
    body: Body | None  # FOUND: the records, back to back


@dataclass(frozen=True, slots=True)
class SendAnswer:
    """A send's answer: the queue, its offset and ids (RocketMQ's SendResult)."""

    mq: MessageQueue
    queue_offset: int
    offset_msg_id: str  # the broker's id: store host + CommitLog offset (several: comma-joined)
    transaction_id: str | None
    broker_addr: str


def _pull_header(
    mq: MessageQueue,
    offset: int,
    max_nums: int,
    group: str,
    expression: str,
    suspend_ms: int,
    max_bytes: int | None,
) -> h.PullMessageRequestHeader:
    sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
    return h.PullMessageRequestHeader(
        consumer_group=group,
        topic=mq.topic,
        queue_id=mq.queue_id,
        queue_offset=offset,
        max_msg_nums=max_nums,
        sys_flag=int(sys_flag),
        commit_offset=0,
        suspend_timeout_millis=suspend_ms,
        subscription=expression,
        sub_version=0,
        expression_type="TAG",
        max_msg_bytes=max_bytes,
        broker_name=mq.broker,
    )


def _client_id() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return f"{ip}@{os.getpid()}#rocketspark#{time.monotonic_ns()}"


class RemotingClient:
    """A client of one RocketMQ cluster, reached through its NameServers; thread-safe."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        *,
        credentials: Credentials | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 3.0,
        client_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.namesrv = parse_namesrv(namesrv) if isinstance(namesrv, str) else list(namesrv)
        self.credentials = credentials
        self.timeout = timeout
        self.client_id = client_id or _client_id()
        self.faults = LatencyFaults()
        self._clock = clock
        self._connections = Connections(connect_timeout=connect_timeout)
        self._ns_index = random.randrange(len(self.namesrv))
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[TopicRoute, float]] = {}
        self._pull_from: dict[MessageQueue, int] = {}
        self._pull_frames: dict[tuple[MessageQueue, str, str], PullFrames | None] = {}
        self._send_frames_of: dict[tuple[MessageQueue, str, bool, bool], SendFrames | None] = {}
        self.heartbeats = Heartbeats(self)
        self.register_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, self.heartbeats.running_info)

    def __repr__(self) -> str:
        return f"RemotingClient({';'.join(self.namesrv)!r})"

    # -- plumbing --------------------------------------------------------------------------

    def command(
        self,
        code: int,
        header: h.Header | Mapping[str, str] | None = None,
        body: Body | None = None,
    ) -> RemotingCommand:
        """A request with ``header``'s fields, signed when the client has credentials."""
        ext = header.to_ext_fields() if isinstance(header, h.Header) else dict(header or {})
        if self.credentials is not None:
            self.credentials.sign(ext, body)
        return RemotingCommand.request(code, ext, body=body)

    def invoke(
        self,
        address: str,
        code: int,
        header: h.Header | Mapping[str, str] | None = None,
        body: Body | None = None,
        *,
        timeout: float | None = None,
        expected: Iterable[int] = (ResponseCode.SUCCESS,),
    ) -> RemotingCommand:
        """Send one request to ``address`` and check its answer's code (see ``check_response``)."""
        try:
            response = self._connections.invoke(
                address, self.command(code, header, body), timeout or self.timeout
            )
        except RemotingConnectError:
            self._forget_routes_to(address)
            raise
        return check_response(
            response, expected=tuple(expected), request_code=code, address=address
        )

    def invoke_async(
        self,
        address: str,
        code: int,
        header: h.Header | Mapping[str, str] | None = None,
        body: Body | None = None,
        *,
        timeout: float | None = None,
    ) -> Future[RemotingCommand]:
        try:
            return self._connections.get(address).invoke_async(
                self.command(code, header, body), timeout or self.timeout
            )
        except RemotingConnectError:
            self._forget_routes_to(address)
            raise

    def invoke_encoded(
        self,
        address: str,
        code: int,
        encodes: Sequence[Callable[[int], list[Body]]],
        *,
        timeout: float | None = None,
    ) -> list[Future[RemotingCommand]]:
        """:meth:`invoke_async` of requests given encoded (``Connection.invoke_async_encoded``:
        frames a template made, sent together)."""
        try:
            return self._connections.get(address).invoke_async_encoded(
                code, encodes, timeout or self.timeout
            )
        except RemotingConnectError:
            self._forget_routes_to(address)
            raise

    def invoke_awaited(
        self,
        address: str,
        code: int,
        encode: Callable[[int], list[Body]],
        *,
        timeout: float | None = None,
    ) -> AwaitedResponse:
        """One request given encoded whose answer the caller reads on its own thread soon
        (``Connection.invoke_awaited``: no timer, no Future)."""
        try:
            return self._connections.get(address).invoke_awaited(
                code, encode, timeout or self.timeout
            )
        except RemotingConnectError:
            self._forget_routes_to(address)
            raise

    def _forget_routes_to(self, address: str) -> None:
        """Drop the cached routes naming ``address``, which refused a connection: the next
        request asks the NameServers (which forget a broker whose connection closed), so
        reads move to a member still up, as RocketMQ's consumers do."""
        with self._lock:
            for topic, (route, _) in list(self._routes.items()):
                if any(address in b.addrs.values() for b in route.broker_datas):
                    del self._routes[topic]

    def invoke_oneway(
        self, address: str, code: int, header: h.Header | Mapping[str, str] | None = None
    ) -> None:
        self._connections.get(address).invoke_oneway(self.command(code, header))

    def register_handler(self, code: int, handler: Handler) -> None:
        """Serve the brokers' requests of ``code`` (e.g. CHECK_TRANSACTION_STATE)."""
        self._connections.register_handler(code, handler)

    def close(self) -> None:
        """Unregister from the brokers, stop heartbeats and close every connection."""
        if self.heartbeats.closed.is_set():
            return
        self.heartbeats.closed.set()
        if self.heartbeats.registered:
            self.heartbeats.unregister()
        self._connections.close_all()

    def register_producer(self, group: str) -> None:
        """Heartbeat as a producer of ``group`` (check-backs come to this client)."""
        self.heartbeats.register_producer(group)

    def register_consumer(self, group: str, topic: str | None) -> None:
        """Heartbeat as a consumer of ``group`` (see :class:`Heartbeats`)."""
        self.heartbeats.register_consumer(group, topic)

    def cached_routes(self) -> list[TopicRoute]:
        """The routes this client holds now (for heartbeats: the masters it knows)."""
        with self._lock:
            return [route for route, _ in self._routes.values()]

    # -- NameServer ------------------------------------------------------------------------

    def invoke_namesrv(
        self,
        code: int,
        header: h.Header | Mapping[str, str] | None = None,
        *,
        expected: Iterable[int] = (ResponseCode.SUCCESS,),
    ) -> RemotingCommand:
        """Ask the NameServers in turn, from the last that answered; raise the last error."""
        errors: list[str] = []
        n = len(self.namesrv)
        for i in range(n):
            k = (self._ns_index + i) % n
            addr = self.namesrv[k]
            try:
                response = self.invoke(addr, code, header, expected=expected)
            except (RemotingConnectError, RemotingTimeoutError) as e:
                errors.append(str(e))
                continue
            self._ns_index = k
            return response
        raise RemotingConnectError(
            f"no NameServer answered {request_name(code)}: " + "; ".join(errors),
            address=";".join(self.namesrv),
        )

    def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route (cached for ROUTE_TTL s); UnknownTopicError if it has none."""
        now = self._clock()
        cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[1] < ROUTE_TTL:
            return cached[0]
        response = self.invoke_namesrv(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            h.GetRouteInfoRequestHeader(topic=topic),
            expected=(ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST),
        )
        if response.code == ResponseCode.TOPIC_NOT_EXIST or response.body is None:
            with self._lock:
                self._routes.pop(topic, None)
            raise UnknownTopicError(
                f"topic {topic!r} does not exist on the cluster (NameServer "
                f"{';'.join(self.namesrv)})"
            )
        route = TopicRoute.parse(topic, response.body)
        with self._lock:
            self._routes[topic] = (route, now)
        return route

    def has_topic(self, topic: str) -> bool:
        try:
            self.route(topic)
        except UnknownTopicError:
            return False
        return True

    def cluster_info(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_INFO: ``brokerAddrTable`` and ``clusterAddrTable``."""
        response = self.invoke_namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
        return loads_lenient(bytes(response.body or b"{}").decode("utf-8"))

    def brokers(self, cluster: str | None = None) -> dict[str, dict[int, str]]:
        """Broker name → {broker id: address}, of ``cluster`` (None: every cluster)."""
        info = self.cluster_info()
        names: set[str] | None = None
        if cluster is not None:
            names = set((info.get("clusterAddrTable") or {}).get(cluster) or ())
        out = {}
        for name, data in (info.get("brokerAddrTable") or {}).items():
            if names is None or name in names:
                out[name] = {int(k): v for k, v in (data.get("brokerAddrs") or {}).items()}
        return dict(sorted(out.items()))

    def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic the NameServers route."""
        response = self.invoke_namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        data = loads_lenient(bytes(response.body or b"{}").decode("utf-8"))
        return sorted(data.get("topicList") or ())

    # -- which broker ------------------------------------------------------------------------

    def master(self, topic: str, broker_name: str) -> str:
        """The master address of ``broker_name`` in ``topic``'s route (refreshed once)."""
        for refresh in (False, True):
            b = self.route(topic, refresh=refresh).broker(broker_name)
            if b is not None and b.master:
                return b.master
        raise NoMasterError(
            f"broker {broker_name!r} of topic {topic!r} has no master in the NameServers' "
            f"route ({';'.join(self.namesrv)})"
        )

    def broker_master(self, broker_name: str) -> str:
        """The master address of ``broker_name``: from a cached route, else the cluster info."""
        for route, _ in list(self._routes.values()):
            b = route.broker(broker_name)
            if b is not None and b.master:
                return b.master
        addr = self.brokers().get(broker_name, {}).get(MASTER_ID)
        if addr is None:
            raise RemotingError(
                f"broker {broker_name!r} has no master in the NameServers' cluster info "
                f"({';'.join(self.namesrv)})"
            )
        return addr

    def connection(self, address: str) -> Connection:
        """The connection to ``address`` (for one-way requests sent in a loop)."""
        return self._connections.get(address)

    def read_address(self, mq: MessageQueue) -> str:
        """Where to pull ``mq`` from: the member the last answer suggested, else the master."""
        return self._member(mq, self._pull_from.get(mq, MASTER_ID))

    def _member(self, mq: MessageQueue, broker_id: int) -> str:
        """The address of member ``broker_id`` of ``mq``'s broker group, else its master's,
        else any member's (``BrokerData.address``; the route refreshed once)."""
        for refresh in (False, True):
            b = self.route(mq.topic, refresh=refresh).broker(mq.broker)
            if b is not None:
                addr = b.address(broker_id)
                if addr is not None:
                    return addr
        raise RemotingError(
            f"broker {mq.broker!r} of topic {mq.topic!r} is not in the NameServers' "
            f"route ({';'.join(self.namesrv)})"
        )

    # -- offsets -------------------------------------------------------------------------------

    def _offset(self, code: int, mq: MessageQueue, header: h.Header) -> int:
        # the master, or while the group has none (it died), the member reads fall back
        # to: a slave answers with what it can serve
        response = self.invoke(self._member(mq, MASTER_ID), code, header)
        return int(response.ext_fields["offset"])

    def max_offset(self, mq: MessageQueue) -> int:
        return self._offset(
            RequestCode.GET_MAX_OFFSET,
            mq,
            h.GetMaxOffsetRequestHeader(
                topic=mq.topic, queue_id=mq.queue_id, broker_name=mq.broker
            ),
        )

    def min_offset(self, mq: MessageQueue) -> int:
        return self._offset(
            RequestCode.GET_MIN_OFFSET,
            mq,
            h.GetMinOffsetRequestHeader(
                topic=mq.topic, queue_id=mq.queue_id, broker_name=mq.broker
            ),
        )

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._offset(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            mq,
            h.SearchOffsetRequestHeader(
                topic=mq.topic,
                queue_id=mq.queue_id,
                timestamp=timestamp_ms,
                broker_name=mq.broker,
            ),
        )

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq`` on its broker; None if it has none."""
        response = self.invoke(
            self.master(mq.topic, mq.broker),
            RequestCode.QUERY_CONSUMER_OFFSET,
            h.QueryConsumerOffsetRequestHeader(
                consumer_group=group,
                topic=mq.topic,
                queue_id=mq.queue_id,
                # else a group that never committed reads as offset 0 of a queue whose
                # first message is still in memory
                set_zero_if_not_found=False,
                broker_name=mq.broker,
            ),
            expected=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        offset = int(response.ext_fields["offset"])
        return None if offset < 0 else offset

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        """Commit the group's next offset of ``mq`` on its master (synchronously)."""
        header = h.UpdateConsumerOffsetRequestHeader(
            consumer_group=group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            commit_offset=offset,
            broker_name=mq.broker,
        )
        addr = self.master(mq.topic, mq.broker)
        try:
            self.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET, header)
        except RemotingCommandError as e:
            if e.code != ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                raise
            self.create_group(group, [addr])
            self.invoke(addr, RequestCode.UPDATE_CONSUMER_OFFSET, header)

    # -- pull --------------------------------------------------------------------------------

    def pull_async(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        *,
        group: str,
        expression: str = "*",
        suspend_ms: int = 0,
        max_bytes: int | None = None,
        address: str | None = None,
    ) -> Future[RemotingCommand]:
        """Send a PULL_MESSAGE for ``mq`` from ``offset``; :meth:`pull_answer` reads its answer.

        ``suspend_ms`` > 0 asks the broker to hold the request until a message
        arrives or that time passes (long polling).
        """
        if not suspend_ms and max_bytes is None:
            frames = self._frames(mq, group, expression)
            if frames is not None:
                return self._send_pulls(frames, mq, [(offset, max_nums)], address)[0]
        header = _pull_header(mq, offset, max_nums, group, expression, suspend_ms, max_bytes)
        return self.invoke_async(
            address or self.read_address(mq),
            RequestCode.PULL_MESSAGE,
            header,
            timeout=self.timeout + suspend_ms / 1000.0 + (SUSPEND_MARGIN if suspend_ms else 0),
        )

    def pull_many(
        self,
        mq: MessageQueue,
        asks: Sequence[tuple[int, int]],
        *,
        group: str,
        expression: str = "*",
        address: str | None = None,
    ) -> list[Future[RemotingCommand]]:
        """:meth:`pull_async` of each ``(offset, max_nums)`` of ``asks``, sent together.

        The requests go out in one ``sendmsg`` (and the broker's answers tend to come
        back in one read): a range read asks for several pulls at a time.
        """
        frames = self._frames(mq, group, expression)
        if frames is None:
            return [
                self.pull_async(mq, o, n, group=group, expression=expression, address=address)
                for o, n in asks
            ]
        return self._send_pulls(frames, mq, asks, address)

    def _frames(self, mq: MessageQueue, group: str, expression: str) -> PullFrames | None:
        """The pull frames of a queue, group and expression (None: a signed client's)."""
        if self.credentials is not None:
            return None  # each request is signed: its frame is the general encoder's
        key = (mq, group, expression)
        frames = self._pull_frames.get(key)
        if frames is None and key not in self._pull_frames:
            header = _pull_header(mq, 0, 1, group, expression, 0, None)
            frames = self._pull_frames[key] = PullFrames.of(header)
        return frames

    def _send_pulls(
        self,
        frames: PullFrames,
        mq: MessageQueue,
        asks: Sequence[tuple[int, int]],
        address: str | None,
    ) -> list[Future[RemotingCommand]]:
        return self.invoke_encoded(
            address or self.read_address(mq),
            RequestCode.PULL_MESSAGE,
            [functools.partial(frames.frame, offset, n) for offset, n in asks],
        )

    def pull_answer(self, mq: MessageQueue, response: RemotingCommand, address: str) -> PullAnswer:
        """Read a pull's answer; remember the broker it suggests for the next pull."""
        status = _PULL_STATUS.get(response.code)
        if status is None:
            check_response(response, request_code=RequestCode.PULL_MESSAGE, address=address)
            raise AssertionError("unreachable")
        ext = response.ext_fields
        try:  # PullMessageResponseHeader's fields, read without building the header
            suggest = int(ext["suggestWhichBrokerId"])
            answer = PullAnswer(
                status,
                int(ext["nextBeginOffset"]),
                int(ext["minOffset"]),
                int(ext["maxOffset"]),
                suggest,
                response.body if status is PullStatus.FOUND else None,
            )
        except (KeyError, ValueError):
            h.PullMessageResponseHeader.from_ext_fields(ext)  # raises, naming the field
            raise
        if suggest != self._pull_from.get(mq, MASTER_ID):
            self._pull_from[mq] = suggest
        return answer

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        *,
        group: str,
        expression: str = "*",
        suspend_ms: int = 0,
        max_bytes: int | None = None,
    ) -> PullAnswer:
        """Pull up to ``max_nums`` messages of ``mq`` from ``offset`` (see :meth:`pull_async`)."""
        address = self.read_address(mq)
        future = self.pull_async(
            mq,
            offset,
            max_nums,
            group=group,
            expression=expression,
            suspend_ms=suspend_ms,
            max_bytes=max_bytes,
            address=address,
        )
        return self.pull_answer(mq, future.result(), address)

    # -- send --------------------------------------------------------------------------------

    def _send_request(
        self,
        mq: MessageQueue,
        body: Body,
        producer_group: str,
        properties: str,
        born_timestamp: int,
        sys_flag: int,
        flag: int,
        batch: bool,
        reconsume_times: int | None,
        max_reconsume_times: int | None,
    ) -> tuple[str, int, h.Header]:
        header = h.SendMessageRequestHeader(
            producer_group=producer_group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp,
            flag=flag,
            properties=properties,
            reconsume_times=reconsume_times,
            max_reconsume_times=max_reconsume_times,
            batch=batch,
            broker_name=mq.broker,
        ).to_v2()
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        return self.master(mq.topic, mq.broker), code, header

    def send(
        self,
        mq: MessageQueue,
        body: Body,
        *,
        producer_group: str,
        properties: str,
        born_timestamp: int,
        sys_flag: int = 0,
        flag: int = 0,
        batch: bool = False,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        timeout: float | None = None,
    ) -> SendAnswer:
        """SEND_MESSAGE_V2 (or SEND_BATCH_MESSAGE with ``batch``) to ``mq``'s master.

        Records the broker's latency for queue selection (:attr:`faults`); a
        failure marks the broker unavailable for a while and is raised.
        """
        future, addr, started = self.send_async(
            mq,
            body,
            producer_group=producer_group,
            properties=properties,
            born_timestamp=born_timestamp,
            sys_flag=sys_flag,
            flag=flag,
            batch=batch,
            reconsume_times=reconsume_times,
            max_reconsume_times=max_reconsume_times,
            timeout=timeout,
            awaited=True,
        )
        return self.send_answer(mq, future, addr, started)

    def send_async(
        self,
        mq: MessageQueue,
        body: Body,
        *,
        producer_group: str,
        properties: str,
        born_timestamp: int,
        sys_flag: int = 0,
        flag: int = 0,
        batch: bool = False,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        timeout: float | None = None,
        awaited: bool = False,
    ) -> tuple[Future[RemotingCommand] | AwaitedResponse, str, float]:
        """Start a send (see :meth:`send`); :meth:`send_answer` reads its answer (with
        ``awaited``, on the caller's thread and soon: an :class:`AwaitedResponse`, not a Future)."""
        frames = None
        if self.credentials is None and max_reconsume_times is None:
            # (a signed request's frame is the general encoder's: its signature covers it)
            frames = self._send_frames(mq, producer_group, batch, reconsume_times is not None)
        future: Future[RemotingCommand] | AwaitedResponse
        if frames is None:
            addr, code, header = self._send_request(
                mq,
                body,
                producer_group,
                properties,
                born_timestamp,
                sys_flag,
                flag,
                batch,
                reconsume_times,
                max_reconsume_times,
            )
            started = time.monotonic()
            try:
                future = self.invoke_async(addr, code, header, body, timeout=timeout)
            except RemotingConnectError:
                self.faults.record(mq.broker, 0, failed=True, reachable=False)
                raise
            return future, addr, started
        addr = self.master(mq.topic, mq.broker)
        encode = functools.partial(
            frames.frame, body, sys_flag, born_timestamp, flag, properties, reconsume_times
        )
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        started = time.monotonic()
        try:
            if awaited:
                future = self.invoke_awaited(addr, code, encode, timeout=timeout)
            else:
                (future,) = self.invoke_encoded(addr, code, [encode], timeout=timeout)
        except RemotingConnectError:
            self.faults.record(mq.broker, 0, failed=True, reachable=False)
            raise
        return future, addr, started

    def _send_frames(
        self, mq: MessageQueue, producer_group: str, batch: bool, reconsume: bool
    ) -> SendFrames | None:
        """The send frames of a queue and group (None: a header they cannot make)."""
        key = (mq, producer_group, batch, reconsume)
        frames = self._send_frames_of.get(key)
        if frames is None and key not in self._send_frames_of:
            _, code, header = self._send_request(
                mq, b"", producer_group, "", 0, 0, 0, batch, 0 if reconsume else None, None
            )
            assert isinstance(header, h.SendMessageRequestHeaderV2)
            frames = self._send_frames_of[key] = SendFrames.of(code, header)
        return frames

    def send_answer(
        self,
        mq: MessageQueue,
        future: Future[RemotingCommand] | AwaitedResponse,
        addr: str,
        started: float,
    ) -> SendAnswer:
        """Wait for a send's answer; record the broker's latency; raise a failure."""
        try:
            response = check_response(
                future.result(),
                request_code=RequestCode.SEND_MESSAGE_V2,
                address=addr,
            )
        except (RemotingConnectError, RemotingTimeoutError) as e:
            self.faults.record(
                mq.broker,
                (time.monotonic() - started) * 1000,
                failed=True,
                reachable=not isinstance(e, RemotingConnectError),
            )
            raise
        except RemotingCommandError:
            self.faults.record(mq.broker, (time.monotonic() - started) * 1000, failed=True)
            raise
        self.faults.record(mq.broker, (time.monotonic() - started) * 1000)
        ext = response.ext_fields
        try:  # SendMessageResponseHeader's fields, read without building the header
            queue_id = int(ext["queueId"])
            return SendAnswer(
                mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker, queue_id),
                int(ext["queueOffset"]),
                ext["msgId"],
                ext.get("transactionId"),
                addr,
            )
        except (KeyError, ValueError):
            h.SendMessageResponseHeader.from_ext_fields(ext)  # raises, naming the field
            raise

    def end_transaction(self, address: str, header: h.EndTransactionRequestHeader) -> None:
        """END_TRANSACTION, one-way as RocketMQ's producer sends it."""
        self.invoke_oneway(address, RequestCode.END_TRANSACTION, header)

    def send_back(self, address: str, header: h.ConsumerSendMsgBackRequestHeader) -> None:
        """CONSUMER_SEND_MSG_BACK to the broker that holds the message."""
        self.invoke(address, RequestCode.CONSUMER_SEND_MSG_BACK, header)

    # -- messages by key and id ------------------------------------------------------------

    def query_message(
        self,
        address: str,
        topic: str,
        key: str,
        max_num: int,
        begin_ms: int,
        end_ms: int,
        *,
        unique: bool = False,
    ) -> Body | None:
        """QUERY_MESSAGE: the records of ``topic`` indexed under ``key`` on one broker
        (``unique``: ``key`` is a UNIQ_KEY, as RocketMQ's queryMessageByUniqKey asks)."""
        fields = h.QueryMessageRequestHeader(
            topic=topic,
            key=key,
            max_num=max_num,
            begin_timestamp=begin_ms,
            end_timestamp=end_ms,
        ).to_ext_fields()
        if unique:
            fields["_UNIQUE_KEY_QUERY"] = "true"
        response = self.invoke(
            address,
            RequestCode.QUERY_MESSAGE,
            fields,
            expected=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
        return response.body if response.code == ResponseCode.SUCCESS else None

    def view_message(self, address: str, commitlog_offset: int) -> Body:
        """VIEW_MESSAGE_BY_ID: the record at a CommitLog offset of the broker at ``address``."""
        response = self.invoke(
            address,
            RequestCode.VIEW_MESSAGE_BY_ID,
            h.ViewMessageRequestHeader(offset=commitlog_offset),
        )
        return response.body or b""

    # -- administration ----------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        queues: int | Mapping[str, int],
        *,
        cluster: str | None = None,
        perm: int = 6,
    ) -> TopicRoute:
        """UPDATE_AND_CREATE_TOPIC on the masters, then wait until the NameServers route it.

        ``queues``: read and write queues per master, as ``mqadmin updateTopic -c``
        makes them, or a mapping of broker name to its queue count.
        """
        masters = {
            name: ids[MASTER_ID] for name, ids in self.brokers(cluster).items() if MASTER_ID in ids
        }
        if not masters:
            raise RemotingError(
                f"no master broker in cluster {cluster or '(any)'} to create {topic!r} on"
            )
        counts = dict(queues) if isinstance(queues, Mapping) else dict.fromkeys(masters, queues)
        unknown = sorted(set(counts) - set(masters))
        if unknown:
            raise RemotingError(f"no master broker {unknown[0]!r} to create {topic!r} on")
        for name, n in counts.items():
            header = h.CreateTopicRequestHeader(
                topic=topic, read_queue_nums=n, write_queue_nums=n, perm=perm
            )
            self.invoke(masters[name], RequestCode.UPDATE_AND_CREATE_TOPIC, header)
        deadline = time.monotonic() + max(self.timeout, 30.0)
        while True:  # brokers register the topic with the NameServers on their next beat
            try:
                route = self.route(topic, refresh=True)
                if {q.broker_name for q in route.queue_datas} >= set(counts):
                    return route
            except UnknownTopicError:
                pass
            if time.monotonic() > deadline:
                raise RemotingTimeoutError(
                    f"topic {topic!r} was created on {sorted(counts)} but the NameServers "
                    f"do not route it yet",
                    address=";".join(self.namesrv),
                )
            time.sleep(0.2)

    def create_group(self, group: str, addresses: Iterable[str]) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP with RocketMQ's defaults on each broker."""
        body = json.dumps(
            {
                "groupName": group,
                "consumeEnable": True,
                "consumeFromMinEnable": True,
                "consumeBroadcastEnable": True,
                "retryQueueNums": 1,
                "retryMaxTimes": 16,
                "brokerId": MASTER_ID,
                "whichBrokerWhenConsumeSlowly": 1,
                "notifyConsumerIdsChangedEnable": True,
            }
        ).encode()
        for addr in addresses:
            self.invoke(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
