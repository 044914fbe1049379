"""GET_CONSUMER_RUNNING_INFO for a group this client never registered (the answer for a
registered one is checked against mqadmin's consumerStatus in tests/cluster)."""

from __future__ import annotations

from rocketspark.remoting import headers as h
from rocketspark.remoting.client import RemotingClient
from rocketspark.remoting.codes import RequestCode, ResponseCode
from rocketspark.remoting.command import RemotingCommand


def test_running_info_of_an_unknown_group_is_refused_as_java_does():
    rc = RemotingClient("127.0.0.1:9")  # never contacted
    header = h.GetConsumerRunningInfoRequestHeader(consumer_group="nobody", client_id="x")
    request = RemotingCommand.request(
        RequestCode.GET_CONSUMER_RUNNING_INFO, header.to_ext_fields()
    ).with_opaque(7)
    answer = rc.heartbeats.running_info(request, None)  # type: ignore[arg-type]
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert answer.opaque == 7 and answer.is_response
    assert answer.remark == "The Consumer Group <nobody> not exist in this consumer"
    rc.close()
