"""Interoperability with real clients: paho-mqtt (v2 API) and Debian's mosquitto_pub/mosquitto_sub."""

import paho.mqtt.client as mqtt
import pytest


# ---------------------------------------------------------------------------------------------
# paho-mqtt
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_pubsub(srv, paho, uid, qos):
    sub = paho(srv.port, client_id=f"{uid}-s")
    assert sub.subscribe(f"{uid}/t", qos) == [qos]
    pub = paho(srv.port, client_id=f"{uid}-p")
    pub.publish(f"{uid}/t", b"hello paho", qos=qos)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == (f"{uid}/t", b"hello paho", qos, False)


def test_paho_mqtt31(srv, paho, uid):
    sub = paho(srv.port, client_id=f"{uid}-s"[:23], protocol=mqtt.MQTTv31)
    sub.subscribe(f"{uid}/t", 2)
    pub = paho(srv.port, client_id=f"{uid}-p"[:23], protocol=mqtt.MQTTv31)
    pub.publish(f"{uid}/t", b"v31", qos=2)
    assert sub.get().payload == b"v31"


def test_paho_wildcards_and_unsubscribe(srv, paho, uid):
    sub = paho(srv.port, client_id=f"{uid}-s")
    sub.subscribe(f"{uid}/+/temp", 1)
    sub.subscribe(f"{uid}/marker", 1)
    pub = paho(srv.port, client_id=f"{uid}-p")
    pub.publish(f"{uid}/room1/temp", b"21.5", qos=1)
    assert sub.get().topic == f"{uid}/room1/temp"
    sub.unsubscribe(f"{uid}/+/temp")
    pub.publish(f"{uid}/room2/temp", b"22.0", qos=1)
    pub.publish(f"{uid}/marker", b"M", qos=1)
    assert sub.get().topic == f"{uid}/marker"


def test_paho_retained(srv, paho, uid):
    pub = paho(srv.port, client_id=f"{uid}-p")
    pub.publish(f"{uid}/status", b"online", qos=1, retain=True)
    sub = paho(srv.port, client_id=f"{uid}-s")
    sub.subscribe(f"{uid}/status", 1)
    msg = sub.get()
    assert (msg.payload, msg.retain) == (b"online", True)


def test_paho_persistent_session(srv, paho, uid):
    cid = f"{uid}-persist"
    sub = paho(srv.port, client_id=cid, clean_session=False)
    assert sub.session_present is False
    sub.subscribe(f"{uid}/t", 1)
    sub.disconnect()
    pub = paho(srv.port, client_id=f"{uid}-p")
    for i in range(3):
        pub.publish(f"{uid}/t", f"offline {i}", qos=1)
    sub = paho(srv.port, client_id=cid, clean_session=False)
    assert sub.session_present is True
    assert [sub.get().payload for _ in range(3)] == [b"offline 0", b"offline 1", b"offline 2"]
    sub.disconnect()
    paho(srv.port, client_id=cid, clean_session=True).disconnect()


def test_paho_will_on_takeover(srv, paho, uid):
    w = paho(srv.port, client_id=f"{uid}-w")
    w.subscribe(f"{uid}/will", 1)
    victim = paho(srv.port, client_id=f"{uid}-v", will=(f"{uid}/will", b"victim gone", 1))
    victim.c.reconnect_delay_set(60, 120)  # do not fight for the id after being kicked out
    taker = srv.client(f"{uid}-v")
    msg = w.get()
    assert (msg.topic, msg.payload) == (f"{uid}/will", b"victim gone")
    assert victim.disconnected.wait(5)
    assert taker.ping() == []


def test_paho_many_messages_in_order(srv, paho, uid):
    sub = paho(srv.port, client_id=f"{uid}-s")
    sub.subscribe(f"{uid}/t", 1)
    pub = paho(srv.port, client_id=f"{uid}-p")
    infos = [pub.c.publish(f"{uid}/t", str(i), qos=1) for i in range(300)]
    for info in infos:
        info.wait_for_publish(10)
    assert [int(sub.get().payload) for _ in range(300)] == list(range(300))


def test_paho_and_raw_client_interoperate(srv, paho, uid):
    sub = paho(srv.port, client_id=f"{uid}-s")
    sub.subscribe(f"{uid}/t", 2)
    raw = srv.client(f"{uid}-raw")
    raw.publish(f"{uid}/t", b"raw to paho", qos=2)
    assert sub.get().payload == b"raw to paho"
    raw.subscribe(f"{uid}/back", qos=2)
    sub.publish(f"{uid}/back", b"paho to raw", qos=2)
    p = raw.recv_publish()
    assert (p.payload, p.qos) == (b"paho to raw", 2)


# ---------------------------------------------------------------------------------------------
# mosquitto_pub / mosquitto_sub
# ---------------------------------------------------------------------------------------------

def started_sub(mosq, port, *args):
    """mosquitto_sub with -d, returned once its SUBACK arrived."""
    p = mosq("sub", port, "-d", *args)
    p.wait_line(lambda ln: "received SUBACK" in ln)
    return p


