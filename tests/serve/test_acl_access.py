"""The broker's ACL check without a network: which resources a request needs
(RocketMQ's ``PlainAccessResource.parse``), and the decision for signed, unsigned and
white-listed requests (``PlainPermissionManager.validate``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from rocketspark.remoting.access import (
    ADMIN_CODES,
    NAMESRV_CODES,
    AccessControl,
    needed,
)
from rocketspark.remoting.acl import Credentials
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.connection import Connection
from rocketspark.remoting.plain_acl import Perm, parse_plain_acl
from rocketspark.remoting.processors import BrokerIdentity, NameServerProcessors
from rocketspark.remoting.server import Channel, RemotingServer

SECRET = "secret-of-writer"
ACL = f"""\
globalWhiteRemoteAddresses:
  - 10.9.9.*
accounts:
  - accessKey: writer01
    secretKey: {SECRET}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - orders=PUB|SUB
      - audit=PUB
      - closed=DENY
    groupPerms:
      - blocked=DENY
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
  - accessKey: trusted1
    secretKey: trusted-secret
    whiteRemoteAddress: 10.1.1.1
"""


@pytest.fixture(scope="module")
def access() -> AccessControl:
    return AccessControl(parse_plain_acl(ACL, "plain_acl.yml"))


def _request(code: int, ext: dict[str, str], body: bytes | None = None, creds=None, **kw: Any):
    ext = dict(ext)
    if creds is not None:
        Credentials(*creds).sign(ext, body)
    return RemotingCommand(code, ext_fields=ext, body=body, **kw)


WRITER = ("writer01", SECRET)


def _check(access: AccessControl, request: RemotingCommand, host: str = "127.0.0.1"):
    return access(request, SimpleNamespace(address=f"{host}:50000"))  # type: ignore[arg-type]


def _heartbeat(group: str, *topics: str) -> bytes:
    data = {
        "clientID": "c1",
        "consumerDataSet": [
            {"groupName": group, "subscriptionDataSet": [{"topic": t} for t in topics]}
        ],
        "producerDataSet": [{"groupName": "any-producer"}],
    }
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("code", "ext", "body", "expected"),
    [
        (RequestCode.SEND_MESSAGE, {"topic": "t"}, None, {"t": Perm.PUB}),
        (RequestCode.SEND_MESSAGE, {"topic": "%RETRY%g"}, None, {"%RETRY%g": Perm.SUB}),
        (RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "t"}, None, {"t": Perm.PUB}),
        (RequestCode.SEND_BATCH_MESSAGE, {"b": "t"}, None, {"t": Perm.PUB}),
        (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g"}, None, {"%RETRY%g": Perm.SUB}),
        (
            RequestCode.PULL_MESSAGE,
            {"topic": "t", "consumerGroup": "g"},
            None,
            {"t": Perm.SUB, "%RETRY%g": Perm.SUB},
        ),
        (361, {"topic": "t", "consumerGroup": "g"}, None, {"t": Perm.SUB, "%RETRY%g": Perm.SUB}),
        (RequestCode.QUERY_MESSAGE, {"topic": "t"}, None, {"t": Perm.SUB}),
        (
            RequestCode.HEART_BEAT,
            {},
            _heartbeat("g", "t1", "%RETRY%g"),
            {"%RETRY%g": Perm.SUB, "t1": Perm.SUB},
        ),
        (RequestCode.UNREGISTER_CLIENT, {"consumerGroup": "g"}, None, {"%RETRY%g": Perm.SUB}),
        (RequestCode.UNREGISTER_CLIENT, {"producerGroup": "p"}, None, {}),
        (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "g"}, None, {"%RETRY%g": 8}),
        (
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "g", "topic": "t"},
            None,
            {"%RETRY%g": Perm.SUB, "t": Perm.SUB},
        ),
        (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "t"}, None, {}),
        (RequestCode.GET_MAX_OFFSET, {"topic": "t"}, None, {}),
        (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"}, None, {}),
    ],
)
def test_resources_a_request_needs(code: int, ext: dict, body: bytes | None, expected: dict):
    assert needed(RemotingCommand(code, ext_fields=ext, body=body)) == expected


def test_signed_requests_within_the_account_s_permissions_pass(access: AccessControl) -> None:
    ok = [
        _request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "orders"}, b"x", WRITER),
        _request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "audit"}, b"x", WRITER),
        _request(RequestCode.PULL_MESSAGE, {"topic": "orders", "consumerGroup": "g"}, None, WRITER),
        _request(RequestCode.HEART_BEAT, {}, _heartbeat("g", "orders"), WRITER),
        _request(RequestCode.GET_MAX_OFFSET, {"topic": "closed", "queueId": "0"}, None, WRITER),
        _request(
            RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"}, None, ("admin001", "admin-secret")
        ),
        _request(RequestCode.SEND_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC"}, None, WRITER),
    ]
    assert [_check(access, r) for r in ok] == [None] * len(ok)


@pytest.mark.parametrize(
    ("request_", "remark"),
    [
        (_request(RequestCode.SEND_MESSAGE_V2, {"b": "orders"}), "No accessKey is configured"),
        (
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "orders"}, b"x", ("stranger", SECRET)),
            "No acl config for stranger",
        ),
        (
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "orders"}, b"x", ("writer01", "wrong!!")),
            "Check signature failed for accessKey=writer01",
        ),
        (
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "orders", "AccessKey": "writer01"}, b"x"),
            "Check signature failed for accessKey=writer01",
        ),
        (
            _request(
                RequestCode.PULL_MESSAGE, {"topic": "audit", "consumerGroup": "g"}, None, WRITER
            ),
            "No permission for topic:audit",
        ),
        (
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "closed"}, b"x", WRITER),
            "No permission for topic:closed",
        ),
        (
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "other"}, b"x", WRITER),
            "No default permission for topic:other",
        ),
        (
            _request(RequestCode.HEART_BEAT, {}, _heartbeat("blocked", "orders"), WRITER),
            "No permission for group:blocked",
        ),
        (
            _request(RequestCode.HEART_BEAT, {}, b"{not json", WRITER),
            "cannot read the heartbeat",
        ),
        (
            _request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"}, None, WRITER),
            "Need admin permission for request code=17, but accessKey=writer01 is not",
        ),
        (
            _request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"}, None, ("trusted1", "x")),
            "Check signature failed for accessKey=trusted1",
        ),
    ],
)
def test_refused_requests_get_no_permission(
    access: AccessControl, request_: RemotingCommand, remark: str
) -> None:
    response = _check(access, request_)
    assert response is not None
    assert response.code == ResponseCode.NO_PERMISSION
    assert response.remark is not None and response.remark.startswith(remark)
    assert SECRET not in repr(response)


def test_a_signature_covers_every_field_and_the_body(access: AccessControl) -> None:
    signed = _request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "orders"}, b"body", WRITER)
    assert _check(access, signed) is None
    for tampered in (
        RemotingCommand(signed.code, ext_fields={**signed.ext_fields, "b": "audit"}, body=b"body"),
        RemotingCommand(signed.code, ext_fields=signed.ext_fields, body=b"other"),
        RemotingCommand(signed.code, ext_fields={**signed.ext_fields, "x": "1"}, body=b"body"),
    ):
        response = _check(access, tampered)
        assert response is not None and response.code == ResponseCode.NO_PERMISSION


def test_old_clients_do_not_sign_the_unique_key_query_flag(access: AccessControl) -> None:
    signed = _request(RequestCode.QUERY_MESSAGE, {"topic": "orders", "key": "k"}, None, WRITER)
    with_flag = {**signed.ext_fields, "_UNIQUE_KEY_QUERY": "true"}
    old = RemotingCommand(signed.code, ext_fields=with_flag, version=399)
    new = RemotingCommand(signed.code, ext_fields=with_flag, version=400)
    assert _check(access, old) is None
    assert _check(access, new) is not None


def test_white_lists_skip_the_checks(access: AccessControl) -> None:
    unsigned = _request(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"})
    assert _check(access, unsigned, host="10.9.9.40") is None  # global white list
    assert _check(access, unsigned, host="10.9.8.40") is not None
    # The account's own white list: its access key, no signature, no permission check.
    as_trusted = _request(
        RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t", "AccessKey": "trusted1"}
    )
    assert _check(access, as_trusted, host="10.1.1.1") is None
    assert _check(access, as_trusted, host="10.1.1.2") is not None


def test_nameserver_requests_are_not_checked(access: AccessControl) -> None:
    identity = BrokerIdentity("DefaultCluster", "broker-a", "127.0.0.1:10911")
    served = set(NameServerProcessors(None, identity).table())  # type: ignore[arg-type]
    assert served <= NAMESRV_CODES and not NAMESRV_CODES & ADMIN_CODES
    for code in served:
        assert _check(access, _request(code, {"topic": "closed"})) is None


def test_a_one_way_refused_request_gets_the_response_the_server_drops(access: AccessControl):
    # The server's respond() never answers a one-way request; the check still refuses it.
    oneway = _request(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "g", "topic": "closed"},
        None,
        WRITER,
        flag=2,
    )
    response = _check(access, oneway)
    assert response is not None and response.remark == "No permission for topic:closed"


def test_the_server_answers_a_refused_request_without_dispatching_it(access: AccessControl):
    served: list[int] = []

    def processor(request: RemotingCommand, channel: Channel) -> RemotingCommand:
        served.append(request.code)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    codes = (RequestCode.SEND_MESSAGE_V2, RequestCode.UPDATE_CONSUMER_OFFSET)
    srv = RemotingServer(port=0, name="acl-test", access=access)
    srv.register(codes, processor)
    with srv, Connection(srv.address) as conn:
        refused = conn.invoke(
            _request(RequestCode.SEND_MESSAGE_V2, {"b": "closed"}, b"x", WRITER), 5
        )
        assert (refused.code, refused.remark) == (
            ResponseCode.NO_PERMISSION,
            "No permission for topic:closed",
        )
        # A refused one-way request gets no answer and is not served either.
        conn.invoke_oneway(
            _request(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "g", "topic": "closed"},
                None,
                WRITER,
                flag=2,
            )
        )
        ok = conn.invoke(_request(RequestCode.SEND_MESSAGE_V2, {"b": "orders"}, b"x", WRITER), 5)
        assert ok.code == ResponseCode.SUCCESS
        # Without a processor the code is not supported, whatever the ACL says (as RocketMQ).
        unknown = conn.invoke(_request(RequestCode.GET_MAX_OFFSET, {"topic": "t"}), 5)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert served == [RequestCode.SEND_MESSAGE_V2]
