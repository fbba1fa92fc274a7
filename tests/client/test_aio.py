"""The asyncio adapter (client/aio.py) against the real broker: QoS 0/1/2 both ways with a
future per request; every transport (mqtt://, ws://, mqtts://, unix), connected without a
thread, and a silent server's handshake timing out without blocking the loop; the link cut by the
broker's stop and restart with every QoS 1 message arriving; back-pressure (publish waits at
max_queued; reading pauses at max_messages); a refusal; the reconnect policy "never"."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

import mqttraw as m
from certs import make_pki
from conftest import _start, _teardown

from edgebroker.client.aio import AsyncClient, ClientClosed, ConnectError
from edgebroker.client.events import Connected, Disconnected, Message

TCP, WS, TLS = range(3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def asrv(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("aio")
    b = _start(d, {"listener": [
        {"host": "127.0.0.1", "port": 0},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets"},
        {"host": "127.0.0.1", "port": 0, "certfile": str(pki.server.cert),
         "keyfile": str(pki.server.key)},
        {"unix_socket": str(d / "mqtt.sock")},
    ]})
    yield b
    _teardown([b])


def run(coro, timeout=20):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def url(b, i, scheme="mqtt"):
    return f"{scheme}://127.0.0.1:{b.listeners[i][1]}"


async def next_message(client) -> Message:
    async for event in client:
        if isinstance(event, Message):
            return event
    raise AssertionError("the client ended without a message")


@pytest.mark.parametrize("protocol", [4, 5])
def test_publish_and_receive_at_every_qos(asrv, uid, protocol):
    raw = asrv.client(f"{uid}-raw")
    raw.subscribe(f"{uid}/out/#", qos=2)

    async def main():
        async with AsyncClient(url(asrv, TCP), f"{uid}-a", protocol=protocol) as c:
            sub = await c.subscribe([(f"{uid}/in/#", 2)])
            assert sub.granted == [2]
            for qos in (0, 1, 2):
                ack = await c.publish(f"{uid}/out/{qos}", f"q{qos}".encode(), qos=qos)
                assert ack.reason_code == 0 and ack.request.qos == qos
            for qos in (0, 1, 2):
                raw.publish(f"{uid}/in/{qos}", f"r{qos}".encode(), qos=qos)
                got = await next_message(c)
                assert (got.topic, got.payload, got.qos) == (f"{uid}/in/{qos}",
                                                              f"r{qos}".encode(), qos)

    run(main())
    got = sorted((p.topic, p.payload) for p in (raw.recv_publish() for _ in range(3)))
    assert got == [(f"{uid}/out/{q}", f"q{q}".encode()) for q in (0, 1, 2)]


@pytest.mark.parametrize("where", ["ws", "mqtts", "unix"])
def test_every_transport(asrv, pki, uid, where):
    address = {"ws": url(asrv, WS, "ws"), "mqtts": url(asrv, TLS, "mqtts"),
               "unix": f"unix:{asrv.unix_paths[0]}"}[where]

    async def main():
        threads = threading.active_count()
        async with AsyncClient(address, f"{uid}-{where}",
                               tls={"cafile": str(pki.ca.cert)}) as c:
            # connected (TCP, TLS handshake, WebSocket upgrade) on the loop: no thread
            assert threading.active_count() == threads
            await c.subscribe([(f"{uid}/t", 1)])
            handles = [c.publish_nowait(f"{uid}/t", b"%d" % i, qos=1) for i in range(50)]
            acks = await asyncio.gather(*handles)
            assert [a.request.payload for a in acks] == [b"%d" % i for i in range(50)]
            got = [(await next_message(c)).payload for _ in range(50)]
            assert got == [b"%d" % i for i in range(50)]

    run(main())


@pytest.mark.parametrize("scheme, step", [("ws", "WebSocket upgrade on"),
                                          ("mqtts", "TLS handshake with")])
def test_a_silent_server_times_out_without_blocking_the_loop(scheme, step):
    """A server that accepts and says nothing: the handshake fails at the timeout with the
    step named, and the event loop ran other tasks meanwhile."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        async def main():
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.ensure_future(ticker())
            with pytest.raises(ConnectError, match=f"{step} 127.0.0.1:{port}.*no answer"):
                await AsyncClient(f"{scheme}://127.0.0.1:{port}", reconnect="never",
                                  timeout=0.3).connect()
            task.cancel()
            assert ticks >= 10

        run(main())


