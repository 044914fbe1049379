"""A real RocketMQ cluster for a test session: a NameServer and two masters on loopback.

``tests/conftest.py`` starts one ``Cluster`` per test run, when a test first asks for the
``rocketmq_cluster`` fixture, and stops it at the end of the run. Two masters,
``broker-a`` and ``broker-b`` of ``DefaultCluster``, so a topic's route spans brokers.
Everything a test does to the cluster goes through RocketMQ's own Java client
(``RocketClient`` in ``tests/helpers/java``), in one long-running JVM (``JavaService``)
unless a test asks for a JVM of its own (``run`` / ``process``).

Topics live for the whole run and every test sees them: a test makes its own names
(``unique_topic``) or creates its topics with ``create_topic``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.helpers.rocketmq import (
    Broker,
    JavaPrograms,
    JavaService,
    RocketMQ,
    decode_message,
    encode_message,
)

BROKERS = ("broker-a", "broker-b")
CLUSTER = "DefaultCluster"
# Broker settings of the cluster (besides broker_conf's loopback-only defaults).
SETTINGS: dict[str, object] = {
    # small segments: a test run writes little, and each broker maps one segment ahead
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
    # half messages older than 3 s are checked back every 2 s (defaults: 6 s, 30 s), so a
    # producer's check listener is asked within a test
    "transactionTimeOut": 3000,
    "transactionCheckInterval": 2000,
    # a commit or rollback is recorded (an op message) at most 0.5 s later (default 3 s,
    # which with the 3 s above has decided transactions checked back too)
    "transactionOpBatchInterval": 500,
    # SQL92 property filters for consumers
    "enablePropertyFilter": "true",
    # every delay level one second (as the embedded backend's FAST): a message sent back
    # for retry is due a second later
    "messageDelayLevel": " ".join(["1s"] * 18),
    # The timer wheel (5.x timer messages, pop consumers) forces its mapped files to disk
    # every second by default: a fifth of a core per idle broker here, for the whole run.
    # Forcing is only about power loss: a SIGKILLed broker's writes are in the page cache.
    "timerFlushIntervalMs": 60_000,
}

_names = itertools.count()


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test of this run uses."""
    return f"{prefix}-{int(time.time() * 1000) % 10**9}-{next(_names)}"


