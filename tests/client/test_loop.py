"""The client's synchronous event loop against real brokers: edgebroker (the ``broker``
fixture) and Mosquitto (``mosquitto_broker``). QoS 0/1/2 both ways in 3.1.1 and 5.0, the
link cut and restored, the state file and the spool across a process restart, keepalive on a
silently dropped link, no thread started, the producer's back-pressure bound, commands."""

from __future__ import annotations

import json
import os
import select
import threading
import time

import pytest

from edgebroker.client.events import (
    Acked, ConnectFailed, Connected, Disconnected, Message, PingTimeout, Subscribed,
)
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import RESUBSCRIBE, make_publish, make_subscribe
from edgebroker.client.statefile import read_state

from relay import Relay

FAST = {"backoff_base": 0.05, "backoff_cap": 0.3}


def loop_for(remote, client_id: str, **kw) -> EventLoop:
    lp = EventLoop(remote.host, remote.port, client_id=client_id, **kw)
    return lp


def wait_event(lp: EventLoop, pred, timeout: float = 10.0, sink: list | None = None):
    """The first event of ``lp`` for which ``pred`` holds (the others go to ``sink``)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no such event within {timeout} s; others: {sink}"
        event = lp.poll(left)
        if event is not None and pred(event):
            return event
        if sink is not None and event is not None:
            sink.append(event)


def drive(loops: dict, until, timeout: float = 30.0, step=None) -> None:
    """Poll each loop in turn (events into its list) until ``until()``."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"not done within {timeout} s: " + "; ".join(
            f"{lp.conn.client_id} {lp.conn.state} inflight {lp.conn.inflight} queued "
            f"{lp.conn.queued}, last events {sink[-3:]}" for lp, sink in loops.items())
        for lp, sink in loops.items():
            while not until() and (event := lp.poll(0.01)) is not None:
                sink.append(event)
        if step is not None:
            step()


def messages(lp: EventLoop, n: int, timeout: float = 20.0, others: list | None = None) -> list:
    """The next ``n`` messages of ``lp`` (other events go to ``others``)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{len(got)} of {n} messages within {timeout} s"
        event = lp.poll(left)
        if type(event) is Message:
            got.append(event)
        elif event is not None and others is not None:
            others.append(event)
    return got


@pytest.mark.parametrize("protocol", [4, 5])
def test_qos_0_1_2_both_ways(remote, protocol, uid):
    sub = loop_for(remote, f"{uid}s", protocol=protocol)
    res = sub.run([make_subscribe([(f"{uid}/#", 2)])], timeout=10)
    assert res.complete and res.done[0].granted == [2], res.events
    pub = loop_for(remote, f"{uid}p", protocol=protocol)
    props = {0x26: [("k", "v")]} if protocol == 5 else None
    batch = [make_publish(f"{uid}/q{q}", b"%d:%d" % (q, i), q, properties=props, token=(q, i))
             for q in (0, 1, 2) for i in range(100)]
    res = pub.run(batch, timeout=20)
    assert res.complete, res
    assert [e.request.token for e in res.done] == [r.token for r in batch]
    assert all(type(e) is Acked and e.reason_code == 0 for e in res.done)
    received = messages(sub, 300)
    for q in (0, 1, 2):
        mine = [e for e in received if e.topic == f"{uid}/q{q}"]
        assert [e.payload for e in mine] == [b"%d:%d" % (q, i) for i in range(100)]
        assert {e.qos for e in mine} == {q}
    if protocol == 5:
        assert received[0].properties[0x26] == [("k", "v")]
    # Every QoS 2 exchange toward the subscriber ends (PUBREL, PUBCOMP).
    drive({sub: []}, lambda: not sub.conn.save()["incoming_qos2"], 10)
    pub.close()
    sub.close()


def test_link_cut_and_restored_nothing_lost(remote, uid):
    """The broker stops mid-stream and comes back on the same port: every QoS 1/2 message
    the publisher's generator gave arrives at the persistent subscriber."""
    n = 300
    sub = loop_for(remote, f"{uid}s", clean_start=False, reconnect="always", **FAST)
    assert sub.run([make_subscribe([(f"{uid}/t", 1)])], timeout=10).complete
    pub = loop_for(remote, f"{uid}p", clean_start=False, reconnect="always", max_inflight=20,
                   max_queued=50, **FAST)
    pub.set_source(make_publish(f"{uid}/t", b"%d" % i, 1 + i % 2) for i in range(n))
    pub.throttle(300)      # so that the broker stops mid-stream
    pub_events: list = []
    sub_events: list = []
    loops = {pub: pub_events, sub: sub_events}

    def acked():
        return sum(type(e) is Acked for e in pub_events)

    drive(loops, lambda: acked() >= 60)
    remote.stop()
    drive(loops, lambda: any(type(e) in (Disconnected, ConnectFailed) for e in pub_events)
          and any(type(e) in (Disconnected, ConnectFailed) for e in sub_events))
    # While the link is down the producer fills the queue, and no further.
    drive(loops, lambda: pub.conn.queued == 50)
    remote.start()
    pub.throttle(None)
    drive(loops, lambda: len({e.payload for e in sub_events if type(e) is Message}) == n, 60)
    assert {e.payload for e in sub_events if type(e) is Message} == {b"%d" % i
                                                                    for i in range(n)}
    drive(loops, lambda: acked() == n)
    assert [type(e) for e in pub_events if type(e) is Connected][-1] is Connected
    pub.close()
    sub.close()


