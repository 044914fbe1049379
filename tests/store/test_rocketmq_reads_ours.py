"""We write, RocketMQ reads: RocketMQ 5.3.1's own ``DefaultMessageStore`` opens a store
directory written (and cleanly closed) by rocketspark, and reads back every message.

A Java driver, compiled here against the rocketmq jars ``./dev`` fetches, builds the topic
table from our ``config/topics.json`` with RocketMQ's ``TopicConfigSerializeWrapper``,
then ``load()``s the store (CommitLog, ConsumeQueue, IndexFile and checkpoint recovery,
CRC checked on recover). Before ``start()`` (so nothing has been re-dispatched and only
the files we wrote are being read) it prints every ConsumeQueue entry and runs
``queryMessage`` on our IndexFiles; after ``start()`` it pulls every queue with
``getMessage`` and decodes each record with ``MessageDecoder`` (CRC checked). The test
asserts that all of it equals, message by message, what our store returns.

Needs java, javac and the rocketmq jars (``./dev`` fetches them into ``.jars/rocketmq``);
under CI their absence is a failure, not a skip.
"""

from __future__ import annotations

import os
import random
import subprocess

from rocketspark.message.java_hash import tags_code
from rocketspark.store import Message, MessageStore
from tests.helpers.jvm import QUIET, need_java

CL_SIZE = 1024 * 1024
CQ_SIZE = 20 * 1000  # 1000 ConsumeQueue entries per file

