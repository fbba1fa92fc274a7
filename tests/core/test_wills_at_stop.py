"""The will of a client still connected at a clean stop (SIGTERM) is kept in the final
snapshot as a delayed will, due at the stop time plus its Will Delay Interval: the next start
publishes it then (at once for 3.1.1 and for a session that ended at the stop), unless a 5.0
client is back in its session within the delay (MQTT-3.1.2-8; docs/protocol.md, "Wills")."""

from __future__ import annotations

import json

import pytest

import mqttraw as M
import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(60)


def raw(b, client_id, v5: bool, **kw):
    c = (R.RawClient5 if v5 else M.RawClient)(b.host, b.port)
    _open_clients.append(c)
    connack = c.connect(client_id, **kw)
    assert (connack.reason if v5 else connack.rc) == 0, connack
    return c


def kept_wills(data_dir: str) -> list[str]:
    """The client ids of the wills the snapshot holds, in sessions and of ended sessions."""
    with open(f"{data_dir}/sessions.json") as fh:
        doc = json.load(fh)
    return ([s["client_id"] for s in doc["sessions"] if "will" in s]
            + [w["client_id"] for w in doc.get("wills", ())])


@pytest.mark.parametrize("case", ["3.1.1 clean", "3.1.1 persistent", "5.0 expiry 0 delay 30"])
def test_the_will_of_a_client_connected_at_a_stop_is_published_by_the_next_start(
        broker, uid, case):
    """A device's retained status: 'online' while connected, its will 'offline'. The broker
    stops with it connected and it does not come back: the status must not stay 'online'."""
    b = broker()
    data_dir = b.config["data_dir"]
    topic = f"{uid}/status/x"
    if case.startswith("3.1.1"):
        dev = raw(b, f"{uid}-dev", False, clean=case.endswith("clean"),
                  will=(topic, b"offline", 1, True))
    else:   # its session ends with the connection: the will goes then, delay or not
        dev = raw(b, f"{uid}-dev", True, props={R.SESSION_EXPIRY: 0},
                  will=(topic, b"offline", 1, True, {R.WILL_DELAY: 30}))
    dev.publish(topic, b"online", qos=1, retain=True)
    mark = b.mark()
    assert b.stop() == 0
    assert any(f"will of client '{uid}-dev'" in ln and "kept for the next start" in ln
               for ln in b.logs[mark:])
    assert kept_wills(data_dir) == [f"{uid}-dev"]
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: f"publishing will of client '{uid}-dev'" in ln)
    assert b2.wait_log(lambda ln: "restored 1 delayed wills" in ln and "1 due now" in ln)
    sub = raw(b2, f"{uid}-sub", False)
    sub.subscribe(f"{uid}/status/#", qos=1)
    p = sub.wait_for(lambda p: p.type == M.PUBLISH)
    assert (p.topic, p.payload, p.retain) == (topic, b"offline", True)
    sub.close()
    assert b2.stop() == 0   # (the start's first snapshot may not be written yet: the final one)
    assert kept_wills(data_dir) == [], "published, and still in the snapshot"


def test_a_client_back_within_its_will_delay_after_a_stop_cancels_its_will(broker, uid):
    b = broker()
    data_dir = b.config["data_dir"]
    topic = f"{uid}/status/x"
    dev = raw(b, f"{uid}-dev", True, props={R.SESSION_EXPIRY: 300},
              will=(topic, b"offline", 1, True, {R.WILL_DELAY: 30}))
    dev.publish(topic, b"online", qos=1, retain=True)
    assert b.stop() == 0
    assert kept_wills(data_dir) == [f"{uid}-dev"]
    b2 = broker(data_dir=data_dir)
    assert b2.wait_log(lambda ln: "restored 1 delayed wills" in ln and "1 later" in ln)
    mark = b2.mark()
    back = raw(b2, f"{uid}-dev", True, clean_start=False, props={R.SESSION_EXPIRY: 300})
    assert b2.wait_log(lambda ln: f"will of client '{uid}-dev'" in ln
                       and "connected again within the Will Delay Interval" in ln, start=mark)
    back.disconnect()
    sub = raw(b2, f"{uid}-sub", False)
    sub.subscribe(f"{uid}/status/#", qos=1)
    p = sub.wait_for(lambda p: p.type == M.PUBLISH)
    assert (p.topic, p.payload) == (topic, b"online")
    assert not any("publishing will of" in ln for ln in b2.logs[mark:])