def test_keepalive_detects_a_silently_dropped_link(broker, uid):
    b = broker()
    relay = Relay(b.host, b.port)
    try:
        lp = EventLoop("127.0.0.1", relay.port, client_id=f"{uid}k", keepalive=1,
                       reconnect="always", **FAST)
        wait_event(lp, lambda e: type(e) is Connected)
        relay.freeze()            # nothing passes any more; nothing is closed either
        others: list = []
        # Messages keep being sent (so the outgoing side is never idle): PINGREQ anyway.
        lp.set_source(make_publish(f"{uid}/x", b"p") for _ in range(10))
        wait_event(lp, lambda e: type(e) is PingTimeout, 10, others)
        wait_event(lp, lambda e: type(e) is Connected, 10, others)
        assert relay.accepted == 2
        res = lp.run([make_publish(f"{uid}/x", b"after", 1)], timeout=10)
        assert res.complete and res.done[0].reason_code == 0
        lp.close()
    finally:
        relay.close()


def test_back_pressure_bound_on_a_generator(broker, uid):
    b = broker()
    relay = Relay(b.host, b.port)
    taken = [0]

    def producer():
        for i in range(1000):
            taken[0] += 1
            yield make_publish(f"{uid}/bp", b"%d" % i, 1)

    try:
        lp = EventLoop("127.0.0.1", relay.port, client_id=f"{uid}b", max_inflight=5,
                       max_queued=10)
        wait_event(lp, lambda e: type(e) is Connected)
        relay.freeze()
        lp.set_source(producer())
        for _ in range(5):
            assert lp.poll(0.1) is None          # no acknowledgement can come back
        assert taken[0] == 15 and lp.conn.inflight == 5 and lp.conn.queued == 10
        relay.thaw()
        acked = 0
        while acked < 1000:
            event = lp.poll(10)
            assert event is not None, f"stuck at {acked} acknowledged"
            acked += type(event) is Acked
            assert taken[0] - acked <= 15
        lp.close()
    finally:
        relay.close()


def test_the_sync_loop_starts_no_thread(broker, uid, monkeypatch, tmp_path):
    b = broker()
    before = threading.enumerate()

    def refuse(self, *a, **kw):
        raise AssertionError(f"the event loop started a thread: {self!r}")

    started = []
    monkeypatch.setattr(threading.Thread, "start", refuse)
    threading.settrace(lambda *a: started.append(threading.current_thread()))
    try:
        lp = EventLoop(b.host, b.port, client_id=f"{uid}n", state_file=tmp_path / "st.json")
        assert lp.run([make_subscribe([(f"{uid}/#", 2)])], timeout=10).complete
        res = lp.run([make_publish(f"{uid}/a", b"%d" % q, q) for q in (0, 1, 2)], timeout=10)
        assert res.complete
        got = [e for e in res.events if type(e) is Message]     # run() hands them back
        got += messages(lp, 3 - len(got))
        assert sorted(e.payload for e in got) == [b"0", b"1", b"2"]
        lp.pause()
        lp.resume()
        lp.throttle(1000.0)
        state = lp.shutdown()
        assert state["client_id"] == f"{uid}n"
        lp.close()
    finally:
        threading.settrace(None)
    assert threading.enumerate() == before
    assert started == []          # settrace hooks run in threads started after it was set


