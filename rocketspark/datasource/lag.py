"""How far behind a streaming query's ``rocketmq`` sources are, read from its progress.

Spark 4.2 lets no Python data source report custom metrics (a progress's ``"metrics"``
stays ``{}``, where Kafka's source shows offsets behind latest). What Spark does record
for each source is its ``endOffset`` (where the batch ended) and its ``latestOffset``
(what our reader's ``reportLatestOffset`` gave when the batch was planned: every queue's
max offset). Their difference, queue by queue, is the lag: messages the broker or store
held that the query had not read yet. A query that keeps up shows 0; a lag that grows
batch after batch means the query cannot keep up (more executors, or a higher
``maxOffsetsPerTrigger``).

Two ways to see it::

    from rocketspark import lag, LagListener

    print(lag(query))                           # of the last batch; None before the first
    spark.streams.addListener(LagListener())    # logs every batch's lag (logger rocketspark.lag)

The lag is as of when each batch was planned, as Kafka's metric is; the CLI's
``rocketspark group offsets GROUP`` gives a group's lag now, from its committed offsets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from rocketspark.datasource.offsets import from_json
from rocketspark.errors import ConfigError
from rocketspark.message.model import MessageQueue

__all__ = ["LagListener", "SourceLag", "lag"]

log = logging.getLogger("rocketspark.lag")


@dataclass(frozen=True)
class SourceLag:
    """The lag of a query's ``rocketmq`` sources at one batch: messages per queue not read."""

    batch_id: int
    queues: Mapping[MessageQueue, int]

    @property
    def total(self) -> int:
        """Messages not read, over every queue."""
        return sum(self.queues.values())

    def __str__(self) -> str:
        if not self.queues:
            return f"batch {self.batch_id}: no queues"
        worst = max(self.queues, key=lambda mq: (self.queues[mq], mq))
        return (
            f"batch {self.batch_id}: lag {self.total:,} messages over {len(self.queues)} "
            f"queues (most: {self.queues[worst]:,} on {worst.topic}/{worst.broker}/"
            f"{worst.queue_id})"
        )


def lag(progress: Any) -> SourceLag | None:
    """The lag of the ``rocketmq`` sources of a streaming query's last batch.

    ``progress``: a ``StreamingQuery`` (its ``lastProgress``), a ``StreamingQueryProgress``
    (as a listener's ``event.progress``), or a progress as a dict or JSON text. Returns
    None when there is no progress yet or no source of the query reports a latest offset
    (not a ``rocketmq`` source, or Spark before 4.2). Sources of other formats are skipped.
    """
    data = _progress_dict(progress)
    if data is None:
        return None
    total: dict[MessageQueue, int] = {}
    found = False
    for source in data.get("sources") or ():
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        found = True
        for mq, last in latest.items():
            # A queue new since the batch was planned is not in its endOffset: the
            # source reads new queues from their earliest offset, 0 for a new queue.
            behind = max(0, last - end.get(mq, 0))
            total[mq] = total.get(mq, 0) + behind
    if not found:
        return None
    return SourceLag(int(data.get("batchId", -1)), total)


class LagListener(StreamingQueryListener):
    """A listener that reports the lag of every batch of every query with a ``rocketmq``
    source: ``spark.streams.addListener(LagListener())``.

    By default each lag is logged at INFO on the ``rocketspark.lag`` logger, naming the
    query; ``on_lag(query, lag)`` receives it instead (``query``: its name, or its id).
    """

    def __init__(self, on_lag: Callable[[str, SourceLag], None] | None = None):
        self._on_lag = on_lag

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        found = lag(progress)
        if found is None:
            return
        query = progress.name or str(progress.id)
        if self._on_lag is not None:
            self._on_lag(query, found)
        else:
            log.info("query %s, %s", query, found)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def _progress_dict(progress: Any) -> dict[str, Any] | None:
    if progress is None:
        return None
    if hasattr(progress, "lastProgress"):  # a StreamingQuery
        return _progress_dict(progress.lastProgress)
    if isinstance(progress, Mapping):
        return dict(progress)
    if isinstance(progress, (str, bytes)):
        return _loads(progress, "progress")
    text = getattr(progress, "json", None)  # a StreamingQueryProgress
    if isinstance(text, str):
        return _loads(text, "progress")
    raise ConfigError(
        f"lag() takes a StreamingQuery, a StreamingQueryProgress, or a progress as a dict "
        f"or JSON, not {type(progress).__name__}"
    )


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"lag(): the {what} is not JSON: {e}") from e


def _offsets(value: Any) -> dict[MessageQueue, int] | None:
    """A source's offsets if they are ours (``{topic: {broker: {queue: offset}}}``)."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping) or not value:
        return None
    for brokers in value.values():
        if not isinstance(brokers, Mapping):
            return None
        for queues in brokers.values():
            if not isinstance(queues, Mapping):
                return None  # e.g. Kafka's {topic: {partition: offset}}
            for qid, off in queues.items():
                if not (isinstance(off, int) and str(qid).isdigit()):
                    return None
    return from_json(value)
