import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.client.Validators;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageBatch;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.admin.ConsumeStats;
import org.apache.rocketmq.remoting.protocol.admin.OffsetWrapper;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.body.Connection;
import org.apache.rocketmq.remoting.protocol.body.ConsumerConnection;
import org.apache.rocketmq.remoting.protocol.body.ConsumerRunningInfo;
import org.apache.rocketmq.remoting.protocol.heartbeat.SubscriptionData;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.QueueData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * RocketMQ's Java client for the tests: prints one JSON object per line on stdout.
 *
 * <p>Usage: {@code RocketClient NAMESRV MODE ARGS...}. The modes {@code ready}, {@code send},
 * {@code committed}, {@code consume} and {@code query} take their arguments on the command
 * line (the store's broker tests); {@code produce}, {@code pull} and {@code transact} read
 * one JSON spec from stdin; {@code serve} runs until stdin closes, answering one JSON request a line (an
 * {@code op} and that operation's spec) with its output lines and then {@code {"_end": true}}
 * (with {@code "error"} when it failed), so a test session pays for one JVM start only.
 */
public class RocketClient {
    static final PrintStream OUT =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

    static synchronized void out(Map<String, Object> m) {
        OUT.println(JSON.toJSONString(m));
        OUT.flush();
    }

    /** The body of the message with this key: the key repeated to size bytes. */
    static byte[] body(String key, int size) {
        byte[] unit = (key + "|").getBytes(StandardCharsets.UTF_8);
        byte[] b = new byte[size];
        for (int i = 0; i < size; i++) b[i] = unit[i % unit.length];
        return b;
    }

    static String unique(String what) {
        return what + "-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
    }

    static DefaultMQAdminExt admin(String ns) throws Exception {
        DefaultMQAdminExt a = new DefaultMQAdminExt(10000);
        a.setNamesrvAddr(ns);
        a.setInstanceName(unique("admin"));
        a.start();
        return a;
    }

    static int intOr(JSONObject spec, String key, int dflt) {
        return spec.containsKey(key) && spec.get(key) != null ? spec.getIntValue(key) : dflt;
    }

    static long longOr(JSONObject spec, String key, long dflt) {
        return spec.containsKey(key) && spec.get(key) != null ? spec.getLongValue(key) : dflt;
    }

    // ---- the store's broker tests (command-line arguments) ----

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
        try {
            query(a, topic, Arrays.asList(keys));
        } finally {
            a.shutdown();
        }
    }

    static void query(DefaultMQAdminExt a, String topic, List<String> keys) throws Exception {
        for (String key : keys) {
            QueryResult r = a.queryMessage(topic, key, 64, 0, Long.MAX_VALUE);
            List<Long> phys = new ArrayList<>();
            for (MessageExt x : r.getMessageList()) phys.add(x.getCommitLogOffset());
            Collections.sort(phys);
            out(Map.of("key", key, "phys", phys));
        }
    }

    // ---- JSON specs: produce and pull ----

    static Message message(JSONObject m, String topic) {
        String t = m.getString("topic") != null ? m.getString("topic") : topic;
        Message msg = new Message(t, Base64.getDecoder().decode(m.getString("body")));
        if (m.getString("tags") != null) msg.setTags(m.getString("tags"));
        Object keys = m.get("keys");
        if (keys instanceof JSONArray) {
            msg.setKeys(((JSONArray) keys).toJavaList(String.class));
        } else if (keys != null) {
            msg.setKeys(keys.toString());
        }
        JSONObject props = m.getJSONObject("properties");
        if (props != null) {
            for (String k : props.keySet()) msg.putUserProperty(k, props.getString(k));
        }
        if (m.containsKey("delayLevel")) msg.setDelayTimeLevel(m.getIntValue("delayLevel"));
        return msg;
    }

    static MessageQueue queueOf(JSONObject m, String topic) {
        JSONObject q = m.getJSONObject("queue");
        if (q == null) return null;
        String t = m.getString("topic") != null ? m.getString("topic") : topic;
        return new MessageQueue(t, q.getString("broker"), q.getIntValue("queueId"));
    }

    /**
     * Send the spec's messages in order; print one line per message: its index, the send
     * status, msgId, offsetMsgId, brokerName, queueId and queueOffset (or an error).
     *
     * <p>Spec: topic; messages (each: body as base64; optional topic, tags, keys as a list or
     * one string, properties, delayLevel, queue as {broker, queueId}); batch (0: one send per
     * message; n: runs of up to n consecutive messages of one topic and queue sent as one
     * batch, whose lines also carry batchMsgId: the msgId its messages are read back with);
     * group; timeoutMs; retries (on another broker; not with an explicit queue).
     */
    static void produce(String ns, JSONObject spec) throws Exception {
        String topic = spec.getString("topic");
        DefaultMQProducer p = new DefaultMQProducer(
            spec.getString("group") != null ? spec.getString("group") : "rocketspark-test-producer");
        p.setNamesrvAddr(ns);
        p.setInstanceName(unique("producer"));
        p.setSendMsgTimeout(intOr(spec, "timeoutMs", 15000));
        p.setRetryTimesWhenSendFailed(intOr(spec, "retries", 2));
        p.start();
        try {
            JSONArray msgs = spec.getJSONArray("messages");
            int batch = intOr(spec, "batch", 0);
            int i = 0;
            while (i < msgs.size()) {
                JSONObject first = msgs.getJSONObject(i);
                MessageQueue mq = queueOf(first, topic);
                int end = i + 1;
                if (batch > 0) {
                    String t = message(first, topic).getTopic();
                    while (end < msgs.size() && end - i < batch) {
                        JSONObject m = msgs.getJSONObject(end);
                        if (!message(m, topic).getTopic().equals(t)
                                || !Objects.equals(queueOf(m, topic), mq)) break;
                        end++;
                    }
                }
                try {
                    SendResult r;
                    String batchId = null;
                    if (batch > 0) {
                        // What DefaultMQProducer.send(Collection) does, but keeping the batch:
                        // the broker stores the batch's own properties after each message's,
                        // so every message of it is read back with the batch's UNIQ_KEY as its
                        // msgId (not the one the SendResult names).
                        List<Message> run = new ArrayList<>();
                        for (int j = i; j < end; j++) run.add(message(msgs.getJSONObject(j), topic));
                        MessageBatch b = MessageBatch.generateFromList(run);
                        for (Message m : b) {
                            Validators.checkMessage(m, p);
                            MessageClientIDSetter.setUniqID(m);
                        }
                        MessageClientIDSetter.setUniqID(b);
                        b.setBody(b.encode());
                        batchId = MessageClientIDSetter.getUniqID(b);
                        r = mq == null ? p.send(b) : p.send(b, mq);
                    } else {
                        Message m = message(first, topic);
                        r = mq == null ? p.send(m) : p.send(m, mq);
                    }
                    // A batch's result names every message: ids joined by commas, the
                    // first message's queue offset.
                    String[] ids = r.getMsgId().split(",");
                    String[] offsetIds = r.getOffsetMsgId() == null
                        ? new String[0] : r.getOffsetMsgId().split(",");
                    for (int j = i; j < end; j++) {
                        Map<String, Object> o = new HashMap<>();
                        o.put("index", j);
                        o.put("status", r.getSendStatus().name());
                        o.put("msgId", ids.length == end - i ? ids[j - i] : r.getMsgId());
                        if (batchId != null) o.put("batchMsgId", batchId);
                        o.put("offsetMsgId",
                              offsetIds.length == end - i ? offsetIds[j - i] : r.getOffsetMsgId());
                        o.put("brokerName", r.getMessageQueue().getBrokerName());
                        o.put("queueId", r.getMessageQueue().getQueueId());
                        o.put("queueOffset", r.getQueueOffset() + (j - i));
                        out(o);
                    }
                } catch (Exception e) {
                    for (int j = i; j < end; j++) out(Map.of("index", j, "error", e.toString()));
                }
                i = end;
            }
        } finally {
            p.shutdown();
        }
    }

    static LocalTransactionState state(String s) {
        return s == null ? LocalTransactionState.COMMIT_MESSAGE
            : LocalTransactionState.valueOf(s.equals("COMMIT") ? "COMMIT_MESSAGE"
                : s.equals("ROLLBACK") ? "ROLLBACK_MESSAGE" : s);
    }

    /**
     * Send the spec's messages as transactional (half) messages with TransactionMQProducer;
     * print one line per message (as produce, plus transactionId and localState), then one
     * line per check-back the broker sends ({"check": index, msgId, transactionId, topic, queueId,
     * answer, afterMs: since that message was sent}) until `waitChecks` check-backs came or timeoutMs.
     *
     * <p>Spec: as produce (no batches), and per message: local (the local transaction's
     * outcome: COMMIT, ROLLBACK or UNKNOW; default COMMIT) and check (the answer to each
     * check-back; default COMMIT). group: the producer group (default: a new one, so no other
     * producer is asked the check-backs).
     */
    static void transact(String ns, JSONObject spec) throws Exception {
        String topic = spec.getString("topic");
        JSONArray msgs = spec.getJSONArray("messages");
        Map<String, Integer> indexOf = new ConcurrentHashMap<>();
        Map<Integer, Long> sentAt = new ConcurrentHashMap<>();
        AtomicInteger checks = new AtomicInteger();
        TransactionMQProducer p = new TransactionMQProducer(
            spec.getString("group") != null ? spec.getString("group") : unique("rocketspark-tx"));
        p.setNamesrvAddr(ns);
        p.setInstanceName(unique("tx"));
        p.setSendMsgTimeout(intOr(spec, "timeoutMs", 15000));
        p.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return state(msgs.getJSONObject((Integer) arg).getString("local"));
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Integer i = indexOf.get(MessageClientIDSetter.getUniqID(msg));
                if (i == null) return LocalTransactionState.UNKNOW; // not ours: a stale half
                LocalTransactionState answer = state(msgs.getJSONObject(i).getString("check"));
                Map<String, Object> o = new HashMap<>();
                o.put("check", i);
                o.put("msgId", MessageClientIDSetter.getUniqID(msg));
                o.put("transactionId", msg.getTransactionId());
                o.put("topic", msg.getTopic());
                o.put("queueId", msg.getQueueId());
                o.put("answer", answer.name());
                o.put("afterMs", System.currentTimeMillis() - sentAt.getOrDefault(i, 0L));
                out(o);
                checks.incrementAndGet();
                return answer;
            }
        });
        p.start();
        try {
            for (int i = 0; i < msgs.size(); i++) {
                Message m = message(msgs.getJSONObject(i), topic);
                // the id is known before the send: a check-back can only come after it
                MessageClientIDSetter.setUniqID(m);
                indexOf.put(MessageClientIDSetter.getUniqID(m), i);
                sentAt.put(i, System.currentTimeMillis());
                Map<String, Object> o = new HashMap<>();
                o.put("index", i);
                try {
                    TransactionSendResult r = p.sendMessageInTransaction(m, i);
                    o.put("status", r.getSendStatus().name());
                    o.put("localState", r.getLocalTransactionState().name());
                    o.put("msgId", r.getMsgId());
                    o.put("offsetMsgId", r.getOffsetMsgId());
                    o.put("transactionId", r.getTransactionId());
                    o.put("brokerName", r.getMessageQueue().getBrokerName());
                    o.put("queueId", r.getMessageQueue().getQueueId());
                    o.put("queueOffset", r.getQueueOffset());
                } catch (Exception e) {
                    o.put("error", e.toString());
                }
                out(o);
            }
            int want = intOr(spec, "waitChecks", 0);
            long deadline = System.currentTimeMillis() + longOr(spec, "checkTimeoutMs", 60000);
            while (checks.get() < want && System.currentTimeMillis() < deadline) Thread.sleep(50);
        } finally {
            p.shutdown();
        }
    }

    static Map<String, Object> describe(MessageExt x, MessageQueue mq) {
        Map<String, Object> m = new HashMap<>();
        m.put("topic", x.getTopic());
        m.put("brokerName", mq.getBrokerName());
        m.put("queueId", x.getQueueId());
        m.put("queueOffset", x.getQueueOffset());
        m.put("msgId", x.getMsgId());
        if (x instanceof MessageClientExt) m.put("offsetMsgId", ((MessageClientExt) x).getOffsetMsgId());
        m.put("commitLogOffset", x.getCommitLogOffset());
        m.put("tags", x.getTags());
        m.put("keys", x.getKeys());
        Map<String, String> user = new TreeMap<>();
        Map<String, String> system = new TreeMap<>();
        for (Map.Entry<String, String> e : x.getProperties().entrySet()) {
            (MessageConst.STRING_HASH_SET.contains(e.getKey()) ? system : user)
                .put(e.getKey(), e.getValue());
        }
        m.put("properties", user);
        m.put("systemProperties", system);
        m.put("bornTimestamp", x.getBornTimestamp());
        m.put("storeTimestamp", x.getStoreTimestamp());
        m.put("bornHost", String.valueOf(x.getBornHost()));
        m.put("storeHost", String.valueOf(x.getStoreHost()));
        m.put("reconsumeTimes", x.getReconsumeTimes());
        m.put("sysFlag", x.getSysFlag());
        m.put("body", Base64.getEncoder().encodeToString(x.getBody()));
        return m;
    }

    /**
     * Pull messages by queue, in queue order; print one line per message (describe()).
     *
     * <p>Spec: topic; queues (a list of {broker, queueId, offset}; default every queue of the
     * topic's route, from `from`: "first" (the queue's min offset, the default), "committed"
     * (the group's committed offset, else the min offset) or a number); group; tags (a
     * subscription expression, default "*"); expected (keep pulling until at least this
     * many, or the timeout; default 0); max (stop after this many); timeoutMs (default
     * 60000); commit (commit each read queue's next offset for the group at the end).
     * Stops once it has `expected` messages and every queue has been read to its end.
     */
    static void pull(String ns, JSONObject spec) throws Exception {
        String topic = spec.getString("topic");
        String group = spec.getString("group") != null ? spec.getString("group") : unique("reader");
        String tags = spec.getString("tags") != null ? spec.getString("tags") : "*";
        int expected = intOr(spec, "expected", 0);
        int max = intOr(spec, "max", Integer.MAX_VALUE);
        int batchSize = intOr(spec, "batchSize", 32);
        long deadline = System.currentTimeMillis() + longOr(spec, "timeoutMs", 60000);
        DefaultMQPullConsumer c = new DefaultMQPullConsumer(group);
        c.setNamesrvAddr(ns);
        c.setInstanceName(unique("reader"));
        c.start();
        try {
            Map<MessageQueue, Long> next = new LinkedHashMap<>();
            JSONArray queues = spec.getJSONArray("queues");
            if (queues != null) {
                for (int i = 0; i < queues.size(); i++) {
                    JSONObject q = queues.getJSONObject(i);
                    next.put(new MessageQueue(topic, q.getString("broker"), q.getIntValue("queueId")),
                             q.getLongValue("offset"));
                }
            } else {
                Object from = spec.get("from") != null ? spec.get("from") : "first";
                List<MessageQueue> mqs = new ArrayList<>(c.fetchSubscribeMessageQueues(topic));
                mqs.sort(Comparator.comparing(MessageQueue::getBrokerName)
                    .thenComparingInt(MessageQueue::getQueueId));
                for (MessageQueue mq : mqs) {
                    long off;
                    if (from instanceof Number) {
                        off = ((Number) from).longValue();
                    } else if ("committed".equals(from)) {
                        off = c.fetchConsumeOffset(mq, true);
                        if (off < 0) off = c.minOffset(mq);
                    } else {
                        off = c.minOffset(mq);
                    }
                    next.put(mq, off);
                }
            }
            int count = 0;
            Set<MessageQueue> atEnd = new HashSet<>();
            while (count < max && System.currentTimeMillis() < deadline) {
                atEnd.clear();
                for (Map.Entry<MessageQueue, Long> e : next.entrySet()) {
                    MessageQueue mq = e.getKey();
                    PullResult r;
                    try {
                        r = c.pull(mq, tags, e.getValue(), Math.min(batchSize, max - count), 10000);
                    } catch (Exception ex) {
                        // a broker being restarted: try again on the next round
                        continue;
                    }
                    switch (r.getPullStatus()) {
                        case FOUND:
                            for (MessageExt x : r.getMsgFoundList()) {
                                if (count >= max) break;
                                out(describe(x, mq));
                                e.setValue(x.getQueueOffset() + 1);
                                count++;
                            }
                            if (count < max) e.setValue(r.getNextBeginOffset());
                            break;
                        case NO_NEW_MSG:
                        case NO_MATCHED_MSG:
                            e.setValue(r.getNextBeginOffset());
                            atEnd.add(mq);
                            break;
                        default: // OFFSET_ILLEGAL: the broker says where the queue starts
                            e.setValue(r.getNextBeginOffset());
                    }
                    if (count >= max) break;
                }
                if (count >= expected && atEnd.size() == next.size()) break;
                if (atEnd.size() == next.size()) Thread.sleep(200);
            }
            if (spec.getBooleanValue("commit")) {
                for (Map.Entry<MessageQueue, Long> e : next.entrySet()) {
                    c.getDefaultMQPullConsumerImpl()
                        .updateConsumeOffsetToBroker(e.getKey(), e.getValue(), false);
                }
            }
        } finally {
            c.shutdown();
        }
    }

    // ---- serve: the admin operations ----

    static Map<String, String> masters(DefaultMQAdminExt a) throws Exception {
        Map<String, String> m = new TreeMap<>();
        for (BrokerData b : a.examineBrokerClusterInfo().getBrokerAddrTable().values()) {
            String addr = b.getBrokerAddrs().get(0L);
            if (addr != null) m.put(b.getBrokerName(), addr);
        }
        return m;
    }

    static List<String> strings(JSONObject spec, String key) {
        JSONArray a = spec.getJSONArray(key);
        return a == null ? List.of() : a.toJavaList(String.class);
    }

    /** Every broker of the cluster: name, cluster, brokerId and address. */
    static void cluster(DefaultMQAdminExt a) throws Exception {
        ClusterInfo info = a.examineBrokerClusterInfo();
        Map<String, String> clusterOf = new HashMap<>();
        for (Map.Entry<String, Set<String>> e : info.getClusterAddrTable().entrySet()) {
            for (String b : e.getValue()) clusterOf.put(b, e.getKey());
        }
        for (BrokerData b : info.getBrokerAddrTable().values()) {
            for (Map.Entry<Long, String> e : b.getBrokerAddrs().entrySet()) {
                out(Map.of("brokerName", b.getBrokerName(), "brokerId", e.getKey(),
                           "addr", e.getValue(),
                           "cluster", clusterOf.getOrDefault(b.getBrokerName(), "")));
            }
        }
    }

    /** True when every broker has a master listed and every topic a route on each of them. */
    static boolean routed(DefaultMQAdminExt a, List<String> brokers, List<String> topics,
                          Map<String, String> addrs) throws Exception {
        Map<String, String> m = masters(a);
        for (String b : brokers) {
            if (!m.containsKey(b)) return false;
            if (addrs.containsKey(b) && !addrs.get(b).equals(m.get(b))) return false;
        }
        for (String t : topics) {
            TopicRouteData r;
            try {
                r = a.examineTopicRouteInfo(t);
            } catch (Exception e) {
                return false; // TOPIC_NOT_EXIST, for now
            }
            for (String b : brokers) {
                if (r.getQueueDatas().stream().noneMatch(
                        q -> q.getBrokerName().equals(b) && q.getWriteQueueNums() > 0)) return false;
            }
        }
        return true;
    }

    /** Wait until brokers (optionally at given addresses) and topics on them are routed. */
    static void readyAll(DefaultMQAdminExt a, JSONObject spec) throws Exception {
        long deadline = System.currentTimeMillis() + longOr(spec, "timeoutMs", 120000);
        JSONObject addrSpec = spec.getJSONObject("addrs");
        Map<String, String> addrs = new HashMap<>();
        if (addrSpec != null) for (String k : addrSpec.keySet()) addrs.put(k, addrSpec.getString(k));
        List<String> brokers = strings(spec, "brokers");
        List<String> topics = strings(spec, "topics");
        String last = "";
        while (System.currentTimeMillis() < deadline) {
            try {
                if (routed(a, brokers, topics, addrs)) { out(Map.of("ready", true)); return; }
                last = "not yet routed: " + masters(a);
            } catch (Exception e) {
                last = e.toString();
            }
            Thread.sleep(250);
        }
        throw new IllegalStateException("not routed in time: " + last);
    }

    /** Wait until the NameServer no longer lists the broker (after it was killed). */
    static void gone(DefaultMQAdminExt a, JSONObject spec) throws Exception {
        long deadline = System.currentTimeMillis() + longOr(spec, "timeoutMs", 60000);
        String broker = spec.getString("broker");
        while (System.currentTimeMillis() < deadline) {
            if (!masters(a).containsKey(broker)) { out(Map.of("gone", true)); return; }
            Thread.sleep(100);
        }
        throw new IllegalStateException(broker + " is still listed");
    }

    static void route(DefaultMQAdminExt a, String topic) throws Exception {
        TopicRouteData r = a.examineTopicRouteInfo(topic);
        List<QueueData> qs = new ArrayList<>(r.getQueueDatas());
        qs.sort(Comparator.comparing(QueueData::getBrokerName));
        for (QueueData q : qs) {
            out(Map.of("brokerName", q.getBrokerName(), "readQueueNums", q.getReadQueueNums(),
                       "writeQueueNums", q.getWriteQueueNums(), "perm", q.getPerm()));
        }
    }

    /** Create (or update) a topic on each named broker's master; wait until it is routed. */
    static void createTopic(DefaultMQAdminExt a, JSONObject spec) throws Exception {
        String topic = spec.getString("topic");
        List<String> brokers = strings(spec, "brokers");
        Map<String, String> m = masters(a);
        for (String b : brokers) {
            if (!m.containsKey(b)) throw new IllegalArgumentException("no broker " + b + ": " + m);
            TopicConfig tc = new TopicConfig(topic, intOr(spec, "readQueues", 4),
                                             intOr(spec, "writeQueues", 4), 6);
            a.createAndUpdateTopicConfig(m.get(b), tc);
        }
        long deadline = System.currentTimeMillis() + longOr(spec, "timeoutMs", 60000);
        while (true) {
            // routed with the queue counts just set on every broker
            try {
                TopicRouteData r = a.examineTopicRouteInfo(topic);
                long done = r.getQueueDatas().stream().filter(q -> brokers.contains(q.getBrokerName())
                    && q.getReadQueueNums() == intOr(spec, "readQueues", 4)
                    && q.getWriteQueueNums() == intOr(spec, "writeQueues", 4)).count();
                if (done == brokers.size()) break;
            } catch (Exception e) {
                // TOPIC_NOT_EXIST until the first broker registers it
            }
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException(topic + " not routed on " + brokers);
            }
            Thread.sleep(100);
        }
        route(a, topic);
    }

    /**
     * A group's progress on a topic, as mqadmin consumerProgress shows it: one line per queue
     * of every broker in the topic's route. Asked of each broker: examineConsumeStats(group,
     * topic), which mqadmin calls, asks only the brokers of the first route it finds among
     * %RETRY%group, the topic, ..., and the retry topic may live on one broker only.
     */
    static void consumerProgress(DefaultMQAdminExt a, JSONObject spec) throws Exception {
        String topic = spec.getString("topic");
        ConsumeStats s = new ConsumeStats();
        for (BrokerData b : a.examineTopicRouteInfo(topic).getBrokerDatas()) {
            String addr = b.selectBrokerAddr();
            if (addr == null) continue;
            s.getOffsetTable().putAll(
                a.examineConsumeStats(addr, spec.getString("group"), topic, 10000).getOffsetTable());
        }
        List<MessageQueue> mqs = new ArrayList<>(s.getOffsetTable().keySet());
        Collections.sort(mqs);
        for (MessageQueue mq : mqs) {
            OffsetWrapper w = s.getOffsetTable().get(mq);
            Map<String, Object> m = new HashMap<>();
            m.put("topic", mq.getTopic());
            m.put("brokerName", mq.getBrokerName());
            m.put("queueId", mq.getQueueId());
            m.put("brokerOffset", w.getBrokerOffset());
            m.put("consumerOffset", w.getConsumerOffset());
            m.put("pullOffset", w.getPullOffset());
            m.put("lastTimestamp", w.getLastTimestamp());
            out(m);
        }
    }

    /**
     * What mqadmin consumerStatus gathers: each connected client of the group (from a
     * broker's consumer connections) and its running info (relayed to the client).
     */
    static void consumerStatus(DefaultMQAdminExt a, JSONObject spec) throws Exception {
        String group = spec.getString("group");
        ConsumerConnection cc = a.examineConsumerConnectionInfo(group);
        for (Connection conn : cc.getConnectionSet()) {
            ConsumerRunningInfo info = a.getConsumerRunningInfo(group, conn.getClientId(), false);
            Map<String, Object> m = new HashMap<>();
            m.put("clientId", conn.getClientId());
            m.put("language", conn.getLanguage().name());
            m.put("consumeType", cc.getConsumeType().name());
            Map<String, String> props = new TreeMap<>();
            for (String k : info.getProperties().stringPropertyNames()) {
                props.put(k, info.getProperties().getProperty(k));
            }
            m.put("properties", props);
            List<String> topics = new ArrayList<>();
            for (SubscriptionData d : info.getSubscriptionSet()) topics.add(d.getTopic());
            m.put("topics", topics);
            m.put("formatted", info.formatString().length() > 0);
            out(m);
        }
    }

    /** The broker's running configuration (every setting, as strings). */
    static void brokerConfig(DefaultMQAdminExt a, String broker) throws Exception {
        String addr = masters(a).get(broker);
        if (addr == null) throw new IllegalArgumentException("no broker " + broker);
        Map<String, Object> m = new TreeMap<>();
        for (Map.Entry<Object, Object> e : a.getBrokerConfig(addr).entrySet()) {
            m.put(e.getKey().toString(), e.getValue().toString());
        }
        out(m);
    }

    static void serve(String ns) throws Exception {
        DefaultMQAdminExt a = admin(ns);
        try {
            // the first request connects and loads most classes: done while brokers boot
            a.examineBrokerClusterInfo();
        } catch (Exception e) {
            // no NameServer yet: the first request connects
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        out(Map.of("_end", true, "serving", true));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Map<String, Object> end = new HashMap<>();
            end.put("_end", true);
            try {
                JSONObject req = JSON.parseObject(line);
                switch (req.getString("op")) {
                    case "cluster": cluster(a); break;
                    case "ready": readyAll(a, req); break;
                    case "gone": gone(a, req); break;
                    case "route": route(a, req.getString("topic")); break;
                    case "createTopic": createTopic(a, req); break;
                    case "consumerProgress": consumerProgress(a, req); break;
                    case "query": query(a, req.getString("topic"), strings(req, "keys")); break;
                    case "produce": produce(ns, req); break;
                    case "pull": pull(ns, req); break;
                    case "transact": transact(ns, req); break;
                    case "brokerConfig": brokerConfig(a, req.getString("broker")); break;
                    case "consumerStatus": consumerStatus(a, req); break;
                    default: throw new IllegalArgumentException("unknown op " + req.getString("op"));
                }
            } catch (Throwable e) {
                end.put("error", e.toString());
            }
            out(end);
        }
        a.shutdown();
    }

    static JSONObject specFromStdin() throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder sb = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) sb.append(line).append('\n');
        return JSON.parseObject(sb.toString());
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
            case "produce": produce(ns, specFromStdin()); break;
            case "pull": pull(ns, specFromStdin()); break;
            case "transact": transact(ns, specFromStdin()); break;
            case "serve": serve(ns); break;
            default: throw new IllegalArgumentException(a[1]);
        }
        System.exit(0);
    }
}
