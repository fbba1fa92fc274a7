"""A client connecting with clean session 1 (3.1.1) or Clean Start 1 (5.0) over its offline
persistent session discards it with what it held: one log line says how much (as a session's
expiry does), and no drop is counted, the client asked for it (docs/metrics.md)."""

from __future__ import annotations

import pytest

import mqttraw as M
import mqttraw5 as R
from conftest import _open_clients, wait_for_snapshot

pytestmark = pytest.mark.timeout(60)


def raw(b, client_id, v5: bool, clean: bool):
    if v5:
        c = R.RawClient5(b.host, b.port)
        connack = c.connect(client_id, clean_start=clean, props={R.SESSION_EXPIRY: 300})
    else:
        c = M.RawClient(b.host, b.port)
        connack = c.connect(client_id, clean=clean)
    _open_clients.append(c)
    assert (connack.reason if v5 else connack.rc) == 0, connack
    return c


@pytest.mark.parametrize("v5", [False, True], ids=["3.1.1", "5.0"])
def test_a_clean_start_over_a_persistent_session_logs_what_it_discarded(broker, uid, v5):
    b = broker()
    data_dir = b.config["data_dir"]
    sub = raw(b, f"{uid}-s", v5, clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    pub = raw(b, f"{uid}-p", False, clean=True)
    for i in range(3):
        pub.publish(f"{uid}/t", b"sent, not acknowledged %d" % i, qos=1)
    for _ in range(3):      # received, never acknowledged: in flight when it goes
        sub.wait_for(lambda p: p.type == M.PUBLISH)
    sub.disconnect()
    wait_for_snapshot(data_dir, f"{uid}-s", pred=lambda s: s["offline_ms"] is not None)
    for i in range(5):      # for it while offline: in the log after its cursor
        pub.publish(f"{uid}/t", b"queued %d" % i, qos=1)
    mark = b.mark()
    again = raw(b, f"{uid}-s", v5, clean=True)
    line = b.wait_log(lambda ln: f"persistent session '{uid}-s' discarded" in ln, start=mark)
    assert line, "no line says what the clean start discarded"
    assert (f"connected with {'Clean Start 1' if v5 else 'clean session 1'}, with 3 queued "
            f"or unacknowledged messages and 5 log records after its cursor") in line, line
    assert again.ping() == []       # nothing of the old session is sent
    assert not any(b.stats()["dropped"].values())
