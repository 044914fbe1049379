import com.alibaba.fastjson.JSON;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * DefaultMQPushConsumer for the serve tests: prints one JSON line per message delivered.
 *
 * <p>Usage: {@code ServePush NAMESRV TOPIC GROUP concurrent|orderly DONE FAILS MAXRECONSUME
 * TIMEOUTMS}. A message whose keys start with "fail" is never consumed (RECONSUME_LATER),
 * so it comes back from the group's retry topic until it goes to the dead-letter topic
 * after MAXRECONSUME retries. Stops once DONE distinct keys were consumed (successfully),
 * FAILS failing keys were delivered for the last time, and 2 s passed without a delivery;
 * or after TIMEOUTMS.
 */
public class ServePush {
    static final PrintStream OUT =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

    static synchronized void out(Map<String, Object> m) {
        OUT.println(JSON.toJSONString(m));
        OUT.flush();
    }

    public static void main(String[] a) throws Exception {
        String ns = a[0], topic = a[1], group = a[2], mode = a[3];
        int done = Integer.parseInt(a[4]);
        int fails = Integer.parseInt(a[5]);
        int maxReconsume = Integer.parseInt(a[6]);
        long deadline = System.currentTimeMillis() + Long.parseLong(a[7]);
        Set<String> exhausted = java.util.Collections.synchronizedSet(new HashSet<>());
        Set<String> consumed = java.util.Collections.synchronizedSet(new HashSet<>());
        AtomicInteger deliveries = new AtomicInteger();
        long[] last = {System.currentTimeMillis()};

        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(ns);
        c.setInstanceName("push-" + ProcessHandle.current().pid());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setMaxReconsumeTimes(maxReconsume);
        c.subscribe(topic, "*");
        if (mode.equals("orderly")) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) record(m, consumed, deliveries, last, true);
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                boolean fail = false;
                for (MessageExt m : msgs) {
                    boolean ok = !m.getKeys().startsWith("fail");
                    record(m, consumed, deliveries, last, ok);
                    if (!ok && m.getReconsumeTimes() >= maxReconsume) exhausted.add(m.getKeys());
                    fail |= !ok;
                }
                return fail ? ConsumeConcurrentlyStatus.RECONSUME_LATER
                            : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c.setConsumeMessageBatchMaxSize(1);
        }
        c.start();
        while (System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
            if (consumed.size() >= done && exhausted.size() >= fails
                && System.currentTimeMillis() - last[0] > 2000) break;
        }
        c.shutdown();
        OUT.flush();
        System.exit(0); // the client's scheduled threads would keep the JVM alive
    }

    static void record(MessageExt m, Set<String> consumed, AtomicInteger deliveries, long[] last,
                       boolean ok) {
        Map<String, Object> o = new HashMap<>();
        o.put("key", m.getKeys());
        o.put("topic", m.getTopic());
        o.put("queue", m.getQueueId());
        o.put("offset", m.getQueueOffset());
        o.put("reconsume", m.getReconsumeTimes());
        o.put("ok", ok);
        o.put("thread", Thread.currentThread().getName());
        out(o);
        if (ok) consumed.add(m.getKeys());
        deliveries.incrementAndGet();
        last[0] = System.currentTimeMillis();
    }
}
