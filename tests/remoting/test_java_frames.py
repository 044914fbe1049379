"""RocketMQ's own RemotingCommand against ours: it wrote the golden frames, it reads our frames.

The Java program below is compiled and run against the RocketMQ 5.3.1 jars ``./dev``
fetches (``.jars/rocketmq``). ``encode`` prints the golden frames; ``decode`` reads
frames and prints what ``RemotingCommand.decode`` makes of them (the LENGTH field
stripped, as NettyDecoder does); ``headers`` parses a frame's ext fields as a header
class (``decodeCommandCustomHeader``) and prints what Java writes back for it. Needs
java and javac (skipped without them, failed under CI).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import types
import typing

import pytest

from rocketspark.remoting import headers
from rocketspark.remoting.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.headers import (
    GetRouteInfoRequestHeader,
    Header,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from tests.helpers.jvm import QUIET, need_java
from tests.remoting.golden import GOLDEN_FILE

JAVA = r"""import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.remoting.CommandCustomHeader;
import org.apache.rocketmq.remoting.protocol.LanguageCode;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.RequestCode;
import org.apache.rocketmq.remoting.protocol.ResponseCode;
import org.apache.rocketmq.remoting.protocol.SerializeType;
import org.apache.rocketmq.remoting.protocol.header.PullMessageResponseHeader;
import org.apache.rocketmq.remoting.protocol.header.SendMessageRequestHeader;
import org.apache.rocketmq.remoting.protocol.header.SendMessageRequestHeaderV2;
import org.apache.rocketmq.remoting.protocol.header.namesrv.GetRouteInfoRequestHeader;

/**
 * Remoting frames by RocketMQ's own RemotingCommand. "encode": print the golden frames, one
 * "name hex" a line. "decode": read such lines and print what RemotingCommand.decode makes of
 * each frame (its LENGTH stripped, as NettyDecoder does). "headers": read "JavaClass hex" lines,
 * parse each frame's ext fields as that header class and print the ext fields Java writes back.
 */
