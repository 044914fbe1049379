"""A real Apache RocketMQ NameServer and broker for tests, on loopback, and a Java client.

The jars come from ``./dev``'s directories (``tests/store/helpers/jvm.py``): the broker,
client and tools at 5.3.1 from ``.jars/rocketmq``, the NameServer (5.3.3: 5.3.1 is not on
Maven Central) from ``.jars/rocketmq-namesrv``. Each JVM gets its own ``user.home`` and
``rocketmq.home.dir`` under a run directory, so its logs land there. Java sources are
compiled with ``javac`` into the run directory when a test first needs them.

A broker is started on a given store directory with that store's segment sizes (a
broker refuses files of other sizes), stopped with SIGTERM (its shutdown hook flushes
and removes the abort file) or SIGKILL (a crash: recovery on the next open).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.store.helpers import jvm

# RocketMQ 5.3's HA acceptor (haListenPort) binds all interfaces, and no option makes it
# bind loopback. A single master without slaves never needs it, so the broker gets an
# HA service that skips the acceptor: the store loads its HA service through
# ServiceProvider (META-INF/service/org.apache.rocketmq.store.ha.HAService, looked up on
# the context class loader), so this subclass and that file, first on the broker's
# classpath, replace DefaultHAService. Everything else (group transfer, connection state
# notification) starts as in DefaultHAService.start().
NO_HA_ACCEPTOR_JAVA = r"""
package rocketspark.test;

import org.apache.rocketmq.store.ha.DefaultHAService;

/** DefaultHAService without the acceptor of slave connections (no listening socket). */
public class LoopbackOnlyHAService extends DefaultHAService {
    @Override
    public void start() throws Exception {
        this.groupTransferService.start();
        this.haConnectionStateNotificationService.start();
    }
}
"""

CLIENT_JAVA = r"""
import com.alibaba.fastjson.JSON;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/** RocketMQ's Java client for the tests: prints one JSON object per line. */
public class RocketClient {
    static synchronized void out(Map<String, Object> m) {
        System.out.println(JSON.toJSONString(m));
        System.out.flush();
    }

    /** The body of the message with this key: the key repeated to size bytes. */
    static byte[] body(String key, int size) {
        byte[] unit = (key + "|").getBytes(StandardCharsets.UTF_8);
        byte[] b = new byte[size];
        for (int i = 0; i < size; i++) b[i] = unit[i % unit.length];
        return b;
    }

    static DefaultMQAdminExt admin(String ns) throws Exception {
        DefaultMQAdminExt a = new DefaultMQAdminExt(10000);
        a.setNamesrvAddr(ns);
        a.setInstanceName("admin-" + System.nanoTime());
        a.start();
        return a;
    }

    /** Wait until the broker is in the cluster and routes every topic to writable queues. */
    static void ready(String ns, String broker, String[] topics, long deadline) throws Exception {
        DefaultMQAdminExt a = admin(ns);
        String last = "";
        while (System.currentTimeMillis() < deadline) {
            try {
                ClusterInfo c = a.examineBrokerClusterInfo();
                boolean ok = c.getBrokerAddrTable().containsKey(broker);
                for (String t : topics) {
                    TopicRouteData r = a.examineTopicRouteInfo(t);
                    ok &= r != null
                        && r.getQueueDatas().stream().anyMatch(q -> q.getWriteQueueNums() > 0);
                }
                if (ok) { out(Map.of("ready", true)); a.shutdown(); return; }
                last = "not yet listed";
            } catch (Exception e) {
                last = e.toString();
            }
            Thread.sleep(500);
        }
        out(Map.of("ready", false, "error", last));
        a.shutdown();
    }