JAVA = r"""
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.protocol.body.TopicConfigSerializeWrapper;
import org.apache.rocketmq.store.*;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.queue.ConsumeQueueInterface;
import org.apache.rocketmq.store.queue.CqUnit;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/** Opens a store directory with RocketMQ's DefaultMessageStore and prints what it reads. */
public class ReadOursDriver {
    static final HexFormat HEX = HexFormat.of();
    static final String GROUP = "rocketspark-interop";

    static String hex(String s) {
        return s == null ? "-" : "h" + HEX.formatHex(s.getBytes(StandardCharsets.UTF_8));
    }

    static String host(SocketAddress a) {
        InetSocketAddress i = (InetSocketAddress) a;
        return i.getAddress().getHostAddress() + ":" + i.getPort();
    }

    static MessageExt decode(ByteBuffer bb) {
        ByteBuffer dup = bb.duplicate();
        byte[] bytes = new byte[dup.remaining()];
        dup.get(bytes);
        // readBody, deCompressBody, isClient=false, isSetPropertiesString=false, checkCRC=true
        return MessageDecoder.decode(ByteBuffer.wrap(bytes), true, true, false, false, true);
    }

    static String describe(MessageExt m) {
        byte[] body = m.getBody() == null ? new byte[0] : m.getBody();
        return String.join("\t", m.getTopic(), "" + m.getQueueId(), "" + m.getQueueOffset(),
            "" + m.getCommitLogOffset(), m.getMsgId(), hex(m.getTags()), hex(m.getKeys()),
            hex(m.getProperty("UNIQ_KEY")),
            hex(MessageDecoder.messageProperties2String(m.getProperties())),
            "h" + HEX.formatHex(body), "" + m.getSysFlag(), "" + m.getFlag(),
            "" + m.getReconsumeTimes(), "" + m.getStoreSize(), "" + m.getBodyCRC(),
            "" + m.getBornTimestamp(), "" + m.getStoreTimestamp(), host(m.getBornHost()),
            host(m.getStoreHost()), "" + m.getPreparedTransactionOffset());
    }

    public static void main(String[] args) throws Exception {
        String root = args[0];
        MessageStoreConfig cfg = new MessageStoreConfig();
        cfg.setStorePathRootDir(root);
        cfg.setStorePathCommitLog(Paths.get(root, "commitlog").toString());
        cfg.setMappedFileSizeCommitLog(Integer.parseInt(args[1]));
        cfg.setMappedFileSizeConsumeQueue(Integer.parseInt(args[2]));
        BrokerConfig broker = new BrokerConfig();
        String json = new String(Files.readAllBytes(Paths.get(root, "config", "topics.json")),
            StandardCharsets.UTF_8);
        TopicConfigSerializeWrapper wrapper =
            TopicConfigSerializeWrapper.fromJson(json, TopicConfigSerializeWrapper.class);
        ConcurrentHashMap<String, TopicConfig> topics =
            new ConcurrentHashMap<>(wrapper.getTopicConfigTable());
        DefaultMessageStore store =
            new DefaultMessageStore(cfg, new BrokerStatsManager(broker), null, broker, topics);
        boolean loaded = store.load();
        System.out.println("LOAD\t" + loaded);
        if (!loaded) {
            return;
        }
        System.out.println("PHY\t" + store.getMinPhyOffset() + "\t" + store.getMaxPhyOffset());
        TreeMap<String, TopicConfig> sorted = new TreeMap<>(topics);
        for (TopicConfig tc : sorted.values()) {
            System.out.println("TOPIC\t" + tc.getTopicName() + "\t" + tc.getReadQueueNums() + "\t"
                + tc.getWriteQueueNums() + "\t" + tc.getPerm() + "\t" + tc.isOrder());
        }

        // Before start(): only what load() made of our files (no re-dispatch has run).
        for (TopicConfig tc : sorted.values()) {
            int queues = Math.max(tc.getReadQueueNums(), tc.getWriteQueueNums());
            for (int q = 0; q < queues; q++) {
                String t = tc.getTopicName();
                long min = store.getMinOffsetInQueue(t, q);
                long max = store.getMaxOffsetInQueue(t, q);
                StringBuilder units = new StringBuilder();
                ConsumeQueueInterface cq = store.getConsumeQueue(t, q);
                for (long off = min; off < max; off++) {
                    CqUnit u = cq == null ? null : cq.get(off);
                    if (units.length() > 0) units.append(',');
                    units.append(u == null ? "null"
                        : u.getPos() + ":" + u.getSize() + ":" + u.getTagsCode());
                }
                System.out.println("CQ\t" + t + "\t" + q + "\t" + min + "\t" + max + "\t" + units);
            }
        }
        for (int i = 3; i < args.length; i++) {
            String[] tk = args[i].split(":", 2);
            String key = new String(HEX.parseHex(tk[1]), StandardCharsets.UTF_8);
            QueryMessageResult r = store.queryMessage(tk[0], key, 64, 0, Long.MAX_VALUE);
            StringBuilder found = new StringBuilder();
            for (ByteBuffer bb : r.getMessageBufferList()) {
                MessageExt m = decode(bb);
                if (found.length() > 0) found.append(',');
                found.append(m == null ? "UNDECODABLE"
                    : m.getTopic() + "@" + m.getCommitLogOffset());
            }
            r.release();
            System.out.println("QUERY\t" + tk[0] + "\t" + tk[1] + "\t" + found);
        }

        store.start();
        try {
            for (TopicConfig tc : sorted.values()) {
                int queues = Math.max(tc.getReadQueueNums(), tc.getWriteQueueNums());
                for (int q = 0; q < queues; q++) {
                    String t = tc.getTopicName();
                    long off = store.getMinOffsetInQueue(t, q);
                    long max = store.getMaxOffsetInQueue(t, q);
                    while (off < max) {
                        GetMessageResult r = store.getMessage(GROUP, t, q, off, 32, null);
                        if (r == null || r.getStatus() != GetMessageStatus.FOUND) {
                            System.out.println("GETFAIL\t" + t + "\t" + q + "\t" + off + "\t"
                                + (r == null ? "null" : r.getStatus()));
                            break;
                        }
                        List<ByteBuffer> bufs = r.getMessageBufferList();
                        List<Long> cqOffsets = r.getMessageQueueOffset();
                        for (int i = 0; i < bufs.size(); i++) {
                            MessageExt m = decode(bufs.get(i));
                            long cqOff = i < cqOffsets.size() ? cqOffsets.get(i) : -1;
                            System.out.println(m == null
                                ? "UNDECODABLE\t" + t + "\t" + q + "\t" + cqOff
                                : "MSG\t" + cqOff + "\t" + describe(m));
                        }
                        off = r.getNextBeginOffset();
                        r.release();
                    }
                    GetMessageResult end = store.getMessage(GROUP, t, q, max, 32, null);
                    System.out.println("END\t" + t + "\t" + q + "\t" + end.getStatus() + "\t"
                        + end.getNextBeginOffset() + "\t" + end.getMinOffset() + "\t"
                        + end.getMaxOffset());
                    end.release();
                }
            }
            MessageExt first = store.lookMessageByOffset(store.getMinPhyOffset());
            System.out.println("LOOK\t" + (first == null ? "null" : describe(first)));
        } finally {
            store.shutdown();
        }
        System.out.println("DONE");
    }
}
"""