public class RemotingGolden {
    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) s.append(String.format("%02x", x));
        return s.toString();
    }

    static String hex(String s) {
        return s == null ? "null" : hex(s.getBytes(StandardCharsets.UTF_8));
    }

    static byte[] unhex(String h) {
        byte[] b = new byte[h.length() / 2];
        for (int i = 0; i < b.length; i++) {
            b[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
        }
        return b;
    }

    /** The bytes NettyEncoder writes: fastEncodeHeader, then the body. */
    static byte[] frame(RemotingCommand cmd) {
        ByteBuf out = Unpooled.buffer();
        cmd.fastEncodeHeader(out);
        if (cmd.getBody() != null) out.writeBytes(cmd.getBody());
        byte[] b = new byte[out.readableBytes()];
        out.readBytes(b);
        return b;
    }

    static RemotingCommand typed(RemotingCommand cmd, SerializeType type, int opaque) {
        cmd.setSerializeTypeCurrentRPC(type);
        cmd.setOpaque(opaque);
        cmd.setVersion(475);
        return cmd;
    }

    static void emit(String name, RemotingCommand cmd) {
        System.out.println(name + " " + hex(frame(cmd)));
    }

    /** The frame of "name hex" without its LENGTH field. */
    static RemotingCommand decodeLine(String[] parts) throws Exception {
        byte[] frame = unhex(parts[1]);
        ByteBuffer buf = ByteBuffer.wrap(frame);
        int length = buf.getInt();
        if (length != frame.length - 4) {
            throw new IllegalStateException(parts[0] + ": LENGTH " + length);
        }
        return RemotingCommand.decode(buf.slice());
    }

    public static void main(String[] args) throws Exception {
        if (args[0].equals("encode")) encode();
        else if (args[0].equals("headers")) headers();
        else decode();
    }

    static void encode() throws Exception {
        for (SerializeType type : SerializeType.values()) {
            String t = type.name().toLowerCase();

            GetRouteInfoRequestHeader route = new GetRouteInfoRequestHeader();
            route.setTopic("TopicTest");
            route.setAcceptStandardJsonOnly(true);
            RemotingCommand get =
                RemotingCommand.createRequestCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, route);
            emit("route_" + t, typed(get, type, 7));

            SendMessageRequestHeader v1 = new SendMessageRequestHeader();
            v1.setProducerGroup("pg");
            v1.setTopic("TopicTest");
            v1.setDefaultTopic("TBW102");
            v1.setDefaultTopicQueueNums(4);
            v1.setQueueId(1);
            v1.setSysFlag(0);
            v1.setBornTimestamp(1700000000123L);
            v1.setFlag(0);
            v1.setProperties("KEYS\u0001k1\u0002UNIQ_KEY\u0001AB\u0002");
            v1.setReconsumeTimes(0);
            v1.setUnitMode(false);
            v1.setBatch(false);
            v1.setBname("broker-a");
            SendMessageRequestHeaderV2 v2 =
                SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(v1);
            RemotingCommand send = typed(
                RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE_V2, v2), type, 8);
            send.setBody("héllo body".getBytes(StandardCharsets.UTF_8));
            emit("send_v2_" + t, send);

            RemotingCommand pulled = typed(
                RemotingCommand.createResponseCommand(PullMessageResponseHeader.class), type, 9);
            pulled.setCode(ResponseCode.SUCCESS);
            pulled.setRemark(null);
            PullMessageResponseHeader ph = (PullMessageResponseHeader) pulled.readCustomHeader();
            ph.setNextBeginOffset(12L);
            ph.setMinOffset(0L);
            ph.setMaxOffset(12L);
            ph.setSuggestWhichBrokerId(0L);
            pulled.setBody(new byte[] {1, 2, 3, 4, 5});
            emit("pull_answer_" + t, pulled);

            RemotingCommand error = RemotingCommand.createResponseCommand(
                ResponseCode.TOPIC_NOT_EXIST, "topic 订单 not exist");
            emit("error_" + t, typed(error, type, 10));

            RemotingCommand oneway = typed(
                RemotingCommand.createRequestCommand(RequestCode.HEART_BEAT, null), type, 11);
            oneway.markOnewayRPC();
            oneway.setLanguage(LanguageCode.PYTHON);
            oneway.setRemark("");
            oneway.setBody("{}".getBytes(StandardCharsets.UTF_8));
            emit("oneway_" + t, oneway);
        }
    }

    static void decode() throws Exception {
        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] parts = line.split(" ");
            RemotingCommand cmd = decodeLine(parts);
            TreeMap<String, String> ext = new TreeMap<>();
            if (cmd.getExtFields() != null) ext.putAll(cmd.getExtFields());
            StringBuilder s = new StringBuilder(parts[0]);
            s.append(" code=").append(cmd.getCode());
            s.append(" language=").append(cmd.getLanguage());
            s.append(" version=").append(cmd.getVersion());
            s.append(" opaque=").append(cmd.getOpaque());
            s.append(" flag=").append(cmd.getFlag());
            s.append(" type=").append(cmd.getSerializeTypeCurrentRPC());
            s.append(" remark=").append(hex(cmd.getRemark()));
            for (Map.Entry<String, String> e : ext.entrySet()) {
                s.append(" ext:").append(e.getKey()).append("=").append(hex(e.getValue()));
            }
            s.append(" body=").append(cmd.getBody() == null ? "null" : hex(cmd.getBody()));
            if (cmd.getCode() == RequestCode.SEND_MESSAGE_V2 && !cmd.isResponseType()) {
                SendMessageRequestHeaderV2 v2 = (SendMessageRequestHeaderV2)
                    cmd.decodeCommandCustomHeader(SendMessageRequestHeaderV2.class);
                SendMessageRequestHeader v1 =
                    SendMessageRequestHeaderV2.createSendMessageRequestHeaderV1(v2);
                s.append(" v1:topic=").append(v1.getTopic());
                s.append(" v1:queueId=").append(v1.getQueueId());
                s.append(" v1:bornTimestamp=").append(v1.getBornTimestamp());
                s.append(" v1:unitMode=").append(v1.isUnitMode());
                s.append(" v1:batch=").append(v1.isBatch());
                s.append(" v1:bname=").append(v1.getBname());
            }
            System.out.println(s);
        }
    }

    @SuppressWarnings("unchecked")
    static void headers() throws Exception {
        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] parts = line.split(" ");
            Class<? extends CommandCustomHeader> cls =
                (Class<? extends CommandCustomHeader>) Class.forName(parts[0]);
            RemotingCommand cmd = decodeLine(parts);
            CommandCustomHeader header = cmd.decodeCommandCustomHeader(cls);
            RemotingCommand back = RemotingCommand.createRequestCommand(cmd.getCode(), header);
            back.makeCustomHeaderToNet();
            TreeMap<String, String> ext = new TreeMap<>(back.getExtFields());
            StringBuilder s = new StringBuilder(cls.getSimpleName());
            for (Map.Entry<String, String> e : ext.entrySet()) {
                s.append(" ").append(e.getKey()).append("=").append(hex(e.getValue()));
            }
            System.out.println(s);
        }
    }
}
"""

HEADER_PACKAGE = "org.apache.rocketmq.remoting.protocol.header"
NAMESRV_HEADERS = {
    "GetRouteInfoRequestHeader",
    "DeleteTopicFromNamesrvRequestHeader",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "UnRegisterBrokerRequestHeader",
}
BOTH = [SerializeType.JSON, SerializeType.ROCKETMQ]


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    """Compile the program once; return ``run(mode, stdin) -> stdout``."""
    (classpath,) = need_java()
    build = tmp_path_factory.mktemp("remoting-java")
    (build / "RemotingGolden.java").write_text(JAVA)
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(build), str(build / "RemotingGolden.java")],
        check=True,
        capture_output=True,
        timeout=180,
    )

    def run(mode: str, stdin: str = "") -> str:
        done = subprocess.run(
            ["java", *QUIET, "-cp", f"{classpath}{os.pathsep}{build}", "RemotingGolden", mode],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run


def test_java_still_writes_the_golden_frames(java):
    assert java("encode") == GOLDEN_FILE.read_text()


def describe(name: str, cmd: RemotingCommand) -> str:
    """What the Java program prints for a frame it decodes."""
    # RocketMQ 5.3.1 reads an empty string of a ROCKETMQ header (remark, ext value) as null.
    binary = cmd.serialize_type == SerializeType.ROCKETMQ

    def text(value: str | None) -> str:
        return "null" if value is None or (binary and value == "") else value.encode().hex()

    parts = [
        name,
        f"code={cmd.code}",
        f"language={LanguageCode(cmd.language).name}",
        f"version={cmd.version}",
        f"opaque={cmd.opaque}",
        f"flag={cmd.flag}",
        f"type={cmd.serialize_type.name}",
        f"remark={text(cmd.remark)}",
    ]
    parts += [f"ext:{k}={text(v)}" for k, v in sorted(cmd.ext_fields.items())]
    parts.append("body=" + ("null" if cmd.body is None else bytes(cmd.body).hex()))
    return " ".join(parts)


def our_commands() -> dict[str, RemotingCommand]:
    send = SendMessageRequestHeader(
        producer_group="pg",
        topic="Tópico",
        queue_id=3,
        born_timestamp=1700000000999,
        properties="KEYS\x01k1 k2\x02TAGS\x01标签\x02",
        unit_mode=True,
        batch=True,
        broker_name="broker-b",
    )
    pull = PullMessageRequestHeader(
        consumer_group="cg",
        topic="TopicTest",
        queue_id=2,
        queue_offset=1 << 40,
        max_msg_nums=32,
        sys_flag=7,
        commit_offset=0,
        suspend_timeout_millis=20_000,
        subscription="TagA || TagB",
        sub_version=0,
        expression_type="TAG",
        broker_name="broker-a",
    )
    out: dict[str, RemotingCommand] = {}
    for st in BOTH:
        name = st.name.lower()
        out[f"route_{name}"] = RemotingCommand(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            opaque=1,
            ext_fields=GetRouteInfoRequestHeader(topic="TopicTest").to_ext_fields(),
            serialize_type=st,
        )
        out[f"send_{name}"] = RemotingCommand(
            RequestCode.SEND_MESSAGE_V2,
            opaque=2,
            ext_fields=send.to_v2().to_ext_fields(),
            body="körper ✓".encode(),
            serialize_type=st,
        )
        out[f"pull_{name}"] = RemotingCommand(
            RequestCode.PULL_MESSAGE,
            opaque=-5,
            ext_fields=pull.to_ext_fields(),
            serialize_type=st,
        )
        out[f"answer_{name}"] = RemotingCommand(
            ResponseCode.PULL_NOT_FOUND,
            opaque=2**31 - 1,
            flag=1,
            language=LanguageCode.GO,
            remark='no "message"\\ here\n\t\x01 ✓',
            ext_fields={"nextBeginOffset": "5", "k\x02": 'v"\\/\x7f', "空": ""},
            body=bytes(range(256)) * 256,
            serialize_type=st,
        )
        out[f"oneway_{name}"] = RemotingCommand.request(
            RequestCode.HEART_BEAT, body=b'{"clientID":"x"}', oneway=True, serialize_type=st
        )
    out["empty_remark_json"] = RemotingCommand(ResponseCode.SUCCESS, flag=1, remark="")
    out["big_code_json"] = RemotingCommand(200050, version=-1)
    return out


def test_java_decodes_our_frames(java):
    ours = our_commands()
    stdin = "".join(f"{name} {cmd.to_bytes().hex()}\n" for name, cmd in ours.items())
    lines = java("decode", stdin).splitlines()
    assert len(lines) == len(ours)
    for line, (name, cmd) in zip(lines, ours.items(), strict=True):
        generic, _, v1 = line.partition(" v1:")
        assert generic == describe(name, cmd)
        if name.startswith("send_"):
            # Java maps our v2 letters back to SendMessageRequestHeader's fields
            assert "v1:" + v1 == (
                "v1:topic=Tópico v1:queueId=3 v1:bornTimestamp=1700000000999"
                " v1:unitMode=true v1:batch=true v1:bname=broker-b"
            )


def _kind(cls: type[Header], name: str) -> type:
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType):
        (hint,) = (a for a in typing.get_args(hint) if a is not type(None))
    return typing.cast(type, hint)


# Values Java's checkFields() or its parsers insist on.
SPECIAL = {"topic_filter_type": "SINGLE_TAG", "commit_or_rollback": 8}


def full(cls: type[Header]) -> Header:
    """An instance of ``cls`` with every field set."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        kind = _kind(cls, f.name)
        if f.name in SPECIAL:
            values[f.name] = SPECIAL[f.name]
        elif kind is bool:
            values[f.name] = True
        elif kind is int:
            values[f.name] = 8
        else:
            values[f.name] = f"{f.name}-ü"
    return cls(**values)


