"""`coalesce_ms`: the loop holds the log write and the sends of messages from slow publishers
for up to coalesce_ms to gather more, but never an answer a client waits for
(docs/persistence.md).

The broker's own count of log writes (`inspect stats`, section "log") shows the gathering; the
waits are measured against a coalesce_ms far above a loopback round trip, and only the median
of several is compared where the bound is an upper one.
"""

import selectors
import signal
import socket
import statistics
import threading
import time

import mqttraw as m
from conftest import toml_dumps
from mqttraw import CONNACK, PINGRESP, PUBACK, SUBACK

COALESCE_MS = 50
# A connection that sent nothing for longer than this counts as a slow publisher.
SLOW_GAP = 20 * COALESCE_MS / 1000 + 0.1
DEVICES = 12


def _writes(b) -> int:
    return b.stats()["log"]["writes"]


def _devices(b, uid, n=DEVICES):
    return [b.client(f"{uid}-d{i}") for i in range(n)]


def _publish_once_each(devices, uid) -> list[float]:
    """Every device publishes one QoS 1 message, back to back; seconds until each PUBACK."""
    sent = []
    for i, d in enumerate(devices):
        d.send(m.publish(f"{uid}/d{i}", b"reading %d" % i, qos=1, packet_id=7))
        sent.append(time.monotonic())
    waits = []
    for d, t in zip(devices, sent):
        ack = d.expect(PUBACK)
        assert ack.packet_id == 7
        waits.append(time.monotonic() - t)
    return waits


def test_slow_publishers_are_answered_and_written_together(broker, uid):
    b = broker(coalesce_ms=COALESCE_MS)
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/+", qos=1)
    devices = _devices(b, uid)
    time.sleep(SLOW_GAP)  # the devices' previous packet (CONNECT) is now long ago
    before = _writes(b)
    waits = _publish_once_each(devices, uid)
    # The first message opened a batch that the others joined: one write (two if the test was
    # descheduled for coalesce_ms in the middle), and the first PUBACK waited for the batch.
    assert _writes(b) - before <= 2
    assert waits[0] >= 0.8 * COALESCE_MS / 1000, waits
    got = sorted(sub.recv_publish().payload for _ in devices)
    assert got == sorted(b"reading %d" % i for i in range(DEVICES))


def test_answers_a_client_waits_for_are_not_held(broker, uid):
    b = broker(coalesce_ms=COALESCE_MS)
    limit = COALESCE_MS / 1000 / 2

    def timed(c, packet, want) -> float:
        t = time.monotonic()
        c.send(packet)
        c.expect(want)
        return time.monotonic() - t

    clients = [b.raw() for _ in range(5)]
    connects = [timed(c, m.connect(f"{uid}-c{i}"), CONNACK) for i, c in enumerate(clients)]
    time.sleep(SLOW_GAP)  # idle: only the kind of packet makes these prompt
    subscribes = [timed(c, m.subscribe(1, [(f"{uid}/x", 1)]), SUBACK) for c in clients]
    time.sleep(SLOW_GAP)
    pings = [timed(c, m.pingreq(), PINGRESP) for c in clients]
    # A publisher that waits for each PUBACK before the next (its previous packet came
    # moments ago) is answered in the pass that read it.
    pub = clients[0]
    publishes = []
    for i in range(20):
        t = time.monotonic()
        pub.publish(f"{uid}/x", b"%d" % i, qos=1)
        publishes.append(time.monotonic() - t)
    for name, waits in [("CONNACK", connects), ("SUBACK", subscribes), ("PINGRESP", pings),
                        ("PUBACK", publishes)]:
        assert statistics.median(waits) < limit, (name, waits)


def test_reload_turns_coalescing_off(broker, uid):
    b = broker(coalesce_ms=COALESCE_MS)
    devices = _devices(b, uid, 5)
    time.sleep(SLOW_GAP)
    held = _publish_once_each(devices, uid)
    assert held[0] >= 0.8 * COALESCE_MS / 1000, held
    cfg = dict(b.config)
    cfg["coalesce_ms"] = 0
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log(lambda ln: "reload" in ln.lower(), timeout=5, start=mark)
    time.sleep(SLOW_GAP)
    waits = _publish_once_each(devices, uid)
    assert statistics.median(waits) < COALESCE_MS / 1000 / 2, waits


def test_acknowledgements_an_fsync_releases_are_not_held(broker, uid):
    # durability = "sync": a PUBACK goes out when the flusher thread's fsync covers the
    # message, in a pass that reads nothing from the publisher; it waits for the disk only.
    b = broker(coalesce_ms=100, log={"durability": "sync"})
    pub = b.client(f"{uid}-p")
    waits = []
    for i in range(20):
        t = time.monotonic()
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
        waits.append(time.monotonic() - t)
    assert statistics.median(waits) < 0.05, waits


