"""The bridge's subscriptions at a real Mosquitto (clean_start = false, the default).

- An `in` rule changed across a restart: the filter the earlier configuration subscribed to
  stayed in the remote's session for good, and while the gateway was away its messages
  filled the session's queue (Mosquitto's max_queued_messages), so the messages the new rule
  wants were dropped there. The checkpoint remembers the filters; the bridge unsubscribes
  the stale one.
- Overlapping `in` rules on MQTT 5.0: the remote sends a message once per matching
  subscription, and it queues and drops each copy on its own. Every copy is published here
  (duplicates): skipping copies by their Subscription Identifiers lost messages whose
  "first" copy never came (a QoS 0 first rule, a full queue, a rule added later).
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
        line = remote.out.wait(lambda ln: any(ln.endswith(f": gw {qos} {topic_filter}")
                                              for qos in (0, 1, 2)), 10, mark)
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
    assert checkpoint(data_dir)["subscriptions"] == {"new/#": 0}


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


C_RULES = [{"pattern": "c/#", "direction": "in", "qos": 1},
           {"pattern": "c/x/#", "direction": "in", "qos": 1}]


def _restarted(broker, gw, table):
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    return data_dir


@pytest.mark.parametrize("version", [4, 5])
def test_overlapping_in_rules_publish_every_copy(broker, mosquitto_broker, version):
    """Live and across a restart (the copies queued for the kept session): each message
    comes once per matching subscription on 5.0 (Mosquitto sends one on 3.1.1), and every
    copy is published, under the first rule's mapping."""
    rules = [{**C_RULES[0], "local_prefix": "all/"}, {**C_RULES[1], "local_prefix": "x/"}]
    remote = mosquitto_broker(extra=LOGGED)
    table = bridge_table(remote.port, rules, protocol_version=version, client_id="gw")
    gw = broker(bridge=[table])
    _subscribed(remote, 0, "c/#", "c/x/#")
    local = gw.client("local")
    local.subscribe("#", qos=1)
    central = _remote_client(remote, "central")
    publish_range(central, "c/x/n", 0, 100)
    publish_range(central, "c/y", 0, 1)         # one rule only: one copy
    copies = 2 if version == 5 else 1
    fig = wait_figure(gw, lambda f: f["received"] >= 1 + 100 * copies)
    assert (fig["received"], fig["received_dropped"]) == (1 + 100 * copies, 0)
    got = [local.recv_publish(5) for _ in range(1 + 100 * copies)]
    assert sorted(p.topic for p in got) == sorted(["all/c/y"] + ["all/c/x/n"] * 100 * copies)

    data_dir = _restarted(broker, gw, table)
    publish_range(central, "c/x/n", 100, 110)
    gw = broker(bridge=[table], data_dir=data_dir)
    fig = wait_figure(gw, lambda f: f["received"] >= 10 * copies)
    assert fig["received"] == 10 * copies
    central.close()
    assert gw.stop() == 0
    assert sorted(map(int, _log_payloads(data_dir))) == sorted(
        [0] + list(range(100)) * copies + list(range(100, 110)) * copies)


def test_a_lower_qos_first_rule_loses_nothing(broker, mosquitto_broker):
    """`c/#` QoS 0 before `c/x/#` QoS 1 on 5.0: Mosquitto queues no QoS 0 copy for the kept
    session while the gateway is away, so a message published then comes only by `c/x/#`."""
    rules = [{**C_RULES[0], "qos": 0}, C_RULES[1]]
    remote = mosquitto_broker(extra=LOGGED)
    table = bridge_table(remote.port, rules, protocol_version=5, client_id="gw")
    gw = broker(bridge=[table])
    _subscribed(remote, 0, "c/#", "c/x/#")
    central = _remote_client(remote, "central")
    publish_range(central, "c/x/1", 0, 1)
    wait_figure(gw, lambda f: f["received"] == 2)      # a copy by each subscription
    data_dir = _restarted(broker, gw, table)
    publish_range(central, "c/x/1", 1, 2)
    gw = broker(bridge=[table], data_dir=data_dir)
    wait_figure(gw, lambda f: f["received"] == 1)
    central.close()
    assert gw.stop() == 0
    assert sorted(_log_payloads(data_dir)) == ["0", "0", "1"]


def test_a_copy_the_remotes_queue_dropped_loses_nothing(broker, mosquitto_broker):
    """Mosquitto's `max_queued_messages 3`: two messages while the gateway is away make four
    copies, and it drops one (the `c/#` copy of the second): its other copy is published."""
    remote = mosquitto_broker(extra=["max_queued_messages 3", *LOGGED])
    table = bridge_table(remote.port, C_RULES, protocol_version=5, client_id="gw")
    gw = broker(bridge=[table])
    _subscribed(remote, 0, "c/#", "c/x/#")
    data_dir = _restarted(broker, gw, table)
    central = _remote_client(remote, "central")
    publish_range(central, "c/x/1", 0, 2)
    gw = broker(bridge=[table], data_dir=data_dir)
    wait_figure(gw, lambda f: f["received"] >= 3)
    central.close()
    assert gw.stop() == 0
    assert set(_log_payloads(data_dir)) == {"0", "1"}


