"""The numbers of RocketMQ's remoting protocol: request and response codes, languages, flags.

Values are Apache RocketMQ's (``RequestCode``, ``ResponseCode``, ``LanguageCode``,
``SerializeType`` and ``MQVersion`` of rocketmq-remoting / rocketmq-common 5.3).
Only the codes a client of a cluster (and, later, the embedded store's server)
uses are listed; a command with any other code still travels: the codec keeps
codes as plain ints, and :func:`request_name` / :func:`response_name` name the
known ones in messages.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

__all__ = [
    "MQ_VERSION",
    "MQVersion",
    "LanguageCode",
    "SerializeType",
    "RpcFlag",
    "PullSysFlag",
    "RequestCode",
    "ResponseCode",
    "request_name",
    "response_name",
]


class MQVersion(IntEnum):
    """``MQVersion.Version`` ordinals: what a command's ``version`` field carries."""

    V4_9_4 = 401
    V5_3_1 = 475
    V5_3_3 = 479


# The version this client claims in every command it sends (the NameServer and
# brokers it is tested against speak 5.3.x).
MQ_VERSION = MQVersion.V5_3_3


class LanguageCode(IntEnum):
    """The ``language`` of a command: a byte in ROCKETMQ headers, the name in JSON ones."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    """How a frame's header is written: the top byte of the frame's second i32."""

    JSON = 0
    ROCKETMQ = 1


class RpcFlag(IntFlag):
    """Bits of a command's ``flag``: RocketMQ's ``1 << RPC_TYPE`` and ``1 << RPC_ONEWAY``."""

    RESPONSE = 1
    ONEWAY = 2


class PullSysFlag(IntFlag):
    """Bits of PULL_MESSAGE's ``sysFlag`` (``PullSysFlag``)."""

    COMMIT_OFFSET = 1
    SUSPEND = 2  # long polling: the broker holds the request until messages arrive
    SUBSCRIPTION = 4
    CLASS_FILTER = 8
    LITE_PULL = 16


class RequestCode(IntEnum):
    """What a request asks for (``RequestCode``)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_NAME_LIST = 23
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    GET_KV_CONFIG = 101
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_TOPICS_BY_CLUSTER = 224
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    GET_TOPIC_CONFIG = 351
    LITE_PULL_MESSAGE = 361


class ResponseCode(IntEnum):
    """How a response answers (``ResponseCode``, with ``RemotingSysResponseCode``'s 0-4)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20  # nothing in the pulled range matched the filter
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic: RocketMQ's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    # 209-211 mean ACL failures to an ACL request and POLLING_FULL, POLLING_TIMEOUT,
    # BROKER_NOT_EXIST to a POP request: named here by the second meaning.
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    BROKER_DISPATCH_NOT_COMPLETE = 212
    BROADCAST_CONSUMPTION = 213
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500


def request_name(code: int) -> str:
    """Return RocketMQ's name of request ``code`` (``"PULL_MESSAGE"``), or the number."""
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


def response_name(code: int) -> str:
    """Return RocketMQ's name of response ``code`` (``"TOPIC_NOT_EXIST"``), or the number."""
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)
