"""We write, RocketMQ reads: RocketMQ 5.3.1's own MessageDecoder decodes every record
of a CommitLog written by rocketspark (CRC checked), and agrees with our store on every
field. Needs java, javac and the rocketmq jars ``./dev`` fetches into ``.jars/rocketmq``; under
CI their absence is a failure, not a skip."""

from __future__ import annotations

import os
import subprocess

from rocketspark.store import Message, MessageStore
from tests.helpers.jvm import QUIET, need_java

JAVA = r"""
import java.nio.ByteBuffer;
import java.nio.file.*;
import java.util.*;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;

public class DecodeDriver {
    public static void main(String[] args) throws Exception {
        List<Path> files = new ArrayList<>();
        try (var s = Files.list(Paths.get(args[0], "commitlog"))) {
            s.sorted().forEach(files::add);
        }
        HexFormat hex = HexFormat.of();
        for (Path f : files) {
            byte[] bytes = Files.readAllBytes(f);
            ByteBuffer bb = ByteBuffer.wrap(bytes);
            int pos = 0;
            while (pos + 8 <= bytes.length) {
                int total = bb.getInt(pos);
                int magic = bb.getInt(pos + 4);
                if (total == 0 || magic == 0xcbd43194) break;  // end of data, or BLANK
                ByteBuffer one = ByteBuffer.wrap(Arrays.copyOfRange(bytes, pos, pos + total));
                MessageExt m = MessageDecoder.decode(one, true, true, false, false, true);
                if (m == null) {
                    System.out.println("UNDECODABLE\t" + f.getFileName() + "\t" + pos);
                    break;
                }
                System.out.println(String.join("\t", m.getTopic(), "" + m.getQueueId(),
                    "" + m.getQueueOffset(), "" + m.getCommitLogOffset(), m.getMsgId(),
                    String.valueOf(m.getTags()), String.valueOf(m.getKeys()),
                    String.valueOf(m.getProperty("UNIQ_KEY")), hex.formatHex(m.getBody()),
                    "" + m.getSysFlag(), "" + m.getReconsumeTimes(), "" + m.getStoreSize(),
                    "" + m.getBornTimestamp(), "" + m.getStoreTimestamp(),
                    "" + m.getPreparedTransactionOffset()));
                pos += total;
            }
        }
    }
}
"""


def test_rocketmq_decodes_every_record_we_write(tmp_path):
    (classpath,) = need_java()
    path = str(tmp_path / "store")
    with MessageStore.open(path, mappedFileSizeCommitLog=64 * 1024) as s:
        s.create_topic("orders", queues=3)
        s.create_topic("payments", queues=1)
        s.put_batch(
            [
                Message(
                    "orders",
                    f"körper-{i}-".encode() * (i % 40 + 1),
                    tags=["created", "paid", None][i % 3],
                    keys=[f"o-{i}", f"c-{i % 7}"],
                    properties={"k": str(i), "ünï": "cödé"} if i % 2 else {},
                )
                for i in range(300)
            ]
        )
        for i in range(20):
            s.put(Message("payments", b"p%d" % i, keys=[f"p-{i}"]))
        half = s.prepare(Message("payments", b"transactional", tags="tx"))
        s.commit_transaction(half)
        assert len(os.listdir(os.path.join(path, "commitlog"))) >= 2  # crosses a segment
        ours = {}
        for topic, queues in (("orders", 3), ("payments", 1)):
            for q in range(queues):
                for m in s.pull(topic, q, 0, max_msgs=10_000).messages:
                    ours[m.commitlog_offset] = m
    build = tmp_path / "java"
    build.mkdir()
    (build / "DecodeDriver.java").write_text(JAVA)
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(build), str(build / "DecodeDriver.java")],
        check=True,
        capture_output=True,
        timeout=180,
    )
    done = subprocess.run(
        ["java", *QUIET, "-cp", f"{classpath}{os.pathsep}{build}", "DecodeDriver", path],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split("\t") for line in done.stdout.splitlines() if line]
    assert not [x for x in lines if x[0] == "UNDECODABLE"], lines[-1]
    theirs = {int(x[3]): x for x in lines}
    assert len(theirs) == len(lines)
    assert set(ours) <= set(theirs)
    # every record, system ones included: 300 + 20 + half + commit + op record
    assert len(lines) == 300 + 20 + 3
    for off, m in ours.items():
        (
            topic,
            qid,
            qoff,
            phy,
            msg_id,
            tags,
            keys,
            uniq,
            body,
            sys_flag,
            reconsume,
            size,
            born_ts,
            store_ts,
            prepared,
        ) = theirs[off]
        assert (topic, int(qid), int(qoff), int(phy)) == (
            m.topic,
            m.queue_id,
            m.queue_offset,
            m.commitlog_offset,
        )
        assert msg_id == m.msg_id and uniq == m.uniq_key
        assert tags == str(m.tags) if m.tags else tags == "null"
        assert keys == (" ".join(m.keys) if m.keys else "null")
        assert bytes.fromhex(body) == m.body
        assert (int(sys_flag), int(reconsume), int(size)) == (
            m.sys_flag,
            m.reconsume_times,
            m.store_size,
        )
        assert (int(born_ts), int(store_ts)) == (m.born_timestamp, m.store_timestamp)
        assert int(prepared) == m.prepared_transaction_offset
    committed = [x for x in lines if x[1:2] and x[0] == "payments" and x[5] == "tx"]
    assert len(committed) == 1 and int(committed[0][9]) & 0xC == 0x8  # TRANSACTION_COMMIT