    /** Send keys prefix-0 .. prefix-(n-1) from several threads; print each SendResult. */
    static void send(String ns, String topic, int n, String prefix, int size, int threads)
            throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("rocketspark-test-producer");
        p.setNamesrvAddr(ns);
        p.setSendMsgTimeout(15000);
        p.setRetryTimesWhenSendFailed(0);
        p.start();
        AtomicBoolean failed = new AtomicBoolean(false);
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int first = t;
            Thread th = new Thread(() -> {
                for (int i = first; i < n && !failed.get(); i += threads) {
                    String key = prefix + "-" + i;
                    try {
                        SendResult r = p.send(new Message(topic, "broker", key, body(key, size)));
                        Map<String, Object> m = new HashMap<>();
                        m.put("key", key);
                        m.put("status", r.getSendStatus().name());
                        m.put("msgId", r.getMsgId());
                        m.put("offsetMsgId", r.getOffsetMsgId());
                        m.put("queue", r.getMessageQueue().getQueueId());
                        m.put("offset", r.getQueueOffset());
                        out(m);
                    } catch (Exception e) {
                        failed.set(true);
                        out(Map.of("key", key, "error", e.toString()));
                    }
                }
            });
            th.start();
            ts.add(th);
        }
        for (Thread th : ts) th.join();
        p.shutdown();
    }

    /** Print the offsets the broker holds for a consumer group (nothing is consumed). */
    static void committed(String ns, String topic, String group) throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(group);
        c.setNamesrvAddr(ns);
        c.setAutoCommit(false);
        c.start();
        for (MessageQueue mq : c.fetchMessageQueues(topic)) {
            Long off = c.committed(mq);
            Map<String, Object> m = new HashMap<>();
            m.put("queue", mq.getQueueId());
            m.put("committed", off);
            out(m);
        }
        c.shutdown();
    }

    /** Read every queue of a topic from offset 0 until `expected` messages and 2 s of quiet. */
    static void consume(String ns, String topic, String group, int expected, long deadline)
            throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(group);
        c.setNamesrvAddr(ns);
        c.setAutoCommit(false);
        c.setPollTimeoutMillis(1000);
        // A new group starts at each queue's first offset: no seek() right after assign(),
        // which can interrupt a request in flight (and so close the client's connection).
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.start();
        Collection<MessageQueue> mqs = c.fetchMessageQueues(topic);
        c.assign(mqs);
        Map<Integer, Long> next = new HashMap<>();
        Set<String> seen = new HashSet<>();
        int count = 0;
        long progress = System.currentTimeMillis();
        while (System.currentTimeMillis() < deadline) {
            List<MessageExt> got = c.poll();
            for (MessageExt x : got) {
                if (!seen.add(x.getQueueId() + ":" + x.getQueueOffset())) continue;
                next.merge(x.getQueueId(), x.getQueueOffset() + 1, Math::max);
                count++;
                progress = System.currentTimeMillis();
                Map<String, Object> m = new HashMap<>();
                m.put("topic", x.getTopic());
                m.put("queue", x.getQueueId());
                m.put("offset", x.getQueueOffset());
                m.put("phy", x.getCommitLogOffset());
                m.put("key", x.getKeys());
                m.put("tags", x.getTags());
                m.put("body", HexFormat.of().formatHex(x.getBody()));
                m.put("msgId", x.getMsgId());
                out(m);
            }
            long idle = System.currentTimeMillis() - progress;
            if (count >= expected && idle > 2000) break;
            if (count < expected && idle > 10000) {
                // A pull lost with its connection is not retried by the consumer: resume
                // every queue where it stands (duplicates are skipped above).
                for (MessageQueue mq : mqs) {
                    try { c.seek(mq, next.getOrDefault(mq.getQueueId(), 0L)); }
                    catch (Exception e) { /* tried again after the next idle period */ }
                }
                progress = System.currentTimeMillis();
            }
        }
        c.shutdown();
    }

    /** Look keys up in the broker's IndexFiles; print the commit log offsets found. */
    static void query(String ns, String topic, String[] keys) throws Exception {
        DefaultMQAdminExt a = admin(ns);
        for (String key : keys) {
            QueryResult r = a.queryMessage(topic, key, 64, 0, Long.MAX_VALUE);
            List<Long> phys = new ArrayList<>();
            for (MessageExt x : r.getMessageList()) phys.add(x.getCommitLogOffset());
            Collections.sort(phys);
            out(Map.of("key", key, "phys", phys));
        }
        a.shutdown();
    }

    public static void main(String[] a) throws Exception {
        String ns = a[0];
        long deadline = System.currentTimeMillis() + 120_000;
        switch (a[1]) {
            case "ready": ready(ns, a[2], Arrays.copyOfRange(a, 3, a.length), deadline); break;
            case "send": send(ns, a[2], Integer.parseInt(a[3]), a[4], Integer.parseInt(a[5]),
                              Integer.parseInt(a[6])); break;
            case "committed": committed(ns, a[2], a[3]); break;
            case "consume": consume(ns, a[2], a[3], Integer.parseInt(a[4]), deadline); break;
            case "query": query(ns, a[2], Arrays.copyOfRange(a, 3, a.length)); break;
            default: throw new IllegalArgumentException(a[1]);
        }
        System.exit(0);
    }
}
"""

JVM_FLAGS = [
    # what RocketMQ's own start scripts pass on JDK 9+
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "-XX:+UseSerialGC",
    # C1 only: these JVMs live seconds to minutes, and start much faster on 2 busy cores
    "-XX:TieredStopAtLevel=1",
    "-Dcom.rocketmq.remoting.client.connect.timeout=10000",
]
BOOT_TIMEOUT = 240.0


def free_port(*, also_below: int = 0) -> int:
    """Return a free loopback port p (and p - also_below free too: the broker's fast port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port - also_below < 1024:
            continue
        try:
            for p in {port, port - also_below, port + 1}:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port")


def _javac(sources: dict[str, str], classpath: str, out: Path) -> None:
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    files = []
    for name, text in sources.items():
        f = src / name
        f.write_text(text)
        files.append(str(f))
    done = subprocess.run(
        ["javac", "-nowarn", "-cp", classpath, "-d", str(out), *files],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"javac failed:\n{done.stderr[-4000:]}")


class JavaServer:
    """A RocketMQ server JVM started in a run directory of its own; stdout to a file."""

    def __init__(
        self, name: str, run_dir: Path, classpath: str, main: str, conf: dict, heap: str
    ) -> None:
        self.name = name
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "home").mkdir(exist_ok=True)
        conf_file = self.dir / f"{name}.conf"
        conf_file.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        self.stdout = self.dir / "stdout.log"
        cmd = [
            "java",
            f"-Xms{heap}",
            f"-Xmx{heap}",
            f"-XX:MaxDirectMemorySize={heap}",
            *JVM_FLAGS,
            f"-Duser.home={self.dir / 'home'}",
            f"-Drocketmq.home.dir={self.dir / 'home'}",
            "-cp",
            classpath,
            main,
            "-c",
            str(conf_file),
        ]
        with open(self.stdout, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.started = time.monotonic()

    def output(self) -> str:
        return self.stdout.read_text(errors="replace")

    def wait_boot(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Wait for the JVM's "boot success" line; fail with its output if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "boot success" in self.output():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}):\n{self.output()[-4000:]}"
                )
            time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"{self.name} did not boot in {timeout:.0f} s:\n{self.output()[-4000:]}")

    def terminate(self, timeout: float = 120.0) -> int:
        """Stop cleanly (SIGTERM: RocketMQ's shutdown hook runs) and wait for the exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"{self.name} did not stop in {timeout:.0f} s") from None
        return self.proc.returncode

    def kill(self) -> None:
        """Crash it: SIGKILL, no shutdown hook, the abort file stays."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)


