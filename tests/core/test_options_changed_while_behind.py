"""A 5.0 session behind (reading the log at its cursor) that subscribes again to a filter it has
with No Local or Retain As Published changed: the records published before that SUBSCRIBE are
decided with the options the filter had then, as they would have been for the queue of a
session in step; the new options count from the SUBSCRIBE on (docs/persistence.md, "The log
is the queue")."""

import signal

import pytest

import mqttraw5 as R
from conftest import _open_clients, wait_for_snapshot
from core.test_lowered_while_behind import read_publishes

pytestmark = pytest.mark.timeout(60)

BEFORE = 600     # the window (20) and the queue (256) hold less: the session falls behind
RETAINED = (350, 450)     # published with RETAIN 1, read from the log after the change
OWN = 5
QOS1 = 0x01
NL, RAP, NO_RETAINED = R.NO_LOCAL, R.RETAIN_AS_PUBLISHED, R.retain_handling(2)


def _connect5(b, client_id, clean_start=True):
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, clean_start=clean_start,
                     props={R.SESSION_EXPIRY: 3600}).reason == 0
    return c


def _fall_behind_then_change(b, uid, old, new, v5_again=True):
    """``uid``-s subscribes t with options ``old`` and reads nothing while BEFORE QoS 1
    messages are published (RETAINED with RETAIN 1), publishes OWN QoS 1 messages of its own
    ("own"), subscribes t again with options ``new`` (``v5_again`` False: reconnected as a
    3.1.1 client, which SUBSCRIBEs with no options), then publishes OWN more ("after") and
    another client a retained one ("r")."""
    sub = _connect5(b, f"{uid}-s")
    sub.subscribe((f"{uid}/t", old))
    pub = b.client(f"{uid}-p")
    for i in range(BEFORE):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1, retain=i in RETAINED)
    assert b.stats()["sessions_behind"] == 1
    for i in range(OWN):
        sub.publish(f"{uid}/t", b"own%d" % i, qos=1)     # each acknowledged (PUBACK)
    if v5_again:
        sub.subscribe((f"{uid}/t", new | NO_RETAINED))
    else:
        sub.close()
        sub = b.client(f"{uid}-s", clean=False)
        sub.subscribe((f"{uid}/t", new))
    for i in range(OWN):
        sub.publish(f"{uid}/t", b"after%d" % i, qos=1)
    pub.publish(f"{uid}/t", b"r", qos=1, retain=True)
    return sub, pub


def _read(c, n) -> list:
    """``n`` PUBLISHes (acknowledged) as (payload, RETAIN); then none more."""
    got = read_publishes(c, n, "retain")
    assert c.ping() == []
    return got


def _expected(own: bool, after: bool, retain_before: bool, retain_after: bool) -> list:
    return ([(b"%d" % i, retain_before and i in RETAINED) for i in range(BEFORE)]
            + ([(b"own%d" % i, False) for i in range(OWN)] if own else [])
            + ([(b"after%d" % i, False) for i in range(OWN)] if after else [])
            + [(b"r", retain_after)])


@pytest.mark.parametrize("old, new, own, after, retain_before, retain_after", [
    # No Local cleared: its own messages from before never became part of its state.
    (QOS1 | NL, QOS1, False, True, False, False),
    # No Local set: its own acknowledged QoS 1 messages from before are still delivered.
    (QOS1, QOS1 | NL, True, False, False, False),
    # Retain As Published set, then cleared: the older records keep the old RETAIN rule.
    (QOS1, QOS1 | RAP, True, True, False, True),
    (QOS1 | RAP, QOS1, True, True, True, False),
], ids=["no-local-off", "no-local-on", "rap-on", "rap-off"])
def test_records_from_before_the_change_are_decided_with_the_old_options(
        broker, uid, old, new, own, after, retain_before, retain_after):
    """(Before the fix the new options counted for the records still in the log too: own0-4
    came under No Local cleared and not once it was set; 350 and 450 had the new RETAIN.)"""
    b = broker()
    sub, _ = _fall_behind_then_change(b, uid, old, new)
    expected = _expected(own, after, retain_before, retain_after)
    assert _read(sub, len(expected)) == expected
    assert b.stats()["sessions_behind"] == 0


def test_a_3_1_1_subscribe_clears_no_local_only_for_later_records(broker, uid):
    """A 5.0 session with No Local, resumed by a 3.1.1 client whose SUBSCRIBE replaces the
    subscription with a plain one: its own messages from before are still left out."""
    b = broker()
    sub, _ = _fall_behind_then_change(b, uid, QOS1 | NL, QOS1, v5_again=False)
    expected = _expected(False, True, False, False)
    expected.insert(BEFORE, (b"%d" % RETAINED[-1], True))    # (the 3.1.1 SUBSCRIBE's copy)
    assert _read(sub, len(expected)) == expected


def test_the_old_options_are_kept_across_a_restart(broker, uid):
    """The session goes offline behind after setting No Local and Retain As Published, and the
    broker restarts: its own older messages still come, the older retained records with
    RETAIN 0; its own later ones do not, the later retained one has RETAIN 1."""
    b = broker()
    sub, pub = _fall_behind_then_change(b, uid, QOS1, QOS1 | NL | RAP)
    sub.disconnect()
    pub.disconnect()
    b.stop()
    b2 = broker(data_dir=b.config["data_dir"])
    again = _connect5(b2, f"{uid}-s", clean_start=False)
    expected = _expected(True, False, False, True)
    assert _read(again, len(expected)) == expected
    assert not any(b2.stats()["dropped"].values())


def test_the_old_options_are_kept_across_a_sigkill(broker, uid):
    """As above with a SIGKILL once the snapshot holds the kept options: the older records are
    still decided with them (the window's again, with DUP: nothing was read)."""
    b = broker()
    sub, pub = _fall_behind_then_change(b, uid, QOS1, QOS1 | NL | RAP)
    wait_for_snapshot(b.config["data_dir"], f"{uid}-s", pred=lambda s: s.get("kept5"))
    b.stop(signal.SIGKILL)
    sub.close()
    pub.close()
    b2 = broker(data_dir=b.config["data_dir"])
    again = _connect5(b2, f"{uid}-s", clean_start=False)
    expected = _expected(True, False, False, True)
    assert _read(again, len(expected)) == expected
    assert not any(b2.stats()["dropped"].values())
