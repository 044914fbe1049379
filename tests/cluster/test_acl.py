"""RocketMQ ACL: requests are signed with the account's keys; wrong keys are refused.

A NameServer and one master with ``aclEnable=true`` of their own (an ACL broker on the
run's shared NameServer would take the other tests' topics and refuse their unsigned
requests), and one account in ``conf/plain_acl.yml`` under the broker's RocketMQ home.
Shown: with the right keys the data source writes and reads, and the group's offsets
commit; with a wrong secret a read and a write fail with the broker's refusal, nothing
is written, and the secret appears in no error or repr.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rocketspark.client import ClientRef, close_all
from rocketspark.errors import RemotingCommandError
from tests.helpers.rocketmq import RocketMQ

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

ACCESS_KEY = "rocketspark-test"
SECRET_KEY = "s3cret-Value-42"
WRONG_SECRET = "not-the-s3cret-99"

PLAIN_ACL = f"""globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {ACCESS_KEY}
    secretKey: {SECRET_KEY}
    whiteRemoteAddress:
    admin: true
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""


@pytest.fixture(scope="module")
def acl_cluster(rocketmq_java, tmp_path_factory):
    run = tmp_path_factory.mktemp("acl")
    rocketmq = RocketMQ(run, rocketmq_java)
    try:
        broker = rocketmq.add_broker("broker-acl", run / "store", cluster="AclCluster")
        broker.conf["aclEnable"] = "true"
        # the broker reads its accounts from <rocketmq.home.dir>/conf; its first start's
        # home is run-1/home under its run directory
        conf = Path(broker.run_root) / "run-1" / "home" / "conf"
        conf.mkdir(parents=True)
        (conf / "plain_acl.yml").write_text(PLAIN_ACL)
        broker.start()
        broker.wait_boot()
        ref = ClientRef.cluster(rocketmq.addr, access_key=ACCESS_KEY, secret_key=SECRET_KEY)
        client = ref.connect()
        deadline = time.monotonic() + 120
        while "broker-acl" not in client.remoting.brokers():  # registered on its first beat
            assert time.monotonic() < deadline, "the ACL broker never registered"
            time.sleep(0.5)
        client.remoting.create_topic("acl-orders", {"broker-acl": 2})
        yield rocketmq
    finally:
        close_all()
        rocketmq.close()


def test_the_right_keys_read_and_write_and_wrong_ones_are_refused(spark, acl_cluster, tmp_path):
    ns = acl_cluster.addr
    right = {"nameServer": ns, "accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}
    wrong = {**right, "secretKey": WRONG_SECRET}
    df = spark.createDataFrame([(f"m{i}",) for i in range(50)], "body string")
    df.write.mode("append").format("rocketmq").options(**right).option(
        "topic", "acl-orders"
    ).option("deliveryGuarantee", "at_least_once").save()
    rows = spark.read.format("rocketmq").options(**right).option("topic", "acl-orders").load()
    assert sorted(r.body.decode() for r in rows.collect()) == sorted(f"m{i}" for i in range(50))

    client = ClientRef.cluster(ns, access_key=ACCESS_KEY, secret_key=SECRET_KEY).connect()
    before = {mq: client.max_offset(mq) for mq in client.queues("acl-orders")}
    for attempt in (
        lambda: (
            df.write.mode("append")
            .format("rocketmq")
            .options(**wrong)
            .option("topic", "acl-orders")
            .option("deliveryGuarantee", "at_least_once")
            .save()
        ),
        lambda: (
            spark.read.format("rocketmq")
            .options(**wrong)
            .option("topic", "acl-orders")
            .load()
            .collect()
        ),
    ):
        with pytest.raises(Exception) as info:
            attempt()
        text = str(info.value)
        assert "signature" in text.lower() or "permission" in text.lower(), text[-2000:]
        assert WRONG_SECRET not in text and SECRET_KEY not in text
    assert {mq: client.max_offset(mq) for mq in client.queues("acl-orders")} == before

    bad = ClientRef.cluster(ns, access_key=ACCESS_KEY, secret_key=WRONG_SECRET)
    assert WRONG_SECRET not in repr(bad) and WRONG_SECRET not in repr(bad.connect())
    with pytest.raises(RemotingCommandError) as refused:
        bad.connect().put_columns([b"x"], topic="acl-orders")
    assert WRONG_SECRET not in str(refused.value)
    close_all()
