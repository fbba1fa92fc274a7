"""A flood next to a normal pair (issue 4): firmware reconnecting in a tight loop and a device
publishing to a new topic with every message. The pair receives everything, the broker's RSS
stays bounded, and the limits' counters show the flood. Every loop is bounded in count and
time."""

import socket
import threading
import time

import psutil

import mqttraw as m

RECONNECTS = 3000
FLOOD_TOPICS = 50_000
CHUNK = 1000
NORMAL_MAX = 20_000
TIME_LIMIT = 2.0
RATE, BURST = 200, 50


def reconnect_loop(host, port, uid, done: dict) -> None:
    """CONNECT, CONNACK, close, again: as many times as allowed within the bounds."""
    connect = m.connect(f"{uid}-loop", keepalive=0)
    t0 = time.monotonic()
    n = 0
    while n < RECONNECTS and time.monotonic() - t0 < TIME_LIMIT:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(connect)
            ack = s.recv(4)
            assert ack == b"\x20\x02\x00\x00", ack
        n += 1
    done["reconnects"], done["seconds"] = n, time.monotonic() - t0


def topic_flood(client, uid, running: threading.Event, done: dict) -> None:
    """A new topic per message, in chunks, while the reconnect loop runs."""
    sent = 0
    while sent < FLOOD_TOPICS and running.is_set():
        client.send(b"".join(m.publish(f"{uid}/dev/{i}", b"v") for i in range(sent, sent + CHUNK)))
        sent += CHUNK
    done["topics"] = sent


def test_reconnect_and_topic_flood_next_to_a_normal_pair(broker, uid, paho):
    b = broker(limits={"max_connection_rate": RATE, "connection_burst": BURST,
                       "max_topics_per_client": 100})
    proc = psutil.Process(b.proc.pid)
    sub = paho(b.port, client_id=f"{uid}-sub")
    sub.subscribe(f"{uid}/normal", qos=1)
    pub = b.client(f"{uid}-pub")
    flooder = b.client(f"{uid}-flood")
    rss0 = proc.memory_info().rss

    done, running = {}, threading.Event()
    running.set()
    looper = threading.Thread(target=reconnect_loop, args=(b.host, b.port, uid, done))
    flood = threading.Thread(target=topic_flood, args=(flooder, uid, running, done))
    looper.start()
    flood.start()
    sent = 0
    try:
        t0 = time.monotonic()
        while looper.is_alive() and sent < NORMAL_MAX:  # the pair talks during the whole flood
            pub.publish(f"{uid}/normal", b"%d" % sent, qos=1)
            sent += 1
        normal_time = time.monotonic() - t0
        got = [int(sub.get(timeout=5).payload) for _ in range(sent)]
    finally:
        running.clear()
        looper.join(TIME_LIMIT + 10)
        flood.join(10)
    assert not looper.is_alive() and not flood.is_alive()
    assert flooder.ping(timeout=10) == []
    assert got == list(range(sent)), "the normal pair lost or reordered messages"
    assert sub.messages.empty()

    s = b.stats()
    grew = proc.memory_info().rss - rss0
    print(f"\nflood: {done['reconnects']} reconnects in {done['seconds']:.2f} s, {done['topics']} "
          f"new topics; normal pair {sent} QoS 1 messages in {normal_time:.2f} s; RSS "
          f"+{grew / 2**20:.1f} MiB; limit hits "
          f"{{{', '.join(f'{k}: {v}' for k, v in s['limit_hits'].items() if v)}}}")
    # The reconnect loop got what the rate allows, no more (first ones from the burst).
    allowed = BURST + RATE * done["seconds"]
    assert 0.5 * allowed <= done["reconnects"] <= allowed + 20, (done, allowed)
    assert s["limit_hits"]["max_connection_rate"] >= 1
    assert s["dropped"]["max_topics_per_client"] == done["topics"] - 100
    assert s["topics"] == 101                      # 100 device topics + the normal one
    assert grew < 16 * 2 ** 20
    assert b.client_row(f"{uid}-flood")["topics_created"] == 100
