"""A 5.0 CONNECT refused for its will is counted under its own refusal reason, ``will``
(docs/metrics.md), and its log line names the client id the CONNECT carried."""

import mqttraw5 as R
from conftest import _open_clients


def _connect5(b, client_id, will):
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    ack = c.connect(client_id, will=will)
    assert c.expect_closed()
    return ack.reason


def test_a_will_refused_is_counted_as_will_and_names_the_client(broker, uid):
    b = broker(limits={"max_qos": 1, "retain_available": False}, refusal_log_interval=0)
    mark = b.mark()
    assert _connect5(b, f"{uid}-ret", (f"{uid}/w", b"x", 0, True)) == 0x9A
    assert _connect5(b, f"{uid}-qos", (f"{uid}/w", b"x", 2)) == 0x9B
    assert _connect5(b, f"{uid}-utf", (f"{uid}/w", b"\xff", 0, False,
                                       {R.PAYLOAD_FORMAT: 1})) == 0x99
    s = b.stats()
    assert s["refused"]["will"] == 2 and s["refused"]["client_id"] == 0
    assert s["refused"]["payload_format"] == 1
    for cid, why in ((f"{uid}-ret", "refused (CONNACK 0x9a): a retained will"),
                     (f"{uid}-qos", "refused (CONNACK 0x9b): will QoS 2 is above max_qos (1)"),
                     (f"{uid}-utf", "refused (CONNACK 0x99): will payload is not")):
        line = b.wait_log(lambda ln, cid=cid: f"client '{cid}' from" in ln, start=mark)
        assert line is not None and why in line, b.logs[mark:]
    assert not any("(before CONNECT)" in ln for ln in b.logs[mark:])
