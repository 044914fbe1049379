"""The broker's ACL check: who sent a request, and may they do what it asks.

Apache RocketMQ 5.3's ACL 1.0 (``PlainAccessValidator``) over the accounts of a
``plain_acl.yml`` (:mod:`rocketspark.remoting.plain_acl`), run before a request
reaches its processor (``RemotingServer(access=...)``), so that a refused
request touches nothing. In RocketMQ's order (``PlainPermissionManager.validate``):

1. a client host in ``globalWhiteRemoteAddresses`` passes;
2. no ``AccessKey`` in the extFields: refused (``No accessKey is configured``);
   an unknown one: refused (``No acl config for KEY``);
3. a client host in the account's ``whiteRemoteAddress`` passes, unsigned;
4. the ``Signature`` must be Base64(HmacSHA1(secret, the extField values but
   Signature's, sorted by key, + the body)), compared in constant time
   (``Check signature failed for accessKey=KEY``);
5. the resources the request names need their permission
   (``PlainAccessResource.parse``, see :func:`needed`): an admin account has
   every one; the admin requests (creating or deleting topics and groups,
   broker and ACL configuration) need an admin account; a topic not in the
   account's ``topicPerms`` gets ``defaultTopicPerm``, a group not in
   ``groupPerms`` ``defaultGroupPerm``.

A refused request is answered NO_PERMISSION (16) with RocketMQ's explanation as
the remark (``No permission for topic:T``...); a one-way one gets no answer.
RocketMQ 5.3.1's ACL 1.0 hook answers such a request SYSTEM_ERROR with the
exception in the remark, its ACL 2.0 pipeline NO_PERMISSION: clients handle
both as a refusal; this answers NO_PERMISSION. The remark and the log name the
access key, never the secret.

The NameServer's requests (routes, cluster info, topic lists, KV config) are not
checked: RocketMQ 5.3.1's NameServer has no ACL, and the Java client signs what
it sends there but nothing checks it. :data:`NAMESRV_CODES` lists them, so a
server whose one port serves both lets them through unsigned as well.

Beyond RocketMQ 5.3.1's ``parse``: LITE_PULL_MESSAGE needs what PULL_MESSAGE
needs (SUB on the topic and the group), where 5.3.1 checks only its signature.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable, Mapping

from rocketspark.message.fastjson import loads_lenient
from rocketspark.remoting.acl import ACCESS_KEY, SIGNATURE, signature
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.plain_acl import (
    ACL_FILE,
    RETRY_GROUP_TOPIC_PREFIX,
    Account,
    Perm,
    PlainAcl,
    check_permission,
    load_plain_acl,
)
from rocketspark.remoting.server import Channel

__all__ = ["ADMIN_CODES", "NAMESRV_CODES", "AccessControl", "acl_path", "needed", "refusal"]

log = logging.getLogger(__name__)

# Permission.ADMIN_CODE: requests only an admin account may make.
UPDATE_BROKER_CONFIG = 25
UPDATE_AND_CREATE_ACL_CONFIG = 50
DELETE_ACL_CONFIG = 51
GET_BROKER_CLUSTER_ACL_INFO = 52
LITE_PULL_MESSAGE = 361
UPDATE_AND_CREATE_STATIC_TOPIC = 513
ADMIN_CODES = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        UPDATE_AND_CREATE_STATIC_TOPIC,
        UPDATE_AND_CREATE_ACL_CONFIG,
        DELETE_ACL_CONFIG,
        GET_BROKER_CLUSTER_ACL_INFO,
    }
)
# The NameServer's requests (DefaultRequestProcessor / ClientRequestProcessor), never checked.
NAMESRV_CODES = frozenset(
    {
        100,  # PUT_KV_CONFIG
        RequestCode.GET_KV_CONFIG,
        102,  # DELETE_KV_CONFIG
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.GET_TOPICS_BY_CLUSTER,
    }
)
# Trace messages are sent to this topic with PUB needed and no permission checked.
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
# Clients up to 4.9.3 (MQVersion ordinal 399) do not sign this field: it is left out.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
V4_9_3 = 399


def acl_path(store_root: str) -> str:
    """Where a store's ACL file is: ``config/plain_acl.yml`` under the store directory."""
    return os.path.join(store_root, "config", ACL_FILE)


def _retry(group: str | None) -> str | None:
    return None if group is None else RETRY_GROUP_TOPIC_PREFIX + group


def _send_perm(topic: str | None) -> Perm:
    return (
        Perm.SUB if topic is not None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else Perm.PUB
    )


