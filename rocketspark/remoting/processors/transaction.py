"""Transactions: END_TRANSACTION (RocketMQ's ``EndTransactionProcessor``) and the
check-backs of halves left open to a connected producer of their group
(``TransactionalMessageCheckService``)."""

from __future__ import annotations

import logging
import threading
import time

from rocketspark.errors import OffsetOutOfRangeError, StoreClosedError, TransactionError
from rocketspark.message.model import (
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    TRANS_HALF_TOPIC,
    Message,
    MessageExt,
    SysFlag,
    TransactionState,
)
from rocketspark.message.properties import committed_properties
from rocketspark.message.record import (
    HEADERS,
    INT,
    MAGIC_OFFSET,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    QUEUE_ID_OFFSET,
    SHORT,
    SYS_FLAG_OFFSET,
    V1_MAX_TOPIC_LENGTH,
)
from rocketspark.remoting import headers as h
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand
from rocketspark.remoting.processors.clients import ClientRegistry
from rocketspark.remoting.processors.common import BrokerIdentity, answer, ok
from rocketspark.remoting.server import Channel
from rocketspark.store.message_store import MessageStore

log = logging.getLogger(__name__)

CHECK_SECONDS = 1.0  # how often open halves are looked at for check-backs


class TransactionProcessor:
    """END_TRANSACTION, and the thread that sends CHECK_TRANSACTION_STATE for open halves."""

    def __init__(self, store: MessageStore, broker: BrokerIdentity, clients: ClientRegistry):
        self.store = store
        self.broker = broker
        self.clients = clients
        self._stopping = threading.Event()
        self._checker: threading.Thread | None = None
        self._checked: dict[int, float] = {}  # half queue offset -> when a producer was asked
        self._next_check = 0

    def start(self) -> None:
        self._checker = threading.Thread(
            target=self._check_transactions, name="rocketspark-serve-tx-check", daemon=True
        )
        self._checker.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._checker is not None:
            self._checker.join()

    def end_transaction(self, request: RemotingCommand, channel: Channel) -> RemotingCommand:
        """END_TRANSACTION: commit or roll back the half at ``tranStateTableOffset`` (one-way
        from RocketMQ's producer, also after a check-back; 0 leaves it open)."""
        header = h.EndTransactionRequestHeader.from_ext_fields(request.ext_fields)
        kind = header.commit_or_rollback
        try:
            if kind == SysFlag.TRANSACTION_COMMIT:
                try:
                    self.store.commit_transaction(header.tran_state_table_offset)
                except TransactionError:
                    if not self._commit_rolled_back(header):
                        raise
            elif kind == SysFlag.TRANSACTION_ROLLBACK:
                try:
                    self.store.rollback_transaction(header.tran_state_table_offset)
                except TransactionError:
                    # (the broker removes the half again: its committed copy stays)
                    if self.store.transaction_status(header.tran_state_table_offset) != (
                        "committed"
                    ):
                        raise
            else:
                return ok(request)  # TRANSACTION_NOT_TYPE: the producer does not know yet
        except (TransactionError, OffsetOutOfRangeError) as e:
            log.warning(
                "END_TRANSACTION of group %s at half offset %d from %s: %s",
                header.producer_group,
                header.tran_state_table_offset,
                channel.address,
                e,
            )
            return answer(request, ResponseCode.SYSTEM_ERROR, str(e))
        self._checked.pop(header.tran_state_table_offset, None)
        return ok(request)

    def _commit_rolled_back(self, header: h.EndTransactionRequestHeader) -> bool:
        """A COMMIT of a half rolled back already stores its committed copy all the same
        (False if the half is not rolled back): RocketMQ's EndTransactionProcessor looks
        at the half only, never at how it was ended, so a commit after a check-back's
        rollback is delivered. (A second COMMIT stays idempotent here, where a broker
        stores the copy twice.)"""
        offset = header.tran_state_table_offset
        if self.store.transaction_status(offset) != "rolled_back":
            return False
        half = self.store.get_message(header.commit_log_offset)
        topic, queue_id, props = committed_properties(half.properties)
        if topic is None or half.topic != TRANS_HALF_TOPIC or half.queue_offset != offset:
            return False
        tags, keys = props.pop(PROPERTY_TAGS, None), props.pop(PROPERTY_KEYS, "")
        self.store.put(
            Message(
                topic,
                half.body,
                tags=tags,
                keys=tuple(k for k in keys.split(" ") if k),
                properties=props,
                flag=half.flag,
                queue_id=int(queue_id),
                born_timestamp=half.born_timestamp,
                reconsume_times=half.reconsume_times,
            )
        )
        return True

    def _check_transactions(self) -> None:
        """Ask a connected producer of each half's group about the halves open longer than
        transactionTimeOut, at most once per timeout each (RocketMQ's
        TransactionalMessageCheckService); their answers come back as END_TRANSACTION."""
        timeout_s = max(self.store.config.transaction_timeout / 1000.0, CHECK_SECONDS)
        while not self._stopping.wait(CHECK_SECONDS):
            try:
                self.store.check_transactions(self._ask_producer, unknown="keep")
            except StoreClosedError:
                return
            except Exception:
                log.exception("checking transactions failed; trying again")
            now = time.monotonic()
            for offset, asked in list(self._checked.items()):
                if now - asked > timeout_s:
                    self._checked.pop(offset, None)

    def _ask_producer(self, half: MessageExt) -> TransactionState:
        """Send CHECK_TRANSACTION_STATE for ``half`` to a producer of its group (one-way);
        the half stays open until the producer's END_TRANSACTION."""
        if half.queue_offset in self._checked:
            return TransactionState.UNKNOWN
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        channels = self.clients.producer_channels(group)
        if not channels:
            return TransactionState.UNKNOWN
        channel = channels[self._next_check % len(channels)]
        self._next_check += 1
        header = h.CheckTransactionStateRequestHeader(
            topic=half.properties.get(PROPERTY_REAL_TOPIC),
            tran_state_table_offset=half.queue_offset,
            commit_log_offset=half.commitlog_offset,
            msg_id=half.uniq_key,
            transaction_id=half.properties.get(PROPERTY_TRANSACTION_ID, half.uniq_key),
            offset_msg_id=half.msg_id,
            broker_name=self.broker.name,
        )
        record = self.store.record_view(half.commitlog_offset, half.store_size)
        body = check_message(record, half)
        check = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, header.to_ext_fields(), body=body
        )
        if channel.invoke_oneway(check):
            self._checked[half.queue_offset] = time.monotonic()
        return TransactionState.UNKNOWN