class RocketMQ:
    """One NameServer for a test session; brokers on store directories, one at a time."""

    def __init__(self, run_dir: Path, broker_classpath: str, namesrv_classpath: str) -> None:
        self.run_dir = run_dir
        self.classes = run_dir / "classes"
        self.classpath = broker_classpath
        _javac(
            {"RocketClient.java": CLIENT_JAVA, "LoopbackOnlyHAService.java": NO_HA_ACCEPTOR_JAVA},
            broker_classpath,
            self.classes,
        )
        services = self.classes / "META-INF" / "service"
        services.mkdir(parents=True, exist_ok=True)
        (services / "org.apache.rocketmq.store.ha.HAService").write_text(
            "rocketspark.test.LoopbackOnlyHAService\n"
        )
        port = free_port()
        self.namesrv = JavaServer(
            "namesrv",
            run_dir / "namesrv",
            namesrv_classpath,
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            {"listenPort": port, "bindAddress": "127.0.0.1"},
            "256m",
        )
        self.addr = f"127.0.0.1:{port}"
        self.brokers: list[JavaServer] = []
        self.namesrv.wait_boot()

    def close(self) -> None:
        """Stop the NameServer, and crash any broker a failed test left running."""
        for broker in self.brokers:
            broker.kill()
        self.namesrv.terminate()

    def start_broker(
        self,
        store: str | os.PathLike[str],
        *,
        commitlog_size: int,
        consumequeue_size: int,
        topics: list[str],
    ) -> JavaServer:
        """Start a broker on ``store`` and return it once it serves ``topics``."""
        port = free_port(also_below=2)
        store = os.fspath(store)
        conf = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": 0,
            "namesrvAddr": self.addr,
            "listenPort": port,
            "haListenPort": port + 1,
            "bindAddress": "127.0.0.1",
            "brokerIP1": "127.0.0.1",
            "brokerIP2": "127.0.0.1",
            "storePathRootDir": store,
            "storePathCommitLog": os.path.join(store, "commitlog"),
            "mappedFileSizeCommitLog": commitlog_size,
            "mappedFileSizeConsumeQueue": consumequeue_size,
            # the default 200 ms answers "broker busy" on a loaded 2-core machine
            "waitTimeMillsInSendQueue": 3000,
            "autoCreateTopicEnable": "true",
        }
        run = self.run_dir / f"broker-{len(self.brokers) + 1}"
        broker = JavaServer(
            "broker",
            run,
            f"{self.classes}{os.pathsep}{self.classpath}",
            "org.apache.rocketmq.broker.BrokerStartup",
            conf,
            "512m",
        )
        self.brokers.append(broker)
        try:
            broker.wait_boot()
            (ready,) = self.client("ready", "broker-a", *topics)
            if not ready["ready"]:
                raise RuntimeError(f"broker booted but is not routed: {ready}")
        except BaseException:
            broker.kill()
            raise
        return broker

    def client_process(self, *args: object) -> subprocess.Popen:
        """Start the Java client (``RocketClient`` modes), its stdout a pipe of JSON lines."""
        cmd = [
            "java",
            "-Xmx256m",
            *JVM_FLAGS,
            *jvm.QUIET,
            f"-Duser.home={self.run_dir / 'client-home'}",
            "-Drocketmq.client.logRoot=" + str(self.run_dir / "client-home"),
            "-cp",
            f"{self.classes}{os.pathsep}{self.classpath}",
            "RocketClient",
            self.addr,
            *map(str, args),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def client(self, *args: object, timeout: float = 300.0) -> list[dict]:
        """Run the Java client to the end and return the JSON objects it printed."""
        proc = self.client_process(*args)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise RuntimeError(f"client {args} timed out:\n{err[-3000:]}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"client {args} failed ({proc.returncode}):\n{err[-3000:]}")
        return parse_lines(out)


def parse_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def body(key: str, size: int) -> bytes:
    """The body ``RocketClient send`` gives the message with this key."""
    unit = (key + "|").encode()
    return (unit * (size // len(unit) + 1))[:size]


def offset_msg_id_phy(offset_msg_id: str) -> int:
    """The commit log offset in a broker's offsetMsgId (store host, port, offset; hex)."""
    return int(offset_msg_id[-16:], 16)
