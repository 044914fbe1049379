"""The requests of a NameServer and a broker, served over one embedded MessageStore.

The only package of ``remoting`` that imports ``store``: each processor reads a
request's header, asks the store, and answers as Apache RocketMQ's processors do.
Its modules follow RocketMQ's broker:

- ``namesrv``: routes, cluster info, topic list (the NameServer's
  ``DefaultRequestProcessor`` / ``ClientRequestProcessor``);
- ``send``: sends and send-backs (``SendMessageProcessor``);
- ``pull`` and ``pull_hold``: pulls (``PullMessageProcessor``) and long polling
  (``PullRequestHoldService``);
- ``transaction``: END_TRANSACTION and check-backs (``EndTransactionProcessor``,
  ``TransactionalMessageCheckService``);
- ``clients``, ``consumer_offsets``, ``queue_locks``: heartbeats and the client
  registry (``ClientManageProcessor``), consumer offsets
  (``ConsumerManageProcessor``), orderly consumers' queue locks
  (``RebalanceLockManager``);
- ``admin``: queue offsets, topic and group creation, statistics, queries
  (``AdminBrokerProcessor``, ``QueryMessageProcessor``);
- ``broker``: every broker request on its work queue (``BrokerController``);
- ``served``: :func:`serve` and :class:`Served`.

The store is one broker: ``brokerName`` and ``brokerClusterName`` of its
config name it in routes, its master (id 0) address is the broker port the
server listens on. :func:`serve` starts a NameServer port and a broker port
(one port may serve both: the request codes do not overlap).

Pulls answer with the CommitLog records of the range as views of the mapped
segments (``MessageStore.read_raw``), sent with scatter-gather, never copied.
A pull that finds nothing and may be suspended is parked in
:class:`PullHoldService` until a put reaches its queue (a put of this process
notifies the store's arrivals condition; one of another process writing the
same directory bumps the store's shared write sequence, checked every
millisecond while pulls are held) or its suspend timeout passes, then is run again and
answered.
"""

from rocketspark.remoting.processors.broker import BrokerProcessors
from rocketspark.remoting.processors.common import BrokerIdentity
from rocketspark.remoting.processors.namesrv import NameServerProcessors
from rocketspark.remoting.processors.pull_hold import PullHoldService
from rocketspark.remoting.processors.served import Served, serve

__all__ = [
    "BrokerIdentity",
    "BrokerProcessors",
    "NameServerProcessors",
    "PullHoldService",
    "Served",
    "serve",
]