def test_a_queue_drains_without_coalescing_delays(broker, uid):
    # A returning QoS 1 subscriber gets its queue in windows of max_inflight_messages (20): each
    # window goes out in the pass that reads the acknowledgements freeing it. Held for
    # coalesce_ms each, 400 messages would take 20 windows x 100 ms.
    b = broker(coalesce_ms=100)
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=1)
    sub.send(m.disconnect())
    assert sub.expect_closed()
    pub = b.client(f"{uid}-p")
    for i in range(400):
        pub.publish(f"{uid}/t", b"%d" % i, qos=1)
    t = time.monotonic()
    sub = b.client(f"{uid}-s", clean=False)
    got = [sub.recv_publish().payload for _ in range(400)]
    took = time.monotonic() - t
    assert got == [b"%d" % i for i in range(400)]
    assert took < 1.0, took


def test_qos2_handshakes_are_not_held(broker, uid):
    # Both directions of the QoS 2 exchange answer a client that waits: PUBCOMP to the
    # publisher's PUBREL, PUBREL to the subscriber's PUBREC.
    b = broker(coalesce_ms=100)
    sub = b.client(f"{uid}-s")
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p")
    time.sleep(20 * 0.1 + 0.1)  # both idle: only the kind of packet makes the answers prompt
    pub.send(m.publish(f"{uid}/t", b"once", qos=2, packet_id=9))
    assert pub.expect(m.PUBREC).packet_id == 9
    t = time.monotonic()
    pub.send(m.pubrel(9))
    assert pub.expect(m.PUBCOMP).packet_id == 9
    pubcomp = time.monotonic() - t
    p = sub.expect(m.PUBLISH)
    assert p.payload == b"once"
    t = time.monotonic()
    sub.send(m.pubrec(p.packet_id))
    assert sub.expect(m.PUBREL).packet_id == p.packet_id
    pubrel = time.monotonic() - t
    sub.send(m.pubcomp(p.packet_id))
    assert max(pubcomp, pubrel) < 0.05, (pubcomp, pubrel)


def test_the_end_of_a_connection_is_not_held(broker, uid):
    # A connection the broker ends (here: a protocol violation, and an HTTP request on the MQTT
    # port, whose 400 reply goes first) is closed in the pass that decided it.
    b = broker(coalesce_ms=100)
    clients = [b.client(f"{uid}-c{i}") for i in range(5)]
    time.sleep(20 * 0.1 + 0.1)  # idle: only the kind of event makes the close prompt
    waits = []
    for c in clients:
        t = time.monotonic()
        c.send(m.connect(f"{uid}-again"))  # a second CONNECT
        assert c.expect_closed()
        waits.append(time.monotonic() - t)
    http = []
    for _ in range(5):
        r = b.raw()
        t = time.monotonic()
        r.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = r.read_until_closed()
        http.append(time.monotonic() - t)
        assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert statistics.median(waits) < 0.05, waits
    assert statistics.median(http) < 0.05, http


def test_a_held_pass_waits_no_longer_than_the_next_timer(broker, uid):
    # While slow publishers keep the loop holding its output for coalesce_ms (100 ms) at a
    # time, with nothing else arriving, a timer that falls due inside a hold fires on time,
    # not at the hold's end: here the connect timeout (0.5 s) of connections that never send
    # CONNECT. Held to the hold's end, a timer would be up to 100 ms late.
    timeout = 0.5
    b = broker(coalesce_ms=100, limits={"connect_timeout": timeout})
    devices = _devices(b, uid, 60)
    time.sleep(SLOW_GAP)  # each device's next PUBLISH comes from a slow publisher
    stop = threading.Event()

    def publish_round_robin():
        # One device every 110 ms (each device every 6.6 s: slow): each message starts a
        # hold that ends, with nothing else arriving, just before the next message.
        i = 0
        while not stop.wait(0.11):
            devices[i % len(devices)].send(m.publish(f"{uid}/d", b"x"))
            i += 1

    feeder = threading.Thread(target=publish_round_robin)
    feeder.start()
    try:
        time.sleep(0.3)
        # Opened 113 ms apart, so that each timeout falls in a hold of its own (a close
        # ends the hold it falls in) and at another point of it.
        opened = {}
        late = []
        sel = selectors.DefaultSelector()
        deadline = time.monotonic() + 10
        while len(late) < 12 and time.monotonic() < deadline:
            if len(opened) < 12 and time.monotonic() >= 0.113 * len(opened) + min(
                    opened.values(), default=0.0):
                s = socket.create_connection(("127.0.0.1", b.port))
                opened[s] = time.monotonic()
                sel.register(s, selectors.EVENT_READ)
            for key, _ in sel.select(0.005):
                if key.fileobj.recv(1) == b"":
                    late.append(time.monotonic() - opened[key.fileobj] - timeout)
                    sel.unregister(key.fileobj)
        for s in opened:
            s.close()
    finally:
        stop.set()
        feeder.join()
    assert len(late) == 12, late
    assert statistics.median(late) < 0.02, sorted(late)
