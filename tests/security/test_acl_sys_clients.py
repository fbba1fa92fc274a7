"""`pattern read $SYS/broker/clients/%c/#`: a client's figures go under its id escaped as one
topic level ('%', '/', '+', '#' as %25, %2F, %2B, %23: docs/metrics.md), so there %c and %u
stand for the escaped id and user name. Client 'a%2Fb' read the figures of client 'a/b' (whose
level is 'a%2Fb'), and could not read its own ('a%252Fb')."""

import pytest
from secfiles import write_acl

from edgebroker.core.stats import sys_topic_level
from edgebroker.security.acl import Acl

ACL = "pattern read $SYS/broker/clients/%c/#\npattern read $SYS/broker/clients/%u/x\n" \
      "pattern readwrite devices/%c/#\n"
IDS = ["plain", "a/b", "a%2Fb", "50%", "x+y", "h#", "a%252Fb"]


@pytest.mark.parametrize("client_id", IDS)
def test_each_client_reads_its_own_figures_only(client_id):
    view = Acl.parse(ACL).view(client_id, client_id)
    for other in IDS:
        level = sys_topic_level(other)
        mine = other == client_id
        assert view.can_read(f"$SYS/broker/clients/{level}/bytes/received") is mine, other
        assert view.can_subscribe(f"$SYS/broker/clients/{level}/#") is mine, other
        assert view.can_read(f"$SYS/broker/clients/{level}/x") is mine, (other, "%u")
    assert not view.can_write(f"$SYS/broker/clients/{sys_topic_level(client_id)}/x")


def test_elsewhere_patterns_take_the_raw_id_as_before():
    acl = Acl.parse(ACL)
    assert acl.view("a%2Fb", None).can_write("devices/a%2Fb/t")
    assert not acl.view("a%2Fb", None).can_write("devices/a%252Fb/t")
    assert not acl.view("a/b", None).can_write("devices/a%2Fb/t")
    assert not acl.view("$SYS", None).can_read("$SYS/broker/clients/$SYS/x")   # ($: never)


def test_a_broker_gives_a_client_its_own_figures_and_not_anothers(broker, tmp_path):
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(sys_interval=1, sys_client_metrics=True, acl_file=str(acl))
    victim = b.client("a/b")
    evil = b.client("a%2Fb")
    assert evil.subscribe("$SYS/broker/clients/a%2Fb/#").codes == [128]    # a/b's figures
    assert evil.subscribe("$SYS/broker/clients/a%252Fb/#").codes == [0]    # its own
    assert victim.subscribe("$SYS/broker/clients/a%2Fb/#").codes == [0]
    assert evil.recv_publish(timeout=5).topic.startswith("$SYS/broker/clients/a%252Fb/")
    assert victim.recv_publish(timeout=5).topic.startswith("$SYS/broker/clients/a%2Fb/")
