import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.AclUtils;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.acl.plain.PlainAccessData;
import org.apache.rocketmq.acl.plain.PlainAccessValidator;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * RocketMQ's Java client with and without {@code AclClientRPCHook}, for the serve ACL tests.
 *
 * <p>Usage: {@code ServeAcl NAMESRV} with a JSON array of steps on stdin; each step has an
 * {@code op} and, for the client ones, {@code ak} and {@code sk} (no {@code ak}: no hook):
 * {@code send} (topic, n: DefaultMQProducer, no retries), {@code consume} (topic, group, n,
 * timeoutMs: DefaultLitePullConsumer subscribed, offsets committed), {@code createTopic}
 * (broker, topic: DefaultMQAdminExt), {@code yaml} (file: what RocketMQ's own loader reads
 * from a plain_acl.yml), {@code validate} (home: a directory with conf/plain_acl.yml; requests:
 * code, ext, body in Base64, version, addr: what the broker's PlainAccessValidator decides for
 * each, "ok" or the refusal). Prints one JSON line per result, each with its {@code step}.
 */
public class ServeAcl {
    static final PrintStream OUT =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    static int instances = 0;

    static void out(int step, Map<String, Object> m) {
        m.put("step", step);
        OUT.println(JSON.toJSONString(m));
        OUT.flush();
    }

    public static void main(String[] a) throws Exception {
        String ns = a[0];
        JSONArray steps = JSON.parseArray(new String(System.in.readAllBytes(), StandardCharsets.UTF_8));
        for (int i = 0; i < steps.size(); i++) {
            JSONObject s = steps.getJSONObject(i);
            switch (s.getString("op")) {
                case "send": send(i, ns, s); break;
                case "consume": consume(i, ns, s); break;
                case "createTopic": createTopic(i, ns, s); break;
                case "yaml": yaml(i, s); break;
                case "validate": validate(i, s); break;
                default: throw new IllegalArgumentException(s.getString("op"));
            }
        }
        OUT.flush();
        System.exit(0); // the clients' scheduled threads would keep the JVM alive
    }

    static RPCHook hook(JSONObject s) {
        String ak = s.getString("ak");
        return ak == null ? null : new AclClientRPCHook(new SessionCredentials(ak, s.getString("sk")));
    }

    static String instance() {
        // One client instance per step: instances of one name share the first one's hook.
        return "acl-" + ProcessHandle.current().pid() + "-" + (instances++);
    }

    static Map<String, Object> failure(Throwable e) {
        Map<String, Object> m = new HashMap<>();
        int code = -1;
        if (e instanceof MQBrokerException) code = ((MQBrokerException) e).getResponseCode();
        if (e instanceof MQClientException) code = ((MQClientException) e).getResponseCode();
        StringBuilder message = new StringBuilder(String.valueOf(e.getMessage()));
        for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
            if (code == -1 && c instanceof MQBrokerException) {
                code = ((MQBrokerException) c).getResponseCode();
            }
            message.append(" | ").append(c.getMessage());
        }
        m.put("error", code);
        m.put("message", message.toString());
        return m;
    }

    static void send(int step, String ns, JSONObject s) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("acl-producer", hook(s));
        p.setNamesrvAddr(ns);
        p.setInstanceName(instance());
        p.setRetryTimesWhenSendFailed(0);
        p.setSendMsgTimeout(15000);
        p.start();
        try {
            for (int i = 0; i < s.getIntValue("n"); i++) {
                Map<String, Object> m;
                try {
                    Message msg = new Message(s.getString("topic"), "acl",
                        ("k" + i), ("body-" + i).getBytes(StandardCharsets.UTF_8));
                    SendResult r = p.send(msg);
                    m = new HashMap<>();
                    m.put("status", r.getSendStatus().name());
                    m.put("queue", r.getMessageQueue().getQueueId());
                    m.put("offset", r.getQueueOffset());
                } catch (MQClientException | MQBrokerException e) {
                    m = failure(e);
                }
                out(step, m);
            }
        } finally {
            p.shutdown();
        }
    }

    static void consume(int step, String ns, JSONObject s) throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(s.getString("group"), hook(s));
        c.setNamesrvAddr(ns);
        c.setInstanceName(instance());
        c.setAutoCommit(true);
        c.setPollTimeoutMillis(500);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(s.getString("topic"), "*");
        c.start();
        long deadline = System.currentTimeMillis() + s.getLongValue("timeoutMs");
        Set<String> seen = new HashSet<>();
        try {
            while (System.currentTimeMillis() < deadline && seen.size() < s.getIntValue("n")) {
                List<MessageExt> got = c.poll();
                for (MessageExt x : got) {
                    if (!seen.add(x.getQueueId() + ":" + x.getQueueOffset())) continue;
                    Map<String, Object> m = new HashMap<>();
                    m.put("key", x.getKeys());
                    m.put("queue", x.getQueueId());
                    m.put("offset", x.getQueueOffset());
                    m.put("body", new String(x.getBody(), StandardCharsets.UTF_8));
                    out(step, m);
                }
            }
            if (!seen.isEmpty()) c.commitSync();
        } finally {
            c.shutdown(); // persists the offsets it holds
        }
        Map<String, Object> done = new HashMap<>();
        done.put("consumed", seen.size());
        out(step, done);
    }

    static void createTopic(int step, String ns, JSONObject s) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(hook(s), 15000);
        admin.setNamesrvAddr(ns);
        admin.setInstanceName(instance());
        admin.start();
        Map<String, Object> m = new HashMap<>();
        try {
            admin.createAndUpdateTopicConfig(
                s.getString("broker"), new TopicConfig(s.getString("topic"), 2, 2, 6));
            m.put("created", true);
        } catch (Exception e) {
            m = failure(e);
        } finally {
            admin.shutdown();
        }
        out(step, m);
    }

    static void yaml(int step, JSONObject s) {
        Map<String, Object> m = new HashMap<>();
        try {
            PlainAccessData d = AclUtils.getYamlDataObject(s.getString("file"), PlainAccessData.class);
            m.put("data", d == null ? null : JSON.parseObject(JSON.toJSONString(d)));
        } catch (Exception e) {
            m.put("error", String.valueOf(e.getMessage()));
        }
        out(step, m);
    }

    static void validate(int step, JSONObject s) {
        System.setProperty("rocketmq.home.dir", s.getString("home"));
        PlainAccessValidator validator = new PlainAccessValidator();
        JSONArray requests = s.getJSONArray("requests");
        for (int i = 0; i < requests.size(); i++) {
            JSONObject r = requests.getJSONObject(i);
            RemotingCommand cmd = RemotingCommand.createRequestCommand(r.getIntValue("code"), null);
            HashMap<String, String> ext = new HashMap<>();
            JSONObject fields = r.getJSONObject("ext");
            for (String k : fields.keySet()) ext.put(k, fields.getString(k));
            cmd.setExtFields(ext);
            if (r.getString("body") != null) cmd.setBody(Base64.getDecoder().decode(r.getString("body")));
            cmd.setVersion(r.getIntValue("version"));
            Map<String, Object> m = new HashMap<>();
            m.put("index", i);
            try {
                validator.validate(validator.parse(cmd, r.getString("addr")));
                m.put("ok", true);
            } catch (Exception e) {
                m.put("refused", String.valueOf(e.getMessage()));
            }
            out(step, m);
        }
    }
}
