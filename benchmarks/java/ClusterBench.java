import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONObject;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
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
 * (the benchmark alternates them with its Python rounds):
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
 *       transactionally.
 * </ul>
 */
public class ClusterBench {
    static final PrintStream OUT =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    static DefaultMQProducer producer;
    static TransactionMQProducer transactional;

    static void answer(Map<String, Object> m) {
        OUT.println(JSON.toJSONString(m));
        OUT.flush();
    }

    static String unique(String what) {
        return what + "-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
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

    static Map<String, Object> transact(JSONObject req) throws Exception {
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

    public static void main(String[] args) throws Exception {
        String ns = args[0];
        producer = new DefaultMQProducer("bench-producer");
        producer.setNamesrvAddr(ns);
        producer.setInstanceName(unique("producer"));
        producer.setSendMsgTimeout(30000);
        producer.start();
        transactional = new TransactionMQProducer("bench-tx-producer");
        transactional.setNamesrvAddr(ns);
        transactional.setInstanceName(unique("tx-producer"));
        transactional.setSendMsgTimeout(30000);
        transactional.setTransactionListener(new TransactionListener() {
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        transactional.start();
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
                        case "pull": answer(pull(ns, req)); break;
                        case "send": answer(send(ns, req)); break;
                        case "transact": answer(transact(req)); break;
                        default: answer(Map.of("error", "unknown op " + req.getString("op")));
                    }
                } catch (Exception e) {
                    answer(Map.of("error", String.valueOf(e)));
                }
            }
        } finally {
            producer.shutdown();
            transactional.shutdown();
        }
        System.exit(0);
    }
}