def _text(field: str) -> str | None:
    return None if field == "-" else bytes.fromhex(field[1:]).decode("utf-8")


def _properties(text: str) -> dict[str, str]:
    props = {}
    for pair in text.split("\x02"):
        if pair:
            name, _, value = pair.partition("\x01")
            props[name] = value
    return props


def _java_view(fields: list[str]) -> tuple:
    """A MSG (or LOOK) line of the driver, decoded to comparable values."""
    (
        topic,
        qid,
        qoff,
        phy,
        msg_id,
        tags,
        keys,
        uniq,
        props,
        body,
        sys_flag,
        flag,
        reconsume,
        size,
        crc,
        born_ts,
        store_ts,
        born_host,
        store_host,
        prepared,
    ) = fields
    return (
        topic,
        int(qid),
        int(qoff),
        int(phy),
        msg_id,
        _text(tags),
        _text(keys),
        _text(uniq),
        _properties(_text(props) or ""),
        bytes.fromhex(body[1:]),
        int(sys_flag),
        int(flag),
        int(reconsume),
        int(size),
        int(crc),
        int(born_ts),
        int(store_ts),
        born_host,
        store_host,
        int(prepared),
    )


def _our_view(m) -> tuple:
    return (
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.commitlog_offset,
        m.msg_id,
        m.tags,
        m.properties.get("KEYS"),
        m.uniq_key,
        dict(m.properties),
        m.body,
        m.sys_flag,
        m.flag,
        m.reconsume_times,
        m.store_size,
        m.body_crc,
        m.born_timestamp,
        m.store_timestamp,
        str(m.born_host),
        str(m.store_host),
        m.prepared_transaction_offset,
    )


TEXTS = ["Grüße aus Köln", "заказ оформлен", "注文が確定しました", "emoji 🚀📦 ok", "plain ascii"]
TAGS = ["created", "paid", "shipped", None, "étiquette"]


def _order(i: int, rng: random.Random) -> Message:
    kind = i % 4
    if i == 0:
        body = b"\x00"  # the smallest body (RocketMQ's producer refuses empty ones)
    elif kind == 0:
        body = (f"{TEXTS[i % len(TEXTS)]} #{i} ").encode() * (1 + i % 50)
    elif kind == 1:
        body = rng.randbytes(rng.randrange(1, 16_000))
    elif kind == 2:
        body = bytes(range(256)) * (1 + i % 17)
    else:
        body = f"order {i}".encode()
    keys = [f"order-{i}", f"cust-{i % 9}"] + ([f"ключ-{i}"] if i % 6 == 0 else [])
    props = {"seq": str(i), "région": "Île-de-France ✓"} if i % 3 else {}
    return Message("orders", body, tags=TAGS[i % 5], keys=keys, properties=props, flag=i % 4)