def test_the_connack_wait_is_connack_timeout_and_its_error_says_so():
    """A server that accepts and never answers: ``connect()`` fails after ``connack_timeout``
    (not the 30 s default; ``timeout``, the dial's bound, does not cut it shorter) with
    "no CONNACK within N s", not "connection refused". ``connect_timeout=`` (which wait?) is
    refused with a TypeError naming both."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"mqtt://127.0.0.1:{server.getsockname()[1]}"

        async def main():
            loop = asyncio.get_running_loop()
            c = AsyncClient(url, reconnect="never", timeout=0.2, connack_timeout=0.6)
            start = loop.time()
            with pytest.raises(ConnectError) as info:
                await asyncio.wait_for(c.connect(), 10)
            assert 0.6 <= loop.time() - start < 5
            assert (str(info.value), info.value.reason_code) == ("no CONNACK within 0.6 s", None)
            await c.close()

        run(main())
    with pytest.raises(TypeError, match=r"timeout= \(making the connection\) and "
                                        r"connack_timeout= \(the wait for the CONNACK\)"):
        AsyncClient("mqtt://127.0.0.1:1", connect_timeout=1)


def test_refused_connection_raises_with_the_reason_code(broker, uid, tmp_path):
    from secfiles import write_passwords
    b = broker(password_file=str(write_passwords(tmp_path / "pw", {"alice": "secret"})))

    async def main():
        with pytest.raises(ConnectError) as info:
            await AsyncClient(url(b, 0), f"{uid}-x", username="alice",
                              password="wrong").connect()
        assert info.value.reason_code == 4
        async with AsyncClient(url(b, 0), f"{uid}-y", username="alice",
                               password="secret") as c:
            assert (await c.publish(f"{uid}/t", b"ok", qos=1)).reason_code == 0

    run(main())


def test_no_server_and_policy_never_fails_at_once(uid):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # bound, not listening: refused

    async def main():
        with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
            await AsyncClient(f"mqtt://127.0.0.1:{port}", uid, reconnect="never").connect()

    run(main())


def test_the_default_back_off_is_the_event_loops():
    """docs/client.md, "Reconnection": attempts wait up to 0.5 s doubling to 30 s, and the
    asyncio client does the same (its default was 0.1 s)."""
    from edgebroker.client.loop import EventLoop
    lp = EventLoop("127.0.0.1", 1, client_id="backoff")
    try:
        assert (lp.backoff.base, lp.backoff.cap) == (0.5, 30.0)
    finally:
        lp.close()
    c = AsyncClient("mqtt://127.0.0.1:1", "backoff")
    assert (c.backoff.base, c.backoff.cap) == (0.5, 30.0)


def test_broker_restart_loses_no_qos1_message(broker, uid):
    """Publishing goes on while the broker stops and starts again on the same port: every
    QoS 1 publish is answered, and the subscriber (persistent session) gets them all."""
    b = broker()
    port = b.port
    raw = b.client(f"{uid}-sub", clean=False)
    raw.subscribe(f"{uid}/t", qos=1)
    raw.close()
    n = 200
    restarted = []

    async def watch(c, events):
        async for event in c:
            events.append(event)

    async def main():
        loop = asyncio.get_running_loop()
        c = AsyncClient(f"mqtt://127.0.0.1:{port}", f"{uid}-pub", clean_start=False,
                        backoff=(0.05, 0.5), keepalive=5)
        await c.connect()
        events = []
        watcher = asyncio.ensure_future(watch(c, events))
        handles = [c.publish_nowait(f"{uid}/t", b"%d" % i, qos=1) for i in range(n // 2)]
        await asyncio.gather(*handles[:10])
        await loop.run_in_executor(None, b.stop)
        handles += [c.publish_nowait(f"{uid}/t", b"%d" % i, qos=1) for i in range(n // 2, n)]
        # back on the same port and state directory
        restarted.append(await loop.run_in_executor(None, lambda: broker(
            listener=[{"host": "127.0.0.1", "port": port}], data_dir=b.config["data_dir"])))
        acks = await asyncio.gather(*handles)
        assert all(a.reason_code == 0 for a in acks)
        await c.disconnect()
        await watcher
        return events

    kinds = [type(e) for e in run(main(), 40)]
    assert kinds[:2] == [Connected, Disconnected] and kinds.count(Connected) >= 2, kinds
    sub = restarted[0].client(f"{uid}-sub", clean=False)
    got = set()
    while len(got) < n:
        got.add(int(sub.recv_publish(timeout=10).payload))
    assert got == set(range(n))


def test_publish_waits_at_max_queued(asrv, uid):
    async def main():
        async with AsyncClient(url(asrv, TCP), f"{uid}-q", max_inflight=1,
                               max_queued=5) as c:
            tasks = [asyncio.ensure_future(c.publish(f"{uid}/t", b"x", qos=1))
                     for _ in range(50)]
            high = 0
            while not all(t.done() for t in tasks):
                high = max(high, c.connection.queued)
                await asyncio.sleep(0)
            assert high <= 5
            assert all(t.result().reason_code == 0 for t in tasks)

    run(main())


@pytest.mark.parametrize("bound", [{"max_messages": 10},
                                   {"max_message_bytes": 10 * 4100}])
def test_reading_pauses_while_messages_wait_unread(asrv, uid, bound):
    """With max_messages 10 (or max_message_bytes of about 10 of these messages), the client
    stops reading once 10 wait unread (a read of 256 KiB may bring up to 64 more of these
    4 KiB messages); the rest wait in the broker, and all come, in order, once the consumer
    reads."""
    n, size = 300, 4096

    async def main():
        async with AsyncClient(url(asrv, TCP), f"{uid}-slow", **bound) as c:
            await c.subscribe([(f"{uid}/t", 1)])
            pub = asrv.client(f"{uid}-p")
            for i in range(n):
                pub.send(m.publish(f"{uid}/t", b"%d " % i + bytes(size), qos=1,
                                   packet_id=i % 65535 + 1))
            deadline = asyncio.get_running_loop().time() + 10
            while c._reading and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert not c._reading
            assert 10 <= c._messages <= 10 + 65
            got = [int((await next_message(c)).payload.split()[0]) for _ in range(n)]
            assert got == list(range(n))

    run(main())


async def until(pred, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_answers_are_read_while_messages_wait_unread(mosquitto_broker, uid):
    """Publishing to a topic the client subscribes to, awaiting each acknowledgement before
    reading any message, with max_messages 5: the socket is read on while an answer is
    awaited, so all 10 publishes are acknowledged (the acknowledgement came behind the
    unread messages: reading paused there and the client hung). Once nothing is awaited
    reading pauses; the keepalive (1 s) goes on while paused, its PINGRESPs read (no false
    PingTimeout, the server does not drop us); after the server's restart the new
    connection reads its CONNACK and pauses again. The messages then all come, in order."""
    mq = mosquitto_broker(extra=["max_inflight_messages 0", "max_queued_messages 0"])
    topic = f"{uid}/t"

    async def main():
        c = AsyncClient(f"mqtt://127.0.0.1:{mq.port}", uid, keepalive=1, max_messages=5,
                        reconnect="always", backoff=(0.05, 0.5), clean_start=False)
        await c.connect()
        await c.subscribe([(topic, 1)])
        for i in range(10):
            ack = await asyncio.wait_for(c.publish(topic, b"%d" % i, qos=1), 5)
            assert ack.reason_code == 0
        await until(lambda: c._messages == 10)
        await until(lambda: not c._reading)         # nothing awaited: paused
        # Three keepalives while paused (a time, not a condition: that nothing goes wrong).
        await asyncio.sleep(3.5)
        assert c.connection.state == "connected" and not c._reading
        assert [type(e).__name__ for e in c._events].count("Message") == 10
        assert not [e for e in c._events if not isinstance(e, (Connected, Message))]
        mq.stop()
        mq.start()
        await until(lambda: sum(isinstance(e, Connected) for e in c._events) == 2)
        await until(lambda: not c._reading)         # CONNACK read, then paused again
        assert c._messages == 10
        got = [(await next_message(c)).payload for _ in range(10)]
        assert got == [b"%d" % i for i in range(10)]
        ack = await asyncio.wait_for(c.publish(topic, b"after", qos=1), 5)
        assert ack.reason_code == 0 and (await next_message(c)).payload == b"after"
        await c.close()

    run(main(), timeout=40)


def test_protocol_error_sends_the_5_disconnect_before_closing(uid):
    """A server that breaks the protocol (a second CONNACK) gets the 5.0 DISCONNECT with the
    reason code (Protocol Error) before the client closes, as from the synchronous loop."""
    import mqttraw5 as m5

    async def main():
        got = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            await reader.read(4096)                      # CONNECT
            writer.write(m5.connack5() + m5.connack5())
            await writer.drain()
            data = b""
            while chunk := await reader.read(4096):      # until the client closes
                data += chunk
            got.set_result(data)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = AsyncClient(f"mqtt://127.0.0.1:{port}", uid, protocol=5, reconnect="never")
        await c.connect()
        data = await asyncio.wait_for(got, 10)
        frames = m5.split_frames5(bytearray(data))
        assert [(p.type, p.reason) for p in frames] == [(m.DISCONNECT, 0x82)]
        event = await c.__anext__()
        while isinstance(event, Connected):
            event = await c.__anext__()
        assert isinstance(event, Disconnected) and event.reason_code == 0x82
        await c.close()
        server.close()

    run(main())


def test_close_fails_open_requests(asrv, uid):
    async def main():
        c = AsyncClient(url(asrv, TCP), f"{uid}-c")
        await c.connect()
        await c.subscribe([(f"{uid}/never", 1)])
        c.connection.max_inflight = 1
        fut = c.publish_nowait(f"{uid}/t", b"x", qos=1)
        await c.close()
        with pytest.raises(ClientClosed):
            await fut
        with pytest.raises(ClientClosed):
            c.publish_nowait(f"{uid}/t", b"y")
        assert [type(e) async for e in c] == [Connected]     # what came, then the end

    run(main())


def test_subscriptions_made_again_are_events_and_messages_flow(mosquitto_broker, uid):
    """Mosquitto without persistence forgets the session when it restarts: the client
    subscribes again by itself, the answer is a Subscribed event (token RESUBSCRIBE), and a
    message published after the restart arrives."""
    from edgebroker.client.events import Subscribed
    from edgebroker.client.requests import RESUBSCRIBE
    mq = mosquitto_broker(persistence=False)
    topic = f"{uid}/r"

    async def main():
        c = AsyncClient(f"mqtt://127.0.0.1:{mq.port}", uid, reconnect="always",
                        backoff=(0.05, 0.5), clean_start=False)
        await c.connect()
        await c.subscribe([(topic, 1)])
        mq.stop()
        mq.start()
        async for event in c:
            if isinstance(event, Subscribed):
                assert event.request.token is RESUBSCRIBE and event.granted == [1]
                break
        ack = await asyncio.wait_for(c.publish(topic, b"after", qos=1), 5)
        assert ack.reason_code == 0 and (await next_message(c)).payload == b"after"
        await c.close()

    run(main(), timeout=30)


@pytest.mark.parametrize("host", ["a..b", "x" * 64 + ".example"], ids=["empty-label", "long"])
def test_a_host_name_that_cannot_be_looked_up_fails_at_once_in_both_loops(uid, host):
    """getaddrinfo's UnicodeError is not the network's: connect() raises ConnectError naming
    the host, whatever the policy (the dialing task died of it and connect() waited
    forever), and the synchronous loop ends with a ConnectFailed saying the same (its poll
    raised the UnicodeError)."""
    import re
    from edgebroker.client.events import ConnectFailed
    from edgebroker.client.loop import EventLoop

    async def main():
        c = AsyncClient(f"mqtt://{host}:1883", uid, reconnect="always")
        with pytest.raises(ConnectError, match=re.escape(f"connect to {host}:1883: not a host")):
            await c.connect()
        return [e async for e in c]

    events = run(main(), timeout=10)
    assert [type(e) for e in events] == [ConnectFailed]
    lp = EventLoop(host, 1883, client_id=uid, reconnect="always")
    got = [lp.poll(5), lp.poll(5)]
    lp.close()
    assert [type(e) for e in got] == [ConnectFailed, type(None)]
    assert got[0].reason == events[0].reason


def test_a_reconnection_that_fails_unexpectedly_ends_the_client_not_its_task_alone(broker, uid):
    """The transport maker (given as ``address``) raises an error that is not an OSError on
    the reconnection after the broker took the connection over: the client gives up (a
    ConnectFailed naming the error, the iteration ends) instead of waiting forever on a
    dialing task that died unseen."""
    from edgebroker.client.events import ConnectFailed
    from edgebroker.client.transport import open_transport
    b = broker()
    calls = []

    def make():
        calls.append(len(calls))
        if len(calls) > 1:
            raise RuntimeError("no second transport")
        return open_transport("127.0.0.1", b.port, timeout=5)

    async def main():
        c = AsyncClient(make, uid, backoff=(0.01, 0.05))
        await c.connect()
        taker = m.RawClient("127.0.0.1", b.port)
        taker.connect(uid)                      # the same client id: the broker drops ours
        events = [e async for e in c]
        taker.close()
        return events

    events = run(main(), timeout=10)
    assert [type(e) for e in events] == [Connected, Disconnected, ConnectFailed]
    assert "RuntimeError: no second transport" in events[-1].reason
    assert len(calls) == 2


@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_close_while_connect_is_pending_ends_connect(uid, server):
    """``close()`` from another task while ``connect()`` waits (policy "always": between
    refused attempts, or for the CONNACK of a server that says nothing): ``connect()`` raises
    ClientClosed at once (it waited for ever)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        if server == "silent":
            srv.listen()
        port = srv.getsockname()[1]            # refusing: bound, not listening

        async def main():
            c = AsyncClient(f"mqtt://127.0.0.1:{port}", uid, reconnect="always",
                            backoff=(0.05, 0.2))
            task = asyncio.ensure_future(c.connect())
            if server == "silent":
                srv.setblocking(False)
                peer, _ = await asyncio.get_running_loop().sock_accept(srv)
                assert await asyncio.get_running_loop().sock_recv(peer, 1024)   # CONNECT
            else:
                for _ in range(500):               # two attempts refused, at most 5 s
                    if c.backoff.attempts >= 2:
                        break
                    await asyncio.sleep(0.01)
                assert c.backoff.attempts >= 2
            assert not task.done()
            await c.close()
            with pytest.raises(ClientClosed, match="closed before a connection was made"):
                await asyncio.wait_for(task, 3)
            if server == "silent":
                peer.close()

        run(main())