HEADER_CLASSES = [
    getattr(headers, name)
    for name in headers.__all__
    if name.endswith("Header") and name != "Header"
]
# Fields Java reads as an enum, not from our string: SearchOffsetRequestHeader.boundaryType.
JAVA_TYPED = {("SearchOffsetRequestHeader", "boundaryType")}


def test_java_reads_and_rewrites_every_header(java):
    stdin = []
    expected = {}
    for cls in HEADER_CLASSES:
        java_class = cls.__name__
        package = f"{HEADER_PACKAGE}.namesrv" if java_class in NAMESRV_HEADERS else HEADER_PACKAGE
        header = full(cls)
        frame = RemotingCommand(RequestCode.HEART_BEAT, ext_fields=header.to_ext_fields())
        stdin.append(f"{package}.{java_class} {frame.to_bytes().hex()}\n")
        expected[java_class] = header.to_ext_fields()
    lines = java("headers", "".join(stdin)).splitlines()
    assert len(lines) == len(HEADER_CLASSES)
    for line in lines:
        name, *fields = line.split(" ")
        theirs = {k: bytes.fromhex(v).decode() for k, v in (f.split("=", 1) for f in fields)}
        ours = {k: v for k, v in expected[name].items() if (name, k) not in JAVA_TYPED}
        theirs = {k: v for k, v in theirs.items() if (name, k) not in JAVA_TYPED}
        assert theirs == ours, name
