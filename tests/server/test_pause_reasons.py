"""Reading a connection is paused for independent reasons (password check, publish rate, commit
log): one holder resuming never lets the socket be read while another still holds it."""

import selectors
import socket

import pytest

import mqttraw as m
from edgebroker import config
from edgebroker.core.broker import Broker
from edgebroker.server.transport import Transport

READ = selectors.EVENT_READ


class FakeLoop:
    """What a Transport needs from the server loop, around a real selector."""

    def __init__(self, broker=None):
        self.selector = selectors.DefaultSelector()
        self.dirty = []
        self.broker = broker

    def forget(self, transport):
        try:
            self.selector.unregister(transport.sock)
        except (KeyError, ValueError):
            pass


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def watched(loop, transport) -> int:
    """Whether the selector really watches the transport's socket for input (READ or 0)."""
    try:
        return loop.selector.get_key(transport.sock).events & READ
    except KeyError:
        return 0


def test_reasons_are_independent(pair):
    loop = FakeLoop()
    t = Transport(loop, pair[0], "peer")
    loop.selector.register(t.sock, READ, t)
    t.pause_reading("rate")
    assert not t.reading and watched(loop, t) == 0
    t.pause_reading("log")
    t.pause_reading("log")                 # idempotent
    t.resume_reading("rate")
    assert not t.reading and watched(loop, t) == 0, "resumed while the log still holds it"
    t.resume_reading("rate")               # resuming a reason not held changes nothing
    assert not t.reading
    t.resume_reading("log")
    assert t.reading and watched(loop, t) == READ
    for first, second in (("auth", "log"), ("log", "rate"), ("auth", "rate")):
        t.pause_reading(first)
        t.pause_reading(second)
        t.resume_reading(first)
        assert not t.reading, (first, second)
        t.resume_reading(second)
        assert t.reading and watched(loop, t) == READ
    with pytest.raises(KeyError):
        t.pause_reading("no such reason")


def test_throttle_timer_does_not_resume_a_client_paused_for_the_log(pair):
    now = [100.0]
    cfg = config.from_dict({"limits": {"messages_rate": 10, "messages_burst": 1}})
    broker = Broker(cfg, lambda: now[0])
    loop = FakeLoop(broker)
    t = Transport(loop, pair[0], "peer")
    loop.selector.register(t.sock, READ, t)
    client = t.client = broker.connection_made(t)
    client.data_received(m.connect("c1"))
    assert client.connected and client.rate is not None
    client.data_received(m.publish("t", b"1"))
    assert client.throttled_until and not t.reading   # over its rate: paused for "rate"
    t.pause_reading("log")                            # as Journal.pause does on a full disk
    now[0] = client.throttled_until + 0.001
    broker.tick(now[0])                               # the throttle ends ...
    assert not client.throttled_until
    assert not t.reading and watched(loop, t) == 0    # ... but the log still holds the socket
    t.resume_reading("log")                           # as Journal.retry does once writes work
    assert t.reading and watched(loop, t) == READ


def test_log_recovery_does_not_resume_a_throttled_client(pair):
    now = [100.0]
    cfg = config.from_dict({"limits": {"messages_rate": 10, "messages_burst": 1}})
    broker = Broker(cfg, lambda: now[0])
    loop = FakeLoop(broker)
    t = Transport(loop, pair[0], "peer")
    loop.selector.register(t.sock, READ, t)
    client = t.client = broker.connection_made(t)
    client.data_received(m.connect("c1"))
    t.pause_reading("log")
    client.data_received(m.publish("t", b"1"))
    assert client.throttled_until
    t.resume_reading("log")
    assert not t.reading and watched(loop, t) == 0    # still throttled
    now[0] = client.throttled_until + 0.001
    broker.tick(now[0])
    assert t.reading and watched(loop, t) == READ