def test_pause_resume_disconnect_reconnect_shutdown(broker, uid, tmp_path):
    b = broker()
    sub = EventLoop(b.host, b.port, client_id=f"{uid}s")
    assert sub.run([make_subscribe([(f"{uid}/#", 1)])], timeout=10).complete
    pub = EventLoop(b.host, b.port, client_id=f"{uid}p")
    sub.commands.pause()                      # the command object: as from elsewhere
    assert pub.run([make_publish(f"{uid}/a", b"%d" % i, 1) for i in range(5)], 10).complete
    assert sub.poll(0.3) is None              # paused: nothing is read
    sub.resume()
    assert [e.payload for e in messages(sub, 5)] == [b"%d" % i for i in range(5)]
    sub.disconnect()
    assert sub.poll(1) is None and sub.conn.state == "closed"   # the iteration ends
    assert list(sub) == []
    pub.run([make_publish(f"{uid}/a", b"while away", 1)], 10)
    sub.reconnect()
    wait_event(sub, lambda e: type(e) is Connected)
    path = tmp_path / "sub.json"
    pub.throttle(None)
    state = sub.shutdown(path)
    assert read_state(path) == state and state["client_id"] == f"{uid}s"
    assert sub.poll(0.1) is None
    pub.close()
    sub.close()


def test_disconnect_before_the_connack_does_not_linger(uid):
    """disconnect() while a server that never answers holds back its CONNACK: CONNECT and
    DISCONNECT go out and the socket closes at once, without the second that lingering
    after a CONNACK may take (there is no acknowledgement of ours for a reset to lose)."""
    import socket
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(5)
        lp = EventLoop("127.0.0.1", server.getsockname()[1], client_id=f"{uid}n")
        assert lp.poll(0.3) is None and lp.conn.state == "connecting"     # (it dials)
        peer, _ = server.accept()
        with peer:
            peer.settimeout(5)
            assert select.select([peer], [], [], 5)[0]           # the CONNECT came
            start = time.monotonic()
            lp.disconnect()
            assert time.monotonic() - start < 0.5           # it lingered LINGER (1 s)
            got = b""
            for _ in range(100):
                chunk = peer.recv(1024)
                if not chunk:
                    break
                got += chunk
        assert got[0] == 0x10 and got.endswith(b"\xe0\x00")    # CONNECT ... DISCONNECT
        lp.close()


def test_policies_when_nothing_listens(uid):
    from mosquitto import free_port
    port = free_port()
    lp = EventLoop("127.0.0.1", port, client_id=f"{uid}x", reconnect="after_first_success")
    events = list(lp)
    assert [type(e) for e in events] == [ConnectFailed]
    # the reason as said to a person: the address and the cause, no "[Errno 111]"
    assert events[0].reason == f"connect to 127.0.0.1:{port}: Connection refused"
    assert events[0].reason_code is None
    lp.close()
    lp = EventLoop("127.0.0.1", port, client_id=f"{uid}y", reconnect="always", **FAST)
    res = lp.run([make_publish(f"{uid}/t", b"kept", 1)], timeout=0.5)
    assert [r.payload for r in res.pending] == [b"kept"] and lp.conn.queued == 1
    assert len(res.events) >= 2 and all(type(e) is ConnectFailed for e in res.events)
    lp.close()