def test_rocketmq_default_message_store_reads_our_store(tmp_path):
    (classpath,) = need_java()
    rng = random.Random(20240531)
    path = str(tmp_path / "store")
    sent: dict[int, Message] = {}  # commitlog offset -> what we put
    with MessageStore.open(
        path, mappedFileSizeCommitLog=CL_SIZE, mappedFileSizeConsumeQueue=CQ_SIZE
    ) as s:
        s.create_topic("orders", queues=4)
        s.create_topic("events", queues=1)
        orders = [_order(i, rng) for i in range(440)]
        for m in orders[:200]:  # one by one
            sent[s.put(m).commitlog_offset] = m
        # the rest as one columnar batch
        for m, r in zip(orders[200:420], s.put_batch(orders[200:420]), strict=True):
            sent[r.commitlog_offset] = m
        events = [
            Message("events", f"event {i} ✓".encode(), tags="tick", keys=[f"ev-{i}"])
            for i in range(1100)
        ]  # more than one ConsumeQueue file (1000 entries)
        for m, r in zip(events, s.put_batch(events), strict=True):
            sent[r.commitlog_offset] = m
        tx = Message(
            "orders",
            "Überweisung ✓ committed".encode(),
            tags="tx",
            keys=["tx-commit-1"],
            properties={"kind": "transfer"},
        )
        half = s.prepare(tx)
        (committed,) = s.commit_transaction(half)
        sent[committed.commitlog_offset] = tx
        dropped = s.prepare(Message("orders", b"never visible", tags="tx", keys=["tx-rollback-1"]))
        s.rollback_transaction(dropped)
        for m in orders[420:]:  # after the transactions
            sent[s.put(m).commitlog_offset] = m

        topics = {t.name: t for t in s.list_topics()}
        assert {
            "orders",
            "events",
            "RMQ_SYS_TRANS_HALF_TOPIC",
            "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        } <= set(topics)
        queues: dict[tuple[str, int], tuple[int, int]] = {}
        ours = {}  # commitlog offset -> MessageExt, every record of the CommitLog
        for t in topics.values():
            for q in range(max(t.read_queue_nums, t.write_queue_nums)):
                lo, hi = s.min_offset(t.name, q), s.max_offset(t.name, q)
                queues[(t.name, q)] = (lo, hi)
                got = s.pull(t.name, q, lo, max_msgs=100_000).messages if hi > lo else []
                assert [m.queue_offset for m in got] == list(range(lo, hi))
                for m in got:
                    assert s.get_message(m.commitlog_offset) == m
                    assert m.commitlog_offset not in ours
                    ours[m.commitlog_offset] = m
        max_phy = s.state.commit_pos
        queries = {  # (topic, key) -> commitlog offsets that must be found
            ("orders", k): sorted(m.commitlog_offset for m in s.query_by_key("orders", k))
            for k in [
                "order-17",
                "order-300",
                "cust-4",
                "ключ-42",
                "tx-commit-1",
                "tx-rollback-1",
                ours[min(sent)].uniq_key,
            ]
        }
        queries[("events", "ev-1050")] = [
            m.commitlog_offset for m in s.query_by_key("events", "ev-1050")
        ]
    # our own store agrees with what we put
    for phy, m in sent.items():
        got = ours[phy]
        assert (got.topic, got.body, got.tags, tuple(got.keys), got.flag) == (
            m.topic,
            m.body,
            m.tags,
            m.keys,
            m.flag,
        )
        assert {k: v for k, v in got.properties.items() if k in m.properties} == dict(m.properties)
    assert ours[committed.commitlog_offset].sys_flag & 0xC == 0x8  # TRANSACTION_COMMIT_TYPE
    truth = {
        (t, k): sorted(
            p for p, m in sent.items() if m.topic == t and (k in m.keys or ours[p].uniq_key == k)
        )
        for t, k in queries
    }
    assert queries == truth
    assert len(truth[("orders", "cust-4")]) > 40 and truth[("orders", "tx-rollback-1")] == []
    assert len(os.listdir(os.path.join(path, "commitlog"))) >= 2  # crosses a segment
    assert len(os.listdir(os.path.join(path, "consumequeue", "events", "0"))) >= 2

    build = tmp_path / "java"
    build.mkdir()
    (build / "ReadOursDriver.java").write_text(JAVA)
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(build), str(build / "ReadOursDriver.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    args = [f"{t}:{k.encode().hex()}" for t, k in queries]
    done = subprocess.run(
        [
            "java",
            *QUIET,
            "-cp",
            f"{classpath}{os.pathsep}{build}",
            "ReadOursDriver",
            path,
            str(CL_SIZE),
            str(CQ_SIZE),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split("\t") for line in done.stdout.splitlines() if line]
    kinds: dict[str, list[list[str]]] = {}
    for x in lines:
        kinds.setdefault(x[0], []).append(x[1:])
    assert kinds["LOAD"] == [["true"]]
    assert kinds.get("DONE") == [[]], done.stdout[-2000:]
    assert "GETFAIL" not in kinds and "UNDECODABLE" not in kinds, (
        kinds.get("GETFAIL"),
        kinds.get("UNDECODABLE"),
    )

    # the topic table RocketMQ parsed from our config/topics.json
    assert {x[0]: tuple(x[1:]) for x in kinds["TOPIC"]} == {
        t.name: (str(t.read_queue_nums), str(t.write_queue_nums), str(t.perm), str(t.order).lower())
        for t in topics.values()
    }
    # CommitLog recovery kept all of it
    assert kinds["PHY"] == [["0", str(max_phy)]]

    # ConsumeQueues as loaded and recovered from our files, before anything re-dispatched
    cq = {(x[0], int(x[1])): x[2:] for x in kinds["CQ"]}
    assert set(cq) == set(queues)
    by_queue: dict[tuple[str, int], list] = {}
    for m in sorted(ours.values(), key=lambda m: m.queue_offset):
        by_queue.setdefault((m.topic, m.queue_id), []).append(m)
    for key, (lo, hi) in queues.items():
        java_lo, java_hi, units = cq[key]
        assert (int(java_lo), int(java_hi)) == (lo, hi), key
        want = [
            f"{m.commitlog_offset}:{m.store_size}:{tags_code(m.tags)}"
            for m in by_queue.get(key, [])
        ]
        assert (units.split(",") if units else []) == want, key

    # IndexFile queries, also before start()
    found = {(x[0], bytes.fromhex(x[1]).decode()): x[2] for x in kinds["QUERY"]}
    assert set(found) == set(truth)
    for (t, k), want in truth.items():
        got = [p.split("@") for p in found[(t, k)].split(",")] if found[(t, k)] else []
        assert all(topic == t for topic, _ in got), (t, k, got)
        assert sorted(int(p) for _, p in got) == want, (t, k)

    # every message, pulled with getMessage after start(), field by field
    msgs = kinds["MSG"]
    views = [_java_view(x[1:]) for x in msgs]
    assert [int(x[0]) for x in msgs] == [v[2] for v in views]  # CQ offset == stored offset
    theirs = {v[3]: v for v in views}
    assert len(theirs) == len(views), "a message was returned twice"
    assert sorted(theirs) == sorted(ours)
    for phy, m in ours.items():
        assert theirs[phy] == _our_view(m), phy
    # ... and those are all the records of the CommitLog, back to back
    pos = 0
    for phy in sorted(theirs):
        if phy != pos:  # only a rolled segment may leave a gap (the BLANK tail)
            assert phy % CL_SIZE == 0 and phy // CL_SIZE == pos // CL_SIZE + 1, (pos, phy)
        pos = phy + theirs[phy][13]
    assert pos == max_phy
    assert len(theirs) == 440 + 1100 + 1 + 2 + 2  # + committed, 2 halves, 2 op records

    # start() re-dispatched nothing: the queues are as we wrote them
    ends = {(x[0], int(x[1])): x[2:] for x in kinds["END"]}
    assert ends == {
        k: ["OFFSET_OVERFLOW_ONE", str(hi), str(lo), str(hi)] for k, (lo, hi) in queues.items()
    }
    (look,) = kinds["LOOK"]
    assert _java_view(look) == _our_view(ours[0])