def test_a_retained_message_brought_by_a_new_overlapping_rule_is_kept(broker,
                                                                       mosquitto_broker):
    """Run 1 has `c/#`; while the gateway is away a retained QoS 0 message is set at the
    remote (not queued: QoS 0; and the kept `c/#` subscription does not send it again:
    Retain Handling 1). Run 2 adds `c/x/#`, whose new subscription brings it: the one copy
    there is, stored here as retained."""
    remote = mosquitto_broker(extra=LOGGED)
    table = bridge_table(remote.port, C_RULES[:1], protocol_version=5, client_id="gw")
    gw = broker(bridge=[table])
    mark = _subscribed(remote, 0, "c/#")
    data_dir = _restarted(broker, gw, table)
    central = _remote_client(remote, "central")
    central.publish("c/x/1", b"kept", qos=0, retain=True)
    publish_range(central, "z/after", 0, 1)     # acknowledged: the retained one was taken
    central.close()
    table = bridge_table(remote.port, C_RULES, protocol_version=5, client_id="gw")
    gw = broker(bridge=[table], data_dir=data_dir)
    _subscribed(remote, mark, "c/#", "c/x/#")
    wait_figure(gw, lambda f: f["received"] == 1)
    local = gw.client("local")
    local.subscribe("c/x/1", qos=1)
    p = local.recv_publish(5)
    assert (p.topic, p.payload, p.retain) == ("c/x/1", b"kept", True)


def test_many_in_rules_with_a_window_of_one_all_subscribe(broker, mosquitto_broker):
    """With `window = 1` the bridge has 4 packet ids, all taken at a restart by the PUBRELs
    of release.py, so its SUBSCRIBE waits in the client library's queue, which must take it
    (it took `window` requests)."""
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
def test_every_copy_is_published_whatever_its_identifiers(broker, ids_available):
    """Against a remote the test plays: one SUBSCRIBE without Subscription Identifiers, and
    every copy published (under the first rule's mapping), whatever identifiers it carries."""
    remote = FakeRemote5()
    rules = [{"pattern": "c/#", "direction": "in", "qos": 1, "local_prefix": "all/"},
             {"pattern": "c/x/#", "direction": "in", "qos": 1, "local_prefix": "x/"}]
    try:
        gw = broker(bridge=[bridge_table(remote.port, rules, protocol_version=5)])
        end = remote.accept(None if ids_available
                            else m5.connack5(props={m5.SUB_ID_AVAILABLE: 0}))
        sub = end.expect(m5.SUBSCRIBE)
        assert (sub.topics, sub.properties) == ([("c/#", 0x1D), ("c/x/#", 0x1D)], {})
        end.send(m5.suback5(sub.packet_id, [1, 1]))
        wait_figure(gw, lambda f: f["state"] == "up")
        local = gw.client("local")
        local.subscribe("#", qos=1)
        copies = [("c/x/1", [(0x0B, 2)]), ("c/x/1", [(0x0B, 1)]),     # two subscriptions
                  ("c/x/2", [(0x0B, 2), (0x0B, 1)]),                    # one copy, both ids
                  ("c/x/3", None), ("c/y", [(0x0B, 1)])]                # none; one rule
        for pid, (topic, props) in enumerate(copies, 1):
            end.send(m5.publish5(topic, topic, qos=1, packet_id=pid, props=props))
        assert sorted(end.expect(m5.PUBACK).packet_id for _ in copies) == [1, 2, 3, 4, 5]
        assert wait_figure(gw, lambda f: f["received"] == 5)["received_dropped"] == 0
        got = sorted((p.topic, p.payload) for p in (local.recv_publish(5) for _ in copies))
        assert got == sorted(("all/" + t, t.encode()) for t, _ in copies)
    finally:
        remote.close()


def test_a_checkpoint_with_subscription_identifiers_still_loads(broker, mosquitto_broker):
    """A checkpoint of the version that subscribed with identifiers ({filter: id}): its
    filters are known, the stale one is unsubscribed, and the file then holds 0s."""
    remote = mosquitto_broker(extra=LOGGED)
    gw = broker(bridge=[bridge_table(remote.port, OLD, protocol_version=5, client_id="gw")])
    mark = _subscribed(remote, 0, "old/#")
    data_dir = gw.config["data_dir"]
    assert gw.stop() == 0
    earlier = checkpoint(data_dir)
    earlier["subscriptions"] = {"old/#": 1}
    with open(f"{data_dir}/bridge-up.json", "w") as f:
        json.dump(earlier, f)
    gw = broker(bridge=[bridge_table(remote.port, NEW, protocol_version=5, client_id="gw")],
                data_dir=data_dir)
    _subscribed(remote, mark, "new/#")
    central = _remote_client(remote, "central")
    publish_range(central, "new/x", 0, 1)      # comes behind the UNSUBACK
    wait_figure(gw, lambda f: f["received"] == 1)
    central.close()
    assert any("unsubscribing from 'old/#' at the remote" in ln for ln in gw.logs)
    assert gw.stop() == 0
    assert checkpoint(data_dir)["subscriptions"] == {"new/#": 0}
    assert not any("checkpoint does not say" in ln or "checkpoint was damaged" in ln
                   for ln in gw.logs)