def test_end_when_idle_ends_the_iteration_once_every_request_is_answered(remote, uid):
    sub = loop_for(remote, f"{uid}s")
    assert sub.run([make_subscribe([(f"{uid}/#", 2)])], timeout=10).complete
    assert sub.idle                                     # no source, nothing in flight
    batch = [make_publish(f"{uid}/q{q}", b"%d" % q, q, token=q) for q in (0, 1, 2)]
    lp = loop_for(remote, f"{uid}p", requests=iter(batch), end_when_idle=True)
    assert not lp.idle                                  # the source is not read yet
    started = time.monotonic()
    events = []
    while (event := lp.poll(30)) is not None:          # ends by itself, not by the timeout
        events.append(event)
    assert time.monotonic() - started < 15
    assert lp.idle and lp.conn.state == "connected"
    assert [type(e) for e in events] == [Connected, Acked, Acked, Acked]
    assert sorted(e.request.token for e in events[1:]) == [0, 1, 2]
    assert list(lp) == []                               # the iteration too
    lp.set_source([make_publish(f"{uid}/q1", b"again", 1)])     # more work: not idle
    assert not lp.idle
    assert [type(e) for e in lp] == [Acked] and lp.idle
    got = sorted(e.payload for e in messages(sub, 4))
    assert got == [b"0", b"1", b"2", b"again"]
    lp.close()
    sub.close()


def test_a_source_waiting_on_a_descriptor_is_asked_again_when_it_is_readable(broker, uid,
                                                                             tmp_path):
    b = broker()
    r, w = os.pipe()
    asked = [0]

    def lines():
        while True:
            asked[0] += 1
            if not select.select([r], [], [], 0)[0]:
                yield None                      # nothing for now
                continue
            data = os.read(r, 100)
            if not data:
                return
            yield make_publish(f"{uid}/l", data, 1)

    lp = EventLoop(b.host, b.port, client_id=f"{uid}w", end_when_idle=True)
    lp.set_source(lines(), watch=r)
    wait_event(lp, lambda e: type(e) is Connected)
    before = asked[0]
    assert lp.poll(0.5) is None                 # the time is up; nothing came
    assert asked[0] == before                   # not asked every IDLE_POLL (10 times)
    lp.commands.wake()                          # wake(): asked again at once
    assert lp.poll(0.2) is None and asked[0] == before + 1
    os.write(w, b"one")
    event = wait_event(lp, lambda e: type(e) is Acked, 5)
    assert event.request.payload == b"one" and event.reason_code == 0
    os.close(w)                                 # EOF: the source ends, the loop is idle
    assert list(lp) == [] and lp.idle
    os.close(r)
    # A regular file cannot be watched (epoll refuses it): asked again IDLE_POLL later.
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with open(path, "rb") as fh:
        lp.set_source(iter([None, make_publish(f"{uid}/l", b"two", 1)]), watch=fh)
        assert [(type(e), e.request.payload) for e in lp] == [(Acked, b"two")]
    lp.close()


def test_subscriptions_made_again_after_a_broker_restart(remote, uid):
    """The broker restarts without the session (clean start): the loop subscribes again by
    itself (resubscribe=True, its default) and messages published after it arrive."""
    sub = loop_for(remote, f"{uid}s", reconnect="always", **FAST)
    assert sub.run([make_subscribe([(f"{uid}/#", 1)])], timeout=10).complete
    remote.stop()
    wait_event(sub, lambda e: type(e) in (Disconnected, ConnectFailed))
    remote.start()
    connected = wait_event(sub, lambda e: type(e) is Connected, 20)
    assert not connected.session_present
    again = wait_event(sub, lambda e: type(e) is Subscribed)
    assert again.request.token == RESUBSCRIBE and again.granted == [1]
    assert again.request.filters == [(f"{uid}/#", 1)]
    pub = loop_for(remote, f"{uid}p")
    assert pub.run([make_publish(f"{uid}/after", b"back", 1)], timeout=10).complete
    assert [e.payload for e in messages(sub, 1)] == [b"back"]
    pub.close()
    sub.close()