def needed(request: RemotingCommand) -> dict[str, Perm]:
    """The resources ``request`` names and the permission each needs
    (``PlainAccessResource.parse``): a topic by name, a group as its retry topic
    ``%RETRY%group``. ValueError when a heartbeat's body cannot be read."""
    ext = request.ext_fields
    code = request.code
    pairs: list[tuple[str | None, Perm]]
    if code == RequestCode.SEND_MESSAGE:
        pairs = [(ext.get("topic"), _send_perm(ext.get("topic")))]
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        pairs = [(ext.get("b"), _send_perm(ext.get("b")))]
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        pairs = [(_retry(ext.get("group")), Perm.SUB)]
    elif code in (RequestCode.PULL_MESSAGE, LITE_PULL_MESSAGE):
        pairs = [(ext.get("topic"), Perm.SUB), (_retry(ext.get("consumerGroup")), Perm.SUB)]
    elif code == RequestCode.QUERY_MESSAGE:
        pairs = [(ext.get("topic"), Perm.SUB)]
    elif code == RequestCode.HEART_BEAT:
        pairs = list(_heartbeat(request))
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        pairs = [(_retry(ext.get("consumerGroup")), Perm.SUB)]
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        pairs = [(_retry(ext.get("consumerGroup")), Perm.SUB), (ext.get("topic"), Perm.SUB)]
    else:
        return {}
    # A later pair for the same resource replaces an earlier one, as RocketMQ's map does.
    return {resource: perm for resource, perm in pairs if resource is not None}


def _heartbeat(request: RemotingCommand) -> Iterable[tuple[str | None, Perm]]:
    try:
        data = loads_lenient(bytes(request.body or b"{}").decode("utf-8"))
        for consumer in data.get("consumerDataSet") or ():
            yield _retry(str(consumer["groupName"])), Perm.SUB
            for subscription in consumer.get("subscriptionDataSet") or ():
                yield str(subscription["topic"]), Perm.SUB
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"cannot read the heartbeat: {type(e).__name__}") from None


def _describe(resource: str) -> str:
    """``PlainAccessResource.printStr``: ``group:G`` for a retry topic, else ``topic:T``."""
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return f"group:{resource[len(RETRY_GROUP_TOPIC_PREFIX) :]}"
    return f"topic:{resource}"


def refusal(account: Account, code: int, resources: Mapping[str, Perm]) -> str | None:
    """Why ``account`` may not make request ``code`` on ``resources`` (None: it may);
    ``PlainPermissionChecker.check``."""
    if account.admin:
        return None
    if code in ADMIN_CODES:
        return (
            f"Need admin permission for request code={code}, but accessKey="
            f"{account.access_key} is not"
        )
    perms = account.perms
    for resource, perm in resources.items():
        group = resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
        owned = perms.get(resource)
        if owned is None:
            default = account.default_group_perm if group else account.default_topic_perm
            if not check_permission(perm, default):
                return f"No default permission for {_describe(resource)}"
        elif not check_permission(perm, owned):
            return f"No permission for {_describe(resource)}"
    return None


class AccessControl:
    """The check a :class:`~rocketspark.remoting.server.RemotingServer` runs before
    dispatching a request: ``access(request, channel)`` is None (go on) or the
    NO_PERMISSION response. Thread-safe (read-only after construction)."""

    def __init__(self, acl: PlainAcl, *, exempt: Iterable[int] = NAMESRV_CODES):
        self.acl = acl
        self.exempt = frozenset(exempt)
        self._accounts = dict(acl.accounts)
        self._white = acl.global_white

    @classmethod
    def for_store(cls, store_root: str) -> AccessControl | None:
        """The check of a store's ``config/plain_acl.yml``; None when there is no such
        file (no ACL). AclFileError when the file is wrong."""
        path = acl_path(store_root)
        if not os.path.exists(path):
            return None
        return cls(load_plain_acl(path))

    def __repr__(self) -> str:
        return f"AccessControl({self.acl.path!r}, {len(self._accounts)} accounts)"

    def __call__(self, request: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        if request.code in self.exempt:
            return None
        try:
            reason = self.refusal(request, _host(channel.address))
        except Exception as e:  # a request this cannot read is refused, never served
            reason = f"cannot check the request: {type(e).__name__}"
        if reason is None:
            return None
        log.info(
            "refused %s from %s: %s", request.code_name, channel.address, reason.replace("\n", " ")
        )
        return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION, reason)

    def refusal(self, request: RemotingCommand, host: str) -> str | None:
        """Why ``request`` from ``host`` is refused, or None when it may be served."""
        for pattern in self._white:
            if pattern.match(host):
                return None
        ext = request.ext_fields
        access_key = ext.get(ACCESS_KEY)
        if access_key is None:
            return "No accessKey is configured"
        account = self._accounts.get(access_key)
        if account is None:
            return f"No acl config for {access_key}"
        if account.white_remote_address.match(host):
            return None
        given = ext.get(SIGNATURE)
        if given is None or not _signed_by(request, account.secret_key, given):
            return f"Check signature failed for accessKey={access_key}"
        try:
            resources = needed(request)
        except ValueError as e:
            return str(e)
        if resources.get(RMQ_SYS_TRACE_TOPIC) == Perm.PUB:
            return None
        return refusal(account, request.code, resources)


def _signed_by(request: RemotingCommand, secret: str, given: str) -> bool:
    fields = request.ext_fields
    if request.version <= V4_9_3 and UNIQUE_MSG_QUERY_FLAG in fields:
        fields = {k: v for k, v in fields.items() if k != UNIQUE_MSG_QUERY_FLAG}
    expected = signature(fields, request.body, secret)
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "surrogatepass"))


def _host(address: str) -> str:
    """The host of a peer's ``host:port`` (IPv6 hosts may be bracketed)."""
    host = address.rpartition(":")[0] if ":" in address else address
    return host.strip("[]")
