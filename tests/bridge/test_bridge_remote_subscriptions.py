"""The bridge's subscriptions at a real Mosquitto (clean_start = false, the default).

- An `in` rule changed across a restart: the filter the earlier configuration subscribed to
  stayed in the remote's session for good, and while the gateway was away its messages
  filled the session's queue (Mosquitto's max_queued_messages), so the messages the new rule
  wants were dropped there. The checkpoint remembers the filters; the bridge unsubscribes
  the stale one.
- Overlapping `in` rules on MQTT 5.0: the remote sends a message once per matching
  subscription, and each copy was published here. With a Subscription Identifier per filter,
  only the copy of the first rule that matches is published (mapped by it).
"""

from __future__ import annotations

import json

import mqttraw
import mqttraw5 as m5
import pytest
from core.test_disk_full import _log_payloads

from .helpers import FakeRemote5, bridge_table, checkpoint, publish_range, wait_figure

# Mosquitto logs each SUBSCRIBE and UNSUBSCRIBE as it takes it: the test waits for those.
LOGGED = ["log_type subscribe", "log_type unsubscribe"]
QUEUE = ["max_queued_messages 1000", *LOGGED]     # Mosquitto's default queue, said explicitly
OLD = [{"pattern": "old/#", "direction": "in", "qos": 1, "local_prefix": "o/"}]
NEW = [{"pattern": "new/#", "direction": "in", "qos": 1, "local_prefix": "n/"}]


def _remote_client(remote, client_id: str) -> mqttraw.RawClient:
    c = mqttraw.RawClient("127.0.0.1", remote.port)
    assert c.connect(client_id).rc == 0
    return c


def _subscribed(remote, mark: int, *filters: str) -> int:
    """Once the remote took this bridge's (client id "gw") subscriptions to ``filters``,
    logged from line ``mark`` on; returns the next mark."""
    for topic_filter in filters:
        line = remote.out.wait(lambda ln: ln.endswith(f": gw 1 {topic_filter}"), 10, mark)
        assert line is not None, remote.log_text()
    return len(remote.out.lines)


@pytest.mark.parametrize("version", [4, 5])
def test_a_changed_in_rule_is_unsubscribed_and_the_new_one_survives_an_outage(
        broker, mosquitto_broker, version):
    remote = mosquitto_broker(extra=QUEUE)
    gw = broker(bridge=[bridge_table(remote.port, OLD, protocol_version=version,
                                     client_id="gw")])
    mark = _subscribed(remote, 0, "old/#")
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0

    # The rule changed: the remote kept the session, with old/# in it. A message on the new
    # rule's topic arrives: the remote read this link's SUBSCRIBE, and what came before it.
    table = bridge_table(remote.port, NEW, protocol_version=version, client_id="gw")
    gw = second = broker(bridge=[table], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "session present: True" in ln, 10)
    mark = _subscribed(remote, mark, "new/#")
    central = _remote_client(remote, "central")
    publish_range(central, "new/x", 0, 1)
    wait_figure(gw, lambda f: f["received"] == 1)
    assert gw.stop() == 0

    # The gateway is away: 1000 messages on the old topic, then 50 on the new one.
    publish_range(central, "old/x", 0, 1000)
    publish_range(central, "new/x", 1, 51)
    gw = broker(bridge=[table], data_dir=data_dir)
    fig = wait_figure(gw, lambda f: f["received"] == 50)
    assert fig["received_dropped"] == 0
    # Live, the old topic does not reach the bridge either.
    publish_range(central, "old/x", 0, 100)
    publish_range(central, "new/x", 51, 52)
    fig = wait_figure(gw, lambda f: f["received"] == 51)
    assert fig["received_dropped"] == 0 and gw.stats()["dropped"].get("bridge_in", 0) == 0
    central.close()
    assert gw.stop() == 0
    assert _log_payloads(data_dir) == [str(i) for i in range(52)]
    # The second run said what it removed; the checkpoint remembers the new filter only.
    assert not any("unsubscribing" in ln for ln in gw.logs)     # nothing left to remove
    assert sum("bridge up: unsubscribing from 'old/#' at the remote: filters an earlier "
               "configuration subscribed to" in ln for ln in second.logs) == 1
    assert checkpoint(data_dir)["subscriptions"] == {"new/#": 0 if version == 4 else 2}