@pytest.mark.parametrize("server", ["refusing", "silent", "silent TLS", "silent WebSocket"])
def test_a_cancelled_connect_stops_dialing_and_closes(uid, server):
    """``connect()`` cancelled (``asyncio.wait_for`` around it timing out) while the policy
    "always" retries a refusing server, or while a silent server sends no CONNACK (or no
    TLS ServerHello, or no WebSocket upgrade): the client is closed and its half-made link too (it went on dialing
    until ``close()``; a TLS handshake's socket was left to the garbage collector)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        if server != "refusing":
            srv.listen()
        port = srv.getsockname()[1]

        async def main():
            loop = asyncio.get_running_loop()
            scheme = {"silent TLS": "mqtts", "silent WebSocket": "ws"}.get(server, "mqtt")
            c = AsyncClient(f"{scheme}://127.0.0.1:{port}", uid, reconnect="always",
                            backoff=(0.05, 0.2))
            task = asyncio.ensure_future(c.connect())
            if server != "refusing":
                srv.setblocking(False)
                peer, _ = await loop.sock_accept(srv)
                assert await loop.sock_recv(peer, 1024)     # CONNECT, ClientHello, GET
            else:
                for _ in range(500):               # two attempts refused, at most 5 s
                    if c.backoff.attempts >= 2:
                        break
                    await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait([c._dialing], timeout=3)
            assert c._dialing.done()
            with pytest.raises(ClientClosed):
                await c.publish("a", b"x")
            if server != "refusing":
                assert await asyncio.wait_for(loop.sock_recv(peer, 1024), 3) == b""
                peer.close()

        run(main())