def test_mosquitto_quickstart(srv, mosq, uid):
    """The README quickstart: mosquitto_sub -t '#' -v / mosquitto_pub -t a/b -m hi -q 2."""
    sub = started_sub(mosq, srv.port, "-t", f"{uid}/#", "-v", "-C", "1", "-W", "10")
    pub = mosq("pub", srv.port, "-t", f"{uid}/a/b", "-m", "hi", "-q", "2")
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0, sub.out.text()
    assert f"{uid}/a/b hi" in sub.lines


@pytest.mark.parametrize("qos", ["0", "1", "2"])
def test_mosquitto_pub_sub_qos(srv, mosq, uid, qos):
    sub = started_sub(mosq, srv.port, "-t", f"{uid}/t", "-q", qos, "-v", "-C", "1", "-W", "10")
    pub = mosq("pub", srv.port, "-t", f"{uid}/t", "-m", f"qos{qos}", "-q", qos)
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0, sub.out.text()
    assert f"{uid}/t qos{qos}" in sub.lines


def test_mosquitto_retained(srv, mosq, uid):
    pub = mosq("pub", srv.port, "-t", f"{uid}/r", "-m", "kept", "-r", "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    sub = mosq("sub", srv.port, "-t", f"{uid}/r", "-v", "-C", "1", "-W", "10", "--retained-only")
    assert sub.wait() == 0, sub.out.text()
    assert sub.lines == [f"{uid}/r kept"]


def test_mosquitto_mqtt31(srv, mosq, uid):
    sub = started_sub(mosq, srv.port, "-V", "mqttv31", "-i", f"{uid}s"[:23], "-t", f"{uid}/t", "-q", "1",
                      "-C", "1", "-W", "10")
    pub = mosq("pub", srv.port, "-V", "mqttv31", "-i", f"{uid}p"[:23], "-t", f"{uid}/t", "-m", "v31", "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0, sub.out.text()
    assert "v31" in sub.lines


def test_mosquitto_lines_from_stdin(srv, mosq, uid):
    sub = started_sub(mosq, srv.port, "-t", f"{uid}/t", "-q", "1", "-C", "3", "-W", "10")
    pub = mosq("pub", srv.port, "-t", f"{uid}/t", "-q", "1", "-l", stdin_data="one\ntwo\nthree\n")
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0, sub.out.text()
    assert [ln for ln in sub.lines if ln in ("one", "two", "three")] == ["one", "two", "three"]


def test_mosquitto_large_payload_from_file(srv, mosq, uid, tmp_path):
    data = ("0123456789abcdef" * 8192)[:100_000]
    f = tmp_path / "payload.txt"
    f.write_text(data)
    sub = started_sub(mosq, srv.port, "-t", f"{uid}/big", "-q", "2", "-C", "1", "-W", "10", "-N")
    pub = mosq("pub", srv.port, "-t", f"{uid}/big", "-q", "2", "-f", str(f))
    assert pub.wait() == 0, pub.out.text()
    assert sub.wait() == 0
    assert data in sub.out.text()


def test_mosquitto_persistent_session(srv, mosq, uid):
    cid = f"{uid}-persist"
    first = mosq("sub", srv.port, "-c", "-i", cid, "-t", f"{uid}/t", "-q", "1", "-E")
    assert first.wait() == 0, first.out.text()
    pub = mosq("pub", srv.port, "-t", f"{uid}/t", "-m", "while offline", "-q", "1")
    assert pub.wait() == 0, pub.out.text()
    again = mosq("sub", srv.port, "-c", "-i", cid, "-t", f"{uid}/t", "-q", "1", "-C", "1", "-W", "10")
    assert again.wait() == 0, again.out.text()
    assert "while offline" in again.lines
    srv.client(cid, clean=True).disconnect()


def test_mosquitto_will_on_kill(srv, mosq, uid):
    w = srv.client(f"{uid}-w")
    w.subscribe(f"{uid}/will", qos=1)
    victim = started_sub(mosq, srv.port, "-t", f"{uid}/x", "--will-topic", f"{uid}/will",
                         "--will-payload", "killed", "--will-qos", "1")
    victim.kill()
    p = w.recv_publish()
    assert (p.topic, p.payload) == (f"{uid}/will", b"killed")


def test_mosquitto_sub_hash_sees_no_sys(broker, mosq, uid):
    """`mosquitto_sub -t '#' -v` must not print $SYS topics."""
    b = broker(sys_interval=1)
    sub = started_sub(mosq, b.port, "-t", "#", "-v", "-C", "1", "-W", "10")
    watcher = b.client(f"{uid}-sys")
    watcher.subscribe("$SYS/broker/uptime")
    while watcher.recv_publish(timeout=5).retain:
        pass  # wait for a live $SYS publication, i.e. one made after '#' was subscribed
    pub = mosq("pub", b.port, "-t", f"{uid}/marker", "-m", "MARKER")
    assert pub.wait() == 0
    assert sub.wait() == 0, sub.out.text()
    printed = [ln for ln in sub.lines if not ln.startswith("Client ") and not ln.startswith("Subscribed")]
    assert printed == [f"{uid}/marker MARKER"], sub.out.text()