class Cluster:
    """A NameServer and the masters ``broker-a`` and ``broker-b``, and a Java client.

    Attributes: ``namesrv`` ("127.0.0.1:port"), ``brokers`` (name -> ``Broker``: ``addr``,
    ``port``, ``store``), ``timings`` (seconds each start took).
    """

    def __init__(self, programs: JavaPrograms, run_dir: Path) -> None:
        self.timings: dict[str, float] = {}
        t0 = time.monotonic()
        self.rocketmq = RocketMQ(run_dir, programs)
        self.timings["namesrv"] = time.monotonic() - t0
        self.namesrv = self.rocketmq.addr
        self.brokers: dict[str, Broker] = {}
        self.service: JavaService | None = None
        try:
            for name in BROKERS:
                self.brokers[name] = self.rocketmq.add_broker(
                    name, run_dir / name / "store", cluster=CLUSTER, **SETTINGS
                )
                self.brokers[name].start()
            self.service = JavaService(programs, self.namesrv, run_dir / "java-client")
            self.service.wait_started()
            for name, broker in self.brokers.items():
                broker.wait_boot()
                assert broker.server is not None and broker.server.booted is not None
                self.timings[name] = broker.server.booted
            t1 = time.monotonic()
            self._wait_routed(BROKERS)
            self.timings["routed"] = time.monotonic() - t1
        except BaseException:
            self.close()
            raise
        self.timings["java client"] = self.service.ready_after or 0.0
        self.timings["total"] = time.monotonic() - t0

    @property
    def java(self) -> JavaService:
        assert self.service is not None
        return self.service

    def close(self) -> None:
        """Stop the Java client, the brokers (SIGTERM, together), then the NameServer."""
        if self.service is not None:
            self.service.close()
        running = [b.server for b in self.brokers.values() if b.running and b.server]
        for server in running:
            server.proc.terminate()  # SIGTERM: each broker's shutdown hook runs
        for server in running:
            try:
                server.proc.wait(120)
            except subprocess.TimeoutExpired:
                server.kill()
        self.rocketmq.close()

    def pids(self) -> dict[str, int]:
        """The process id of each running JVM: namesrv, the brokers, the Java client."""
        pids = {"namesrv": self.rocketmq.namesrv.proc.pid, "java client": self.java.proc.pid}
        for name, b in self.brokers.items():
            if b.running and b.server is not None:
                pids[name] = b.server.proc.pid
        return pids

    def addr(self, broker: str) -> str:
        """The address ("127.0.0.1:port") of a broker."""
        return self.brokers[broker].addr

    @property
    def broker_addrs(self) -> dict[str, str]:
        return {name: b.addr for name, b in self.brokers.items()}

    def _wait_routed(self, brokers: Iterable[str], topics: Sequence[str] = ()) -> None:
        names = list(brokers)
        self.java.request(
            "ready",
            brokers=names,
            addrs={n: self.brokers[n].addr for n in names},
            topics=list(topics),
            timeoutMs=120_000,
        )

    def cluster_info(self) -> list[dict]:
        """What the NameServer lists: brokerName, brokerId, addr and cluster of each broker."""
        return sorted(self.java.request("cluster"), key=lambda r: (r["brokerName"], r["brokerId"]))

    # ---- topics and offsets (the admin client) ----

    def create_topic(
        self, topic: str, queues: int = 4, brokers: Sequence[str] = BROKERS
    ) -> list[dict]:
        """Create ``topic`` with ``queues`` read and write queues on each of ``brokers``;
        return its route (brokerName, readQueueNums, writeQueueNums, perm per broker) once
        the NameServer has it."""
        return self.java.request(
            "createTopic",
            topic=topic,
            readQueues=queues,
            writeQueues=queues,
            brokers=list(brokers),
        )

    def route(self, topic: str) -> list[dict]:
        """The NameServer's route of ``topic``: one row per broker."""
        return self.java.request("route", topic=topic)

    def consumer_progress(self, group: str, topic: str) -> list[dict]:
        """What ``mqadmin consumerProgress`` shows: per queue brokerName, queueId,
        brokerOffset (the queue's max offset), consumerOffset (committed; 0 if none),
        pullOffset and lastTimestamp, sorted by broker and queue."""
        return self.java.request("consumerProgress", group=group, topic=topic)

    def consumer_status(self, group: str) -> list[dict]:
        """What ``mqadmin consumerStatus`` gathers: per connected client of ``group``, its
        clientId, language, consumeType, and its running info's properties and topics."""
        return self.java.request("consumerStatus", group=group)

    def broker_config(self, broker: str) -> dict[str, str]:
        """The running configuration of ``broker`` (every setting, as strings)."""
        (conf,) = self.java.request("brokerConfig", broker=broker)
        return conf

    def query(self, topic: str, keys: Sequence[str]) -> dict[str, list[int]]:
        """Look keys up in the brokers' IndexFiles: key -> sorted commit log offsets."""
        return {r["key"]: r["phys"] for r in self.java.request("query", topic=topic, keys=keys)}

    # ---- brokers ----

    def kill(self, broker: str) -> None:
        """Crash ``broker`` (SIGKILL) and wait until the NameServer no longer lists it."""
        self.brokers[broker].kill()
        self.java.request("gone", broker=broker, timeoutMs=60_000)

    def restart(self, broker: str) -> float:
        """Crash ``broker`` if it runs, start it again on its store and port, and wait until
        it is routed again; return the seconds it took to boot."""
        b = self.brokers[broker]
        if b.running:
            self.kill(broker)
        t0 = time.monotonic()
        b.start()
        b.wait_boot()
        booted = time.monotonic() - t0
        self._wait_routed([broker])
        took = time.monotonic() - t0
        self.timings[f"{broker} restart {b.starts - 1} boot"] = booted
        self.timings[f"{broker} restart {b.starts - 1} routed"] = took
        return took

    # ---- RocketMQ's Java producer and consumer ----

    def produce(
        self,
        topic: str,
        messages: Sequence[dict],
        *,
        batch: int = 0,
        group: str | None = None,
        retries: int = 2,
        check: bool = True,
        separate: bool = False,
        timeout: float = 300.0,
    ) -> list[dict]:
        """Send ``messages`` with ``DefaultMQProducer``, in order; return one SendResult per
        message: index, status, msgId, offsetMsgId, brokerName, queueId, queueOffset (or
        index and error; raised unless ``check=False``); a batch's messages also have
        batchMsgId, the batch's UNIQ_KEY: RocketMQ 5.3 stores the batch's properties after
        each message's, so consumers read every message of a batch with that msgId.

        A message is a dict: ``body`` (bytes or str), and optionally ``tags``, ``keys`` (a
        list), ``properties`` (user properties), ``delayLevel``, ``topic`` (default
        ``topic``) and ``queue`` (``(broker, queue id)``: sent to that queue). ``batch=n``
        sends runs of up to n consecutive messages of one topic and queue as one batch.
        ``separate``: in a JVM of its own (a few seconds more) instead of the run's client.
        """
        spec = self.produce_spec(topic, messages, batch=batch, group=group, retries=retries)
        if separate:
            rows = self.run("produce", spec, timeout=timeout)
        else:
            rows = self.java.request("produce", timeout=timeout, **spec)
        rows.sort(key=lambda r: r["index"])
        if check:
            failed = [r for r in rows if r.get("status") != "SEND_OK"]
            assert not failed and len(rows) == len(messages), failed[:3]
        return rows

    @staticmethod
    def produce_spec(
        topic: str,
        messages: Sequence[dict],
        *,
        batch: int = 0,
        group: str | None = None,
        retries: int = 2,
    ) -> dict:
        spec: dict[str, object] = {
            "topic": topic,
            "messages": [encode_message(m) for m in messages],
            "batch": batch,
            "retries": retries,
        }
        if group is not None:
            spec["group"] = group
        return spec

    def pull(
        self,
        topic: str,
        *,
        queues: Sequence[tuple[str, int, int]] | None = None,
        start: str | int = "first",
        expected: int = 0,
        max_messages: int | None = None,
        group: str | None = None,
        tags: str | None = None,
        commit: bool = False,
        separate: bool = False,
        timeout: float = 60.0,
    ) -> list[dict]:
        """Read ``topic`` with ``DefaultMQPullConsumer``, queue by queue; return one dict per
        message: topic, brokerName, queueId, queueOffset, msgId, offsetMsgId,
        commitLogOffset, tags, keys (space-separated), properties (user properties),
        systemProperties, bornTimestamp, storeTimestamp, bornHost, storeHost,
        reconsumeTimes, sysFlag, body (bytes).

        ``queues``: ``(broker, queue id, offset)`` to read from; default every queue of the
        route from ``start`` ("first", "committed" (the group's offset), or an offset).
        Reads until each queue is at its end and at least ``expected`` messages came, or
        ``timeout`` seconds; at most ``max_messages``. ``commit`` commits each queue's next
        offset for ``group`` at the end. ``tags``: a subscription expression ("a || b").
        ``separate``: in a JVM of its own (a few seconds more) instead of the run's client.
        """
        spec: dict[str, object] = {
            "topic": topic,
            "from": start,
            "expected": expected,
            "commit": commit,
            "timeoutMs": int(timeout * 1000),
        }
        if queues is not None:
            spec["queues"] = [{"broker": b, "queueId": q, "offset": o} for b, q, o in queues]
        if max_messages is not None:
            spec["max"] = max_messages
        if group is not None:
            spec["group"] = group
        if tags is not None:
            spec["tags"] = tags
        if separate:
            rows = self.run("pull", spec, timeout=timeout + 120)
        else:
            rows = self.java.request("pull", timeout=timeout + 120, **spec)
        return [decode_message(r) for r in rows]

    def transact(
        self,
        topic: str,
        messages: Sequence[dict],
        *,
        wait_checks: int = 0,
        check_timeout: float = 60.0,
        group: str | None = None,
        separate: bool = False,
    ) -> tuple[list[dict], list[dict]]:
        """Send ``messages`` as transactional messages with ``TransactionMQProducer`` and
        return (send results, check-backs).

        A message is as for ``produce`` (no ``queue``), plus ``local`` (what the local
        transaction returns: "COMMIT", "ROLLBACK" or "UNKNOW"; default "COMMIT") and
        ``check`` (the answer to the broker's check-backs; default "COMMIT"). Waits up to
        ``check_timeout`` seconds for ``wait_checks`` check-backs, each returned as
        {check: message index, msgId, transactionId, answer, afterMs: since its send}.
        The cluster checks half messages older than 3 s every 2 s.
        """
        spec: dict[str, object] = {
            "topic": topic,
            "messages": [encode_message(m) for m in messages],
            "waitChecks": wait_checks,
            "checkTimeoutMs": int(check_timeout * 1000),
        }
        if group is not None:
            spec["group"] = group
        timeout = check_timeout + 300
        if separate:
            rows = self.run("transact", spec, timeout=timeout)
        else:
            rows = self.java.request("transact", timeout=timeout, **spec)
        sends = sorted((r for r in rows if "index" in r), key=lambda r: r["index"])
        failed = [r for r in sends if r.get("status") != "SEND_OK"]
        assert not failed and len(sends) == len(messages), failed[:3]
        return sends, [r for r in rows if "check" in r]

    def run(self, mode: str, spec: dict, *, timeout: float = 300.0) -> list[dict]:
        """Run ``RocketClient <mode>`` (produce, pull, transact) in a JVM of its own."""
        return self.rocketmq.run(mode, spec, timeout=timeout)

    def process(self, mode: str, spec: dict) -> subprocess.Popen:
        """Start ``RocketClient <mode>`` in a JVM of its own, ``spec`` written to its stdin
        (closed): its stdout is a pipe of JSON lines, e.g. to kill a broker mid-send."""
        proc = self.rocketmq.client_process(mode, stdin=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        return proc