def check_message(record: memoryview | bytes, half: MessageExt) -> bytes:
    """The record a check-back carries: ``half``'s as stored, with its real topic and queue
    (REAL_TOPIC, REAL_QID) in place of the half topic's, as
    AbstractTransactionalMessageCheckListener.sendCheckMessage sets them before it encodes
    the message again; every other field, the properties included, stays as stored. The
    producer's check listener sees the topic and queue it sent to."""
    topic = half.properties.get(PROPERTY_REAL_TOPIC)
    real_qid = half.properties.get(PROPERTY_REAL_QUEUE_ID)
    if not topic or real_qid is None or not real_qid.lstrip("-").isdigit():
        return bytes(record)
    buf = memoryview(record)
    (magic,) = INT.unpack_from(buf, MAGIC_OFFSET)
    (sys_flag,) = INT.unpack_from(buf, SYS_FLAG_OFFSET)
    header = HEADERS[(bool(sys_flag & SysFlag.BORNHOST_V6), bool(sys_flag & SysFlag.STOREHOST_V6))]
    (body_len,) = INT.unpack_from(buf, header.size - INT.size)  # BODYLENGTH ends the header
    at = header.size + body_len  # the half topic's length, then its name
    if magic == MESSAGE_MAGIC_CODE_V2:
        (old_len,) = SHORT.unpack_from(buf, at)
        end = at + SHORT.size + old_len
    else:
        end = at + 1 + buf[at]
    name = topic.encode("utf-8")
    v2 = len(name) > V1_MAX_TOPIC_LENGTH
    topic_part = (SHORT.pack(len(name)) if v2 else bytes((len(name),))) + name
    head = bytearray(buf[:at])
    INT.pack_into(head, 0, at + len(topic_part) + len(buf) - end)  # TOTALSIZE
    INT.pack_into(head, MAGIC_OFFSET, MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE)
    INT.pack_into(head, QUEUE_ID_OFFSET, int(real_qid))
    return b"".join((head, topic_part, buf[end:]))
