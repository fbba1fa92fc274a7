"""Shared subscriptions whose members may read different topics (ACLs): a message only a busy
or offline member may read waits for it without holding back what the others may read, each
topic in order, also when the backlog is read from the log (docs/protocol.md, "Shared
subscriptions")."""

from __future__ import annotations

import pytest

from core.test_shared import collect, member, payloads, publishes
from secfiles import write_acl

pytestmark = pytest.mark.timeout(90)


def _group(broker, tmp_path, uid, **limits):
    """A broker whose ACL keeps <uid>/only/<client id> from that client; the group's member
    B (persistent) is offline, A (clean) online. Returns (broker, A, a publisher)."""
    acl = write_acl(tmp_path / "acl", f"topic readwrite {uid}/#\n"
                                      f"pattern deny {uid}/only/%c\n")
    b = broker(acl_file=str(acl), **({"limits": limits} if limits else {}))
    share = f"$share/g/{uid}/#"
    member(b, f"{uid}-B", share, clean=False).disconnect()
    a = member(b, f"{uid}-A", share)
    return b, a, b.client(f"{uid}-pub")


def test_a_message_only_an_offline_member_may_read_does_not_hold_back_the_others(
        broker, tmp_path, uid):
    b, a, pub = _group(broker, tmp_path, uid)
    pub.publish(f"{uid}/only/{uid}-A", b"for B 1", qos=1)   # the head: only B may read it
    for i in range(10):
        pub.publish(f"{uid}/y", b"%d" % i, qos=1)
        if i == 4:
            pub.publish(f"{uid}/only/{uid}-A", b"for B 2", qos=1)
    assert payloads(collect([a], 10)[a]) == [b"%d" % i for i in range(10)]
    assert publishes(a) == []
    back = b.client(f"{uid}-B", clean=False)
    assert payloads(collect([back], 2)[back]) == [b"for B 1", b"for B 2"]
    assert publishes(back) == [] and publishes(a) == []


def test_the_others_get_the_backlog_read_from_the_log_past_it(broker, tmp_path, uid):
    """A's window is 2 and the backlog outgrows its memory (256): the records in the log come
    in as A makes room, in order, though the head still waits for B."""
    b, a, pub = _group(broker, tmp_path, uid, max_inflight_messages=2)
    pub.publish(f"{uid}/only/{uid}-A", b"for B", qos=1)
    sent = [b"m%03d" % i for i in range(400)]
    for payload in sent:
        pub.publish(f"{uid}/y", payload, qos=1)
    assert b.stats()["shared_groups_behind"] == 1
    got = [a.recv_publish().payload for _ in sent]      # each acknowledged: room for more
    assert got == sent
    assert publishes(a) == []
    back = b.client(f"{uid}-B", clean=False)
    assert payloads(collect([back], 1)[back]) == [b"for B"]
    assert b.stats()["shared_queued_messages"] == 0
