import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * RocketMQ's own Java client, timed, for benchmarks/bench_cluster.py.
 *
 * <p>Usage: {@code ClusterBench NAMESRV}, then one JSON request a line on stdin; each is
 * answered with one JSON line on stdout ({@code {"rows": n, "seconds": s}}, or {@code
 * {"error": ...}}). The JVM stays up between requests, so later rounds run JIT-compiled code
 * (the benchmark alternates them with its Python rounds). A request with {@code "ns"} goes to
 * that NameServer instead of NAMESRV (producers are kept per NameServer), so one JVM, the same
 * compiled code, measures two servers (benchmarks/bench_serve.py):
 *
 * <ul>
 *   <li>{@code {"op": "pull", "topic": t, "n": N, "batch": B}}: a new {@code
 *       DefaultLitePullConsumer} group, every queue of the topic assigned, starting at the
 *       first offset, {@code poll()} until N messages came; pullBatchSize B. Timed from
 *       assign to the N-th message (the consumer's start and route lookup are not);
 *   <li>{@code {"op": "send", "topic": t, "n": N, "batch": 0}}: N synchronous {@code
 *       producer.send(msg)}; with {@code "batch": B}, N/B synchronous {@code
 *       producer.send(Collection)} of B messages each. 100-byte bodies (or {@code "size"});
 *   <li>{@code {"op": "transact", "topic": t, "n": N}}: N {@code
 *       TransactionMQProducer.sendMessageInTransaction(msg)}, each a synchronous half message
 *       and the one-way END_TRANSACTION that commits it (the local transaction answers
 *       COMMIT_MESSAGE at once): what a Java application does to send N messages
 *       transactionally;
 *   <li>{@code {"op": "wake", "topic": t, "n": N, "gapMs": G}}: a new {@code
 *       DefaultMQPushConsumer} group subscribed to the (empty) topic waits; once a first
 *       message reached it, N times: {@code producer.send(msg)} of a numbered message, and the
 *       time from just before that send to the listener receiving the message, both {@code
 *       System.nanoTime()} of this JVM; G ms between a message's arrival and the next send (the
 *       consumer's next pull is held by then). Answers {@code "micros"}, the N times.
 * </ul>
 */
public class ClusterBench {
    static final PrintStream OUT =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    static String defaultNs;
    static final Map<String, DefaultMQProducer> PRODUCERS = new HashMap<>();
    static final Map<String, TransactionMQProducer> TRANSACTIONAL = new HashMap<>();

    static void answer(Map<String, Object> m) {
        OUT.println(JSON.toJSONString(m));
        OUT.flush();
    }

    static String unique(String what) {
        return what + "-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
    }

    static String ns(JSONObject req) {
        return req.containsKey("ns") ? req.getString("ns") : defaultNs;
    }

    static DefaultMQProducer producer(String ns) throws Exception {
        DefaultMQProducer p = PRODUCERS.get(ns);
        if (p == null) {
            p = new DefaultMQProducer("bench-producer");
            p.setNamesrvAddr(ns);
            p.setInstanceName(unique("producer"));
            p.setSendMsgTimeout(30000);
            p.start();
            PRODUCERS.put(ns, p);
        }
        return p;
    }

    static TransactionMQProducer transactional(String ns) throws Exception {
        TransactionMQProducer p = TRANSACTIONAL.get(ns);
        if (p == null) {
            p = new TransactionMQProducer("bench-tx-producer");
            p.setNamesrvAddr(ns);
            p.setInstanceName(unique("tx-producer"));
            p.setSendMsgTimeout(30000);
            p.setTransactionListener(new TransactionListener() {
                public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }

                public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
            });
            p.start();
            TRANSACTIONAL.put(ns, p);
        }
        return p;
    }

    static Map<String, Object> pull(String ns, JSONObject req) throws Exception {
        String topic = req.getString("topic");
        long n = req.getLongValue("n");
        int batch = req.getIntValue("batch");
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(unique("bench-reader"));
        c.setNamesrvAddr(ns);
        c.setInstanceName(unique("reader"));
        c.setAutoCommit(false);
        c.setPullBatchSize(batch);
        // Flow control must not be what limits it: cache several answers per queue.
        c.setPullThresholdForQueue(Math.max(1000, 8 * batch));
        c.setPullThresholdForAll(Math.max(10000, 64 * batch));
        c.setConsumeMaxSpan(Math.max(2000, 16 * batch));
        c.setPollTimeoutMillis(1000);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.start();
        try {
            Collection<MessageQueue> mqs = c.fetchMessageQueues(topic);
            long t0 = System.nanoTime();
            c.assign(mqs);
            long count = 0;
            long bytes = 0;
            long deadline = System.currentTimeMillis() + 600_000;
            while (count < n) {
                if (System.currentTimeMillis() > deadline) {
                    throw new RuntimeException("pulled " + count + " of " + n + " in 600 s");
                }
                List<MessageExt> got = c.poll();
                for (MessageExt m : got) {
                    bytes += m.getBody().length;
                }
                count += got.size();
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            Map<String, Object> out = new HashMap<>();
            out.put("rows", count);
            out.put("bytes", bytes);
            out.put("seconds", seconds);
            out.put("queues", mqs.size());
            return out;
        } finally {
            c.shutdown();
        }
    }

    static Map<String, Object> send(String ns, JSONObject req) throws Exception {
        DefaultMQProducer producer = producer(ns);
        String topic = req.getString("topic");
        int n = req.getIntValue("n");
        int batch = req.getIntValue("batch");
        int size = req.containsKey("size") ? req.getIntValue("size") : 100;
        byte[] body = new byte[size];
        Arrays.fill(body, (byte) 'x');
        long t0 = System.nanoTime();
        int sent = 0;
        if (batch <= 0) {
            for (int i = 0; i < n; i++) {
                SendResult r = producer.send(new Message(topic, "t", body));
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    throw new RuntimeException("send: " + r);
                }
                sent++;
            }
        } else {
            while (sent < n) {
                int k = Math.min(batch, n - sent);
                List<Message> msgs = new ArrayList<>(k);
                for (int i = 0; i < k; i++) {
                    msgs.add(new Message(topic, "t", body));
                }
                SendResult r = producer.send(msgs);
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    throw new RuntimeException("send: " + r);
                }
                sent += k;
            }
        }
        double seconds = (System.nanoTime() - t0) / 1e9;
        Map<String, Object> out = new HashMap<>();
        out.put("rows", sent);
        out.put("seconds", seconds);
        return out;
    }

    static Map<String, Object> transact(String ns, JSONObject req) throws Exception {
        TransactionMQProducer transactional = transactional(ns);
        String topic = req.getString("topic");
        int n = req.getIntValue("n");
        byte[] body = new byte[100];
        Arrays.fill(body, (byte) 'x');
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            SendResult r = transactional.sendMessageInTransaction(new Message(topic, "t", body), null);
            if (r.getSendStatus() != SendStatus.SEND_OK) {
                throw new RuntimeException("transact: " + r);
            }
        }
        double seconds = (System.nanoTime() - t0) / 1e9;
        Map<String, Object> out = new HashMap<>();
        out.put("rows", n);
        out.put("seconds", seconds);
        return out;
    }

    static Map<String, Object> wake(String ns, JSONObject req) throws Exception {
        String topic = req.getString("topic");
        int n = req.getIntValue("n");
        long gapMs = req.containsKey("gapMs") ? req.getLongValue("gapMs") : 20;
        DefaultMQProducer producer = producer(ns);
        byte[] body = new byte[100];
        Arrays.fill(body, (byte) 'x');
        // arrivals: {sequence number, nanoTime when the listener got it}
        LinkedBlockingQueue<long[]> arrived = new LinkedBlockingQueue<>();
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(unique("bench-waker"));
        c.setNamesrvAddr(ns);
        c.setInstanceName(unique("waker"));
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setConsumeMessageBatchMaxSize(1);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            long now = System.nanoTime();
            for (MessageExt m : msgs) {
                arrived.add(new long[] {Long.parseLong(m.getKeys()), now});
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        try {
            // Warm-up: until a message reaches the consumer, its queues are not assigned.
            long deadline = System.currentTimeMillis() + 120_000;
            boolean ready = false;
            long seq = -1;
            while (!ready) {
                if (System.currentTimeMillis() > deadline) {
                    throw new RuntimeException("the push consumer got nothing in 120 s");
                }
                Message m = new Message(topic, "t", body);
                m.setKeys(String.valueOf(seq--));
                producer.send(m);
                ready = arrived.poll(2, TimeUnit.SECONDS) != null;
            }
            Thread.sleep(1000);
            arrived.clear();
            List<Long> micros = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                Message m = new Message(topic, "t", body);
                m.setKeys(String.valueOf(i));
                long t0 = System.nanoTime();
                SendResult r = producer.send(m);
                if (r.getSendStatus() != SendStatus.SEND_OK) {
                    throw new RuntimeException("send: " + r);
                }
                while (true) {
                    long[] got = arrived.poll(30, TimeUnit.SECONDS);
                    if (got == null) {
                        throw new RuntimeException("message " + i + " did not arrive in 30 s");
                    }
                    if (got[0] == i) {
                        micros.add((got[1] - t0) / 1000);
                        break;
                    }
                }
                Thread.sleep(gapMs);
            }
            Map<String, Object> out = new HashMap<>();
            out.put("rows", n);
            out.put("micros", micros);
            return out;
        } finally {
            c.shutdown();
        }
    }

    public static void main(String[] args) throws Exception {
        defaultNs = args[0];
        producer(defaultNs);
        transactional(defaultNs);
        answer(Map.of("ready", true));
        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        try {
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) continue;
                JSONObject req = JSON.parseObject(line);
                try {
                    switch (req.getString("op")) {
                        case "pull": answer(pull(ns(req), req)); break;
                        case "send": answer(send(ns(req), req)); break;
                        case "transact": answer(transact(ns(req), req)); break;
                        case "wake": answer(wake(ns(req), req)); break;
                        default: answer(Map.of("error", "unknown op " + req.getString("op")));
                    }
                } catch (Exception e) {
                    answer(Map.of("error", String.valueOf(e)));
                }
            }
        } finally {
            PRODUCERS.values().forEach(DefaultMQProducer::shutdown);
            TRANSACTIONAL.values().forEach(TransactionMQProducer::shutdown);
        }
        System.exit(0);
    }
}
