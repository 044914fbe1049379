"""Send-back: messages a consumer group failed to consume, stored again to be retried.

RocketMQ's broker does this in ``SendMessageProcessor.consumerSendMsgBack``: a
message goes to the group's retry topic ``%RETRY%group`` after the delay of level
3 + reconsumeTimes (held in SCHEDULE_TOPIC_XXXX until due, its destination in
REAL_TOPIC / REAL_QID), or, once it was reconsumed maxReconsumeTimes times or the
consumer asked for a negative level, to the dead-letter topic ``%DLQ%group``.
RETRY_TOPIC keeps the topic it was first sent to, ORIGIN_MESSAGE_ID its first
msgId; its reconsume count grows by one. A batch is one append: after a crash,
all of it is there or none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rocketspark.errors import ConfigError, InvalidMessageError
from rocketspark.message.model import (
    COMPRESSION_TYPE_MASK,
    INT32_MAX,
    INT32_MIN,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    SCHEDULE_TOPIC,
    MessageExt,
    SysFlag,
    check_int,
    dlq_topic,
    retry_topic,
    user_properties,
)
from rocketspark.message.names import validate_group

if TYPE_CHECKING:
    from rocketspark.message.results import PutResult
    from rocketspark.store.appender import Appender
    from rocketspark.store.commit_log import PreparedRecord
    from rocketspark.store.encoder import Encoder
    from rocketspark.store.metadata import SubscriptionGroupTable

DLQ_NUMS_PER_GROUP = 1
RETRY_NUMS_PER_GROUP = 1


class SendBack:
    """Stores failed messages in their group's retry or dead-letter topic.

    ``delay_ms`` holds the store's delay levels in milliseconds (messageDelayLevel).
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        appender: Appender,
        groups: SubscriptionGroupTable,
        delay_ms: Sequence[int],
        clock: Callable[[], int],
    ):
        self.encoder = encoder
        self.appender = appender
        self.groups = groups
        self.delay_ms = delay_ms
        self.clock = clock

    def send(
        self,
        group: str,
        messages: Sequence[MessageExt],
        delay_levels: Sequence[int] | None = None,
        *,
        max_reconsume_times: int | None = None,
        properties: Sequence[Mapping[str, str]] | None = None,
    ) -> list[PutResult]:
        """Send ``messages`` back for ``group`` in one append (see MessageStore.send_back)."""
        validate_group(group)
        self.groups.get_or_create(group)
        max_times = (
            self.groups.retry_max_times(group)
            if max_reconsume_times is None
            else check_int("max_reconsume_times", max_reconsume_times, INT32_MIN, INT32_MAX)
        )
        messages = list(messages)
        for i, m in enumerate(messages):
            if not isinstance(m, MessageExt):
                raise InvalidMessageError(
                    f"message {i}: expected a MessageExt the store "
                    f"handed out, got {type(m).__name__}"
                )
        for name, col in (("delay_levels", delay_levels), ("properties", properties)):
            if col is not None and len(col) != len(messages):
                raise ConfigError(f"{name} has {len(col)} entries, messages has {len(messages)}")
        # Checked as a Message's are, before anything is written; the delay comes from
        # delay_levels (the store sets DELAY), the rest may replace the message's own.
        added = [
            {}
            if p is None
            else user_properties(p, f"message {i}: ", frozenset({PROPERTY_DELAY_TIME_LEVEL}))
            for i, p in enumerate(() if properties is None else properties)
        ]
        for i, level in enumerate(() if delay_levels is None else delay_levels):
            # negative: straight to the dead-letter topic; 0: 3 + reconsumeTimes, capped
            # at the last level as RocketMQ's broker does; a given level must exist
            check_int("delay_level", level, -INT32_MAX, INT32_MAX, f"message {i}: ")
            if level > 0:
                self.encoder.check_delay_level(level, f"message {i}: ")
        now = self.clock()
        recs = [
            self._record(
                group,
                message,
                delay_levels[i] if delay_levels is not None else 0,
                added[i] if added else None,
                max_times,
                now,
            )
            for i, message in enumerate(messages)
        ]
        if not recs:
            return []
        return self.appender.append_records(recs, now)

    def _record(
        self,
        group: str,
        message: MessageExt,
        delay_level: int,
        added: Mapping[str, str] | None,
        max_times: int,
        now: int,
    ) -> PreparedRecord:
        """The record that sends ``message`` to the group's retry or dead-letter topic."""
        encoder = self.encoder
        props = dict(message.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        props.pop(PROPERTY_REAL_TOPIC, None)
        props.pop(PROPERTY_REAL_QUEUE_ID, None)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        if added is not None:
            props.update(added)
        delay_ms = 0
        if message.reconsume_times >= max_times or delay_level < 0:
            topic = dlq_topic(group)
            encoder.ensure_system_topic(topic, DLQ_NUMS_PER_GROUP)
            queue_id = 0
        else:
            topic = retry_topic(group)
            encoder.ensure_system_topic(topic, RETRY_NUMS_PER_GROUP)
            queue_id = 0
            level = delay_level or 3 + message.reconsume_times
            level = min(level, len(self.delay_ms))
            props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
            props[PROPERTY_REAL_TOPIC] = topic
            props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
            delay_ms = self.delay_ms[level - 1]
            topic, queue_id = SCHEDULE_TOPIC, level - 1
            encoder.ensure_system_topic(SCHEDULE_TOPIC, len(self.delay_ms))
        if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
            props[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
        return encoder.record(
            topic,
            queue_id,
            message.body,
            props,
            now,
            # the body as handed out, decompressed: no COMPRESSED flag, no compression type
            sys_flag=message.sys_flag & ~SysFlag.COMPRESSED & ~COMPRESSION_TYPE_MASK,
            flag=message.flag,
            born_timestamp=message.born_timestamp,
            born_host=message.born_host,
            reconsume_times=message.reconsume_times + 1,
            delay_ms=delay_ms,
        )