def test_run_reports_what_it_did_not_take_and_leaves_no_busy_loop(broker, uid):
    """A batch larger than the queue with a timeout too short for it: the requests never
    taken are in ``rest`` (none silently dropped), and after run() the loop waits in its
    selector again (``poll`` over an idle link takes little CPU)."""
    b = broker()
    lp = EventLoop(b.host, b.port, client_id=f"{uid}p", max_queued=10, max_inflight=10)
    assert lp.run([make_subscribe([(f"{uid}/none", 0)])], timeout=10).complete
    lp.pause()                                   # nothing goes out: the queue fills
    res = lp.run((make_publish(f"{uid}/a", b"%d" % i, 1) for i in range(50)), timeout=0.2)
    assert not res.complete and not res.taken_all
    rest = list(res.rest)
    assert len(res.pending) + len(rest) == 50
    assert [r.payload for r in res.pending + rest] == [b"%d" % i for i in range(50)]
    lp.resume()
    assert lp.run(rest, timeout=10).complete
    cpu = time.process_time()
    end = time.monotonic() + 0.5
    while (left := end - time.monotonic()) > 0:
        lp.poll(left)                            # an idle link: nothing comes
    assert time.process_time() - cpu < 0.25, "the loop spun instead of waiting"
    lp.close()


def test_a_spool_hears_of_its_answers_during_run(broker, uid, tmp_path):
    from edgebroker.client.spool import Spool
    b = broker()
    spool = Spool(tmp_path / "spool")
    for i in range(200):
        spool.append(f"{uid}/s", b"%d" % i, 1)
    lp = EventLoop(b.host, b.port, client_id=f"{uid}p", requests=spool, max_inflight=20)
    wait_event(lp, lambda e: type(e) is Acked)           # the spool's publishes flow
    res = lp.run([make_subscribe([(f"{uid}/other", 1)])], timeout=10)
    assert res.complete and [type(e) for e in res.done] == [Subscribed]
    drive({lp: []}, lambda: spool.unacked == 0, timeout=20)    # every answer reached it
    lp.close()
    spool.close()


def test_a_checkpoint_asked_from_another_thread_is_written_by_the_loop(broker, uid, tmp_path):
    """``loop.commands.save_state()`` from another thread: the loop writes the state file at
    its next pass, with what is queued then (the loop's own save_state would race it)."""
    b = broker()
    path = tmp_path / "checkpoint.json"
    lp = EventLoop(b.host, b.port, client_id=f"{uid}c", clean_start=False, max_inflight=1)
    wait_event(lp, lambda e: type(e) is Connected)
    lp.pause()                              # nothing leaves: the requests stay queued
    for i in range(3):
        lp.conn.publish(f"{uid}/t", b"%d" % i, qos=1)
    asker = threading.Thread(target=lp.commands.save_state, args=(path,))
    asker.start()
    asker.join()
    assert not path.exists()                # asked, not done: the loop does it
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the loop never wrote the checkpoint"
        lp.poll(0.05)
    doc = json.loads(path.read_text())
    assert doc["client_id"] == f"{uid}c"
    assert len(doc["queued"]) + len(doc["inflight"]) == 3, doc
    lp.close()


def test_a_state_file_is_used_once(broker, uid, tmp_path):
    """Loaded, it is put aside (``.loaded``): a process killed after loading it leaves none for
    the next, whose stale server QoS 2 identifiers would drop new messages."""
    b = broker()
    path = tmp_path / "state.json"
    first = EventLoop(b.host, b.port, client_id=f"{uid}c", clean_start=False,
                      state_file=path)
    assert first.run([make_subscribe([(f"{uid}/#", 2)])], timeout=10).complete
    first.shutdown()
    assert path.exists()
    second = EventLoop(b.host, b.port, client_id=f"{uid}c", clean_start=False,
                       state_file=path)
    assert not path.exists() and (tmp_path / "state.json.loaded").exists()
    second.close()                                     # as if killed: no new state file
    third = EventLoop(b.host, b.port, client_id=f"{uid}c", clean_start=False,
                      state_file=path)
    assert third.conn.inflight == 0 and third.conn.queued == 0
    third.close()