def test_without_a_remembered_list_it_says_so_and_clean_start_once_clears_it(
        broker, mosquitto_broker):
    """A checkpoint of an older version does not say which filters were subscribed to: a
    warning names the fix (docs/bridge.md), which works: one connect with clean_start."""
    remote = mosquitto_broker(extra=LOGGED)
    gw = broker(bridge=[bridge_table(remote.port, OLD, client_id="gw")])
    mark = _subscribed(remote, 0, "old/#")
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    older = checkpoint(data_dir)
    del older["subscriptions"]
    path = f"{data_dir}/bridge-up.json"
    with open(path, "w") as f:
        json.dump(older, f)

    gw = broker(bridge=[bridge_table(remote.port, NEW, client_id="gw")], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "the checkpoint does not say which filters an earlier run "
                                  "subscribed to" in ln and "clean_start = true" in ln, 10)
    mark = _subscribed(remote, mark, "new/#")
    central = _remote_client(remote, "central")
    publish_range(central, "old/x", 0, 5)      # old/# is still in the session
    wait_figure(gw, lambda f: f["received_dropped"] == 5)
    assert gw.stop() == 0
    gw = broker(bridge=[bridge_table(remote.port, NEW, client_id="gw", clean_start=True)],
                data_dir=data_dir)
    mark = _subscribed(remote, mark, "new/#")
    assert gw.stop() == 0
    gw = broker(bridge=[bridge_table(remote.port, NEW, client_id="gw")], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "session present: False" in ln, 10)
    _subscribed(remote, mark, "new/#")
    publish_range(central, "old/x", 0, 5)
    publish_range(central, "new/x", 0, 1)
    fig = wait_figure(gw, lambda f: f["received"] == 1)
    assert fig["received_dropped"] == 0
    central.close()


@pytest.mark.parametrize("version, first, expected", [
    (5, "c/#", "all/c/x/n"), (5, "c/x/#", "x/c/x/n"), (4, "c/#", "all/c/x/n")])