def test_a_spooled_request_3_1_1_cannot_send_is_answered_as_refused_not_given_again(
        broker, uid, tmp_path):
    """A publish with 5.0 properties and a subscribe with 5.0 options in the spool of a 3.1.1
    client: each is answered as refused (0x80) and the spool lets it go; the requests around
    them go as usual, and a spool opened again has nothing left to give."""
    from edgebroker.client.spool import Spool
    b = broker()
    spool = Spool(tmp_path / "spool")
    spool.append(f"{uid}/a", b"before", 1)
    spool.append(make_publish(f"{uid}/a", b"5.0 only", 1, properties={0x26: [("k", "v")]}))
    spool.append(make_subscribe([(f"{uid}/x", 1 | 0x04)]))           # No Local
    spool.append(f"{uid}/a", b"after", 1)
    lp = EventLoop(b.host, b.port, client_id=f"{uid}p", protocol=4, requests=spool)
    events: list = []
    drive({lp: events}, lambda: spool.unacked == 0 and sum(
        type(e) in (Acked, Subscribed) for e in events) == 4, timeout=20)
    answers = [(type(e).__name__, getattr(e, "reason_code", None), getattr(e, "granted", None))
               for e in events if type(e) in (Acked, Subscribed)]
    assert sorted(answers, key=str) == sorted([
        ("Acked", 0, None), ("Acked", 0x80, None), ("Subscribed", None, [0x80]),
        ("Acked", 0, None)], key=str)
    lp.close()
    spool.close()
    with Spool(tmp_path / "spool") as again:
        assert again.unacked == 0 and next(iter(again)) is None


def test_the_loop_is_not_idle_while_its_own_buffer_holds_bytes(broker, uid):
    """A QoS 0 publish is answered once the connection handed its bytes out, but the socket
    (a small send buffer, a link that stopped forwarding) took only part of them: the rest
    waits in the loop. Until it is written the loop is not ``idle``, so ``end_when_idle``
    does not end and a ``close()`` then would not cut the message."""
    import socket
    from edgebroker.client.transport import TCPTransport
    b = broker()
    sub = b.client(f"{uid}s")
    sub.subscribe(f"{uid}/big", qos=0)
    relay = Relay(b.host, b.port)
    go = threading.Event()
    big = b"x" * 900_000

    def source():
        while not go.is_set():
            yield None
        yield make_publish(f"{uid}/big", big, 0)

    def dial(timeout: float):
        s = socket.socket()
        s.settimeout(timeout)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.connect(("127.0.0.1", relay.port))
        return TCPTransport(s, "relay")

    try:
        lp = EventLoop(client_id=f"{uid}p", transport_factory=dial, requests=source(),
                       end_when_idle=True)
        wait_event(lp, lambda e: type(e) is Connected)
        relay.freeze()
        go.set()
        wait_event(lp, lambda e: type(e) is Acked)        # handed out by the connection
        assert lp.poll(0.3) is None
        assert not lp.idle, "900 kB cannot all be in a frozen link's buffers"
        relay.thaw()
        deadline = time.monotonic() + 20
        while not lp.idle:
            assert time.monotonic() < deadline, "the loop's bytes never left"
            lp.poll(0.05)
        lp.close()
        assert sub.recv_publish(10).payload == big
    finally:
        relay.close()


def test_keepalive_finds_a_silent_link_while_qos0_keeps_flowing(broker, uid):
    """The link goes silent (the relay forwards nothing and closes nothing) while QoS 0
    messages keep going out: the kernel's buffers keep taking their bytes, which is no sign
    of life; no byte comes back, so the PINGREQ's PINGRESP is late within two keepalives
    (it used to count each write as the link moving, and never found it)."""
    b = broker()
    relay = Relay(b.host, b.port)
    try:
        lp = EventLoop("127.0.0.1", relay.port, client_id=f"{uid}k", keepalive=1,
                       reconnect="never")
        wait_event(lp, lambda e: type(e) is Connected)

        def stream():
            for _ in range(2000):              # 20 a second (IDLE_POLL after each None)
                yield make_publish(f"{uid}/x", b"x" * 100)
                yield None

        relay.freeze()
        frozen_at = time.monotonic()
        lp.set_source(stream())
        others: list = []
        wait_event(lp, lambda e: type(e) is PingTimeout, 8, others)
        assert time.monotonic() - frozen_at < 3.5
        assert sum(type(e) is Acked for e in others) > 10     # it kept flowing meanwhile
        lp.close()
    finally:
        relay.close()