def test_overlapping_in_rules_publish_each_message_once(broker, mosquitto_broker, version,
                                                         first, expected):
    rules = [{"pattern": "c/#", "direction": "in", "qos": 1, "local_prefix": "all/"},
             {"pattern": "c/x/#", "direction": "in", "qos": 1, "local_prefix": "x/"}]
    if first != "c/#":
        rules.reverse()
    remote = mosquitto_broker(extra=LOGGED)
    table = bridge_table(remote.port, rules, protocol_version=version, client_id="gw")
    gw = broker(bridge=[table])
    _subscribed(remote, 0, "c/#", "c/x/#")
    local = gw.client("local")
    local.subscribe("#", qos=1)
    central = _remote_client(remote, "central")
    publish_range(central, "c/x/n", 0, 100)
    publish_range(central, "c/y", 0, 1)         # one rule only: one copy
    copies = 100 if version == 5 else 0        # (3.1.1: Mosquitto sends one copy)
    fig = wait_figure(gw, lambda f: f["received"] + f["received_copies"] >= 101 + copies)
    assert (fig["received"], fig["received_copies"], fig["received_dropped"]) == (101, copies, 0)
    got = [local.recv_publish(5) for _ in range(101)]
    assert sorted(p.topic for p in got) == sorted(["all/c/y"] + [expected] * 100)
    assert sorted(int(p.payload) for p in got if p.topic == expected) == list(range(100))

    # Across a restart (Session Present 1: the identifiers remembered in the checkpoint):
    # the copies queued for the session while the gateway was away.
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    publish_range(central, "c/x/n", 100, 110)
    gw = broker(bridge=[table], data_dir=data_dir)
    fig = wait_figure(gw, lambda f: f["received"] + f["received_copies"] >= 10 + copies // 10)
    assert (fig["received"], fig["received_copies"]) == (10, copies // 10)
    central.close()
    assert gw.stop() == 0
    assert sorted(map(int, _log_payloads(data_dir))) == [0] + list(range(110))


def test_many_in_rules_with_a_window_of_one_all_subscribe(broker, mosquitto_broker):
    """One SUBSCRIBE per filter on 5.0: with `window = 1` the bridge has 4 packet ids, all
    taken at a restart by the PUBRELs of release.py, so its SUBSCRIBEs wait in the client
    library's queue, which must take them all (it took `window` requests)."""
    remote = mosquitto_broker(extra=LOGGED)
    filters = [f"r{i}/#" for i in range(6)]
    rules = [{"pattern": f, "direction": "in", "qos": 1} for f in filters]
    table = bridge_table(remote.port, rules, protocol_version=5, client_id="gw", window=1)
    gw = broker(bridge=[table])
    mark = _subscribed(remote, 0, *filters)
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    gw = broker(bridge=[table], data_dir=data_dir)
    assert gw.wait_log(lambda ln: "session present: True" in ln, 10)
    _subscribed(remote, mark, *filters)
    central = _remote_client(remote, "central")
    for i in range(6):
        publish_range(central, f"r{i}/x", i, i + 1)
    wait_figure(gw, lambda f: f["received"] == 6)
    central.close()
    assert not any("internal error" in ln for ln in gw.logs)


@pytest.mark.parametrize("ids_available", [True, False])
def test_which_copy_is_published_by_its_identifiers(broker, ids_available):
    """The rule against a remote the test plays: a SUBSCRIBE per filter with identifiers 1
    and 2; a copy is published only when its identifiers hold the first matching rule's
    (a copy with none is published). A remote with Subscription Identifier Available 0 gets
    one SUBSCRIBE without identifiers, and every copy is published (documented)."""
    remote = FakeRemote5()
    rules = [{"pattern": "c/#", "direction": "in", "qos": 1, "local_prefix": "all/"},
             {"pattern": "c/x/#", "direction": "in", "qos": 1, "local_prefix": "x/"}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)])
        end = remote.accept(None if ids_available
                            else m5.connack5(props={m5.SUB_ID_AVAILABLE: 0}))
        subs = [end.expect(m5.SUBSCRIBE) for _ in range(2 if ids_available else 1)]
        assert [(s.topics, s.properties) for s in subs] == (
            [([("c/#", 0x1D)], {0x0B: 1}), ([("c/x/#", 0x1D)], {0x0B: 2})] if ids_available
            else [([("c/#", 0x1D), ("c/x/#", 0x1D)], {})]), subs
        for s in subs:
            end.send(m5.suback5(s.packet_id, [1] * len(s.topics)))
        wait_figure(gw, lambda f: f["state"] == "up")
        local = gw.client("local")
        local.subscribe("#", qos=1)
        copies = [("c/x/1", [(0x0B, 2)]), ("c/x/1", [(0x0B, 1)]),     # two subscriptions
                  ("c/x/2", [(0x0B, 2), (0x0B, 1)]),                    # one copy, both ids
                  ("c/x/3", None), ("c/y", [(0x0B, 1)])]                # none; one rule
        for pid, (topic, props) in enumerate(copies, 1):
            end.send(m5.publish5(topic, topic, qos=1, packet_id=pid, props=props))
        assert sorted(end.expect(m5.PUBACK).packet_id for _ in copies) == [1, 2, 3, 4, 5]
        published = 4 if ids_available else 5
        fig = wait_figure(gw, lambda f: f["received"] + f["received_copies"] == 5)
        assert (fig["received"], fig["received_copies"]) == (published, 5 - published)
        got = sorted((p.topic, p.payload) for p in
                     (local.recv_publish(5) for _ in range(published)))
        assert got == sorted(([] if ids_available else [("all/c/x/1", b"c/x/1")]) + [
            ("all/c/x/1", b"c/x/1"), ("all/c/x/2", b"c/x/2"), ("all/c/x/3", b"c/x/3"),
            ("all/c/y", b"c/y")])
    finally:
        remote.close()
