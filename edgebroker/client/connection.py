"""An MQTT client connection with no I/O (3.1, 3.1.1 and 5.0): bytes in, events out, bytes to
send; no sockets, clocks or threads (the caller passes ``now``). The event loop
(client/loop.py), the asyncio adapter and the bridge drive it. The contract is
/work/notes/client-api.md's; docs/client.md says what it chose where MQTT is silent.

The states and their moves are client/states.py's; packets from the server are handled in
client/incoming.py (one over ``max_packet_size`` is read past: client/oversize.py), a
request's first sending (and the server's limits) in client/sending.py, what is sent again
after a reconnection in client/resume.py; the state file is client/state.py's; 5.0
properties are checked by client/propcheck.py.

Requests leave in the order they were made: a QoS 1/2 PUBLISH waits for a place in the window
(the smaller of ``max_inflight`` and the server's Receive Maximum; over 3.1/3.1.1 also while
``max_qos2_inflight`` QoS 2 ones are unfinished) and what follows it waits behind it. Nothing
is lost on "disconnected": in-flight and queued requests wait for the next connection, and
``save()`` writes them out for a later process (``load``).
"""

from __future__ import annotations

from collections import deque

from edgebroker.errors import PROTOCOL_ERROR, ProtocolError
from edgebroker.client.events import Acked, ConnectFailed, PingTimeout
from edgebroker.client.incoming import HANDLERS, on_ack, protocol_error
from edgebroker.client.oversize import start_skipping
from edgebroker.client.requests import (PUBLISH, STAGE_PUBLISH, SUBSCRIBE, ClientError,
                                        QueueFull, Request, check_sendable, make_publish,
                                        make_subscribe, make_unsubscribe)
from edgebroker.client.resume import send_again
from edgebroker.client.propcheck import connect_problem, property_problem
from edgebroker.client.sending import send_other, send_publish, send_qos0
from edgebroker.client.state import load_state, save_state
from edgebroker.client.states import CLOSED, CONNECTED, CONNECTING, DISCONNECTED, MOVES
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import (DISCONNECT_BYTES, PINGREQ_BYTES, encode_ack,
                                    encode_connect, encode_puback)
from edgebroker.mqtt.encode5 import encode_disconnect5
from edgebroker.mqtt.properties import (MAXIMUM_PACKET_SIZE, RECEIVE_MAXIMUM,
                                        TOPIC_ALIAS_MAXIMUM, WILL)
from edgebroker.mqtt.stream import Decoder

__all__ = ["Connection", "Request", "ClientError", "QueueFull"]

# QoS 2 PUBLISHes unfinished (PUBCOMP not back) at once over 3.1/3.1.1 by default: such a
# server cannot say how many it takes. Mosquitto takes max_inflight_messages (20 by default)
# from a client, answers one more from a 3.1.1 client with a plain PUBREC and drops it or
# closes the connection (5.0: PUBREC 0x97, and a 5.0 server says its Receive Maximum), and
# while that many await PUBREL drops a QoS 1 PUBLISH after a plain PUBACK (so it waits too).
QOS2_INFLIGHT_311 = 20

class Connection:
    """One client's MQTT session over successive transports (see the module doc)."""

    def __init__(self, client_id: str = "", protocol: int = P.PROTOCOL_311, *,
                 clean_start: bool = True, keepalive: int = 60, username: str | None = None,
                 password: bytes | str | None = None, will: P.Will | None = None,
                 properties: dict | None = None, max_inflight: int = 100,
                 max_queued: int = 1000, connect_timeout: float = 30.0,
                 resubscribe: bool = False, auto_ack: bool = True,
                 max_packet_size: int | None = None, max_qos2_inflight: int | None = None):
        if protocol not in (P.PROTOCOL_31, P.PROTOCOL_311, P.PROTOCOL_5):
            raise ClientError(f"protocol must be 3 (3.1), 4 (3.1.1) or 5, not {protocol!r}")
        if not 0 <= keepalive <= 0xFFFF:
            raise ClientError(f"keepalive {keepalive} is outside 0..65535 seconds")
        if not 1 <= max_inflight <= 0xFFFF:
            raise ClientError(f"max_inflight {max_inflight} is outside 1..65535")
        if max_qos2_inflight is not None and not 1 <= max_qos2_inflight <= 0xFFFF:
            raise ClientError(f"max_qos2_inflight {max_qos2_inflight} is outside 1..65535")
        if max_queued < 1:
            raise ClientError(f"max_queued {max_queued} is below 1 (the queue must take at "
                              f"least one request: every request passes through it)")
        if properties and protocol != P.PROTOCOL_5:
            raise ClientError("CONNECT properties need protocol 5")
        problem = property_problem(properties, P.CONNECT) or will is not None and (
            property_problem(will.properties, WILL)) or connect_problem(
            client_id, username, password, will, protocol)
        if problem:
            raise ClientError(f"CONNECT: {problem}")
        if max_packet_size is not None:
            # The largest packet taken from the server (the decoder's limit); on 5.0 the
            # server is told (Maximum Packet Size) unless the properties say it already.
            if not 2 <= max_packet_size <= P.MAX_PACKET_SIZE:
                raise ClientError(f"max_packet_size {max_packet_size} is outside "
                                  f"2..{P.MAX_PACKET_SIZE}")
            if protocol == P.PROTOCOL_5:
                properties = {MAXIMUM_PACKET_SIZE: max_packet_size, **(properties or {})}
        self.client_id = client_id
        self.protocol = protocol
        self.bridge_marker = False    # 0x80 on a 3.1/3.1.1 CONNECT's level (bridge/bridge.py)
        self.clean_start = clean_start
        self.keepalive = keepalive
        self.username = username
        self.password = password.encode("utf-8") if isinstance(password, str) else password
        self.will = will
        self.properties = properties
        self.max_inflight = max_inflight
        # QoS 2 PUBLISHes unfinished at once (None: 3.x: QOS2_INFLIGHT_311; 5.0: Receive Maximum)
        self.max_qos2_inflight = max_qos2_inflight
        self._qos2_cap = max_qos2_inflight or (0xFFFF if protocol == P.PROTOCOL_5
                                               else QOS2_INFLIGHT_311)
        self.max_queued = max_queued
        self.connect_timeout = connect_timeout
        # On a reconnect with Session Present 0: SUBSCRIBE again what the server had granted
        # (the event loop and the asyncio adapter set it; the bridge subscribes on Connected).
        self.resubscribe = resubscribe
        # False: an incoming QoS 1/2 message is acknowledged by ack(message), not on arrival.
        self.auto_ack = auto_ack
        self.state = DISCONNECTED
        self._v5 = protocol == P.PROTOCOL_5
        props = properties or {}
        self._alias_max = props.get(TOPIC_ALIAS_MAXIMUM, 0)      # we accept from the server
        self._receive_max = props.get(RECEIVE_MAXIMUM, 0xFFFF)   # incoming QoS 2 at once
        self._max_packet = props.get(MAXIMUM_PACKET_SIZE, max_packet_size or P.MAX_PACKET_SIZE)
        self._decoder: Decoder | None = None
        self._out: list = []             # frames (and payloads) for data_to_send
        self._queue: deque = deque()     # requests not sent yet, in order
        self._inflight: dict = {}        # packet id -> request sent, not acknowledged (in order)
        self._n_pub = 0                  # QoS 1/2 PUBLISHes among them (the window's count)
        self._n_qos2 = 0                 # ... QoS 2 ones (_qos2_cap's count)
        self._resend_wait: deque = deque()  # in flight, to send again when the window allows
        self._window = max_inflight
        self._next_pid = 1
        # Packet ids are taken from 1..packet_ids (the bridge narrows it: bridge/release.py)
        self.packet_ids = 0xFFFF
        self._incoming_qos2: dict = {}   # the server's QoS 2 ids given out -> digest or None
        self._subscriptions: dict = {}   # filter -> (options, properties) the server granted
        self._unacked: dict = {}         # packet id -> Message given out, ack() awaited
        self._qos0_out: list = []        # QoS 0 requests in _out, not handed out yet
        self._qos0_heads: dict = {}      # (topic, length, retain) -> QoS 0 PUBLISH head
        self._events: list = []          # events made outside receive_data/tick
        self._closing: bytes | None = None  # the DISCONNECT to send last (disconnect())
        self._aliases: dict = {}
        self._ka = keepalive
        # moved_at: when bytes that waited in the driver's own buffer (behind a slow link)
        # last left with the PINGREQ still among them (the loop sets it; see tick);
        # pings_sent: PINGREQs queued so far (the loop finds where the last one is)
        self._last_sent = self._last_recv = self.moved_at = 0.0
        self.pings_sent = 0
        self._sent_untimed = False       # data handed out with no ``now`` (tick dates it)
        self._ping_due: float | None = None
        self._connack_due = 0.0
        self._server_max_qos = 2
        self._server_retain = True
        self._server_max_packet = 0      # 0: no limit said
        self._server_aliases = 0         # its Topic Alias Maximum (0: it takes none)
        self.duplicates_dropped = 0      # QoS 2 PUBLISHes again (DUP) before their PUBREL
        self.ids_reused = 0              # different QoS 2 PUBLISHes under an id held so
        self._reuse_logged = False       # ... logged on this connection (client/incoming.py)
        self.oversized_dropped = 0       # PUBLISHes over _max_packet read past (Oversized)
        self.unexpected_acks = 0         # acknowledgements for no request of ours

    # -- figures ----------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        """Requests sent and not acknowledged (QoS 1/2 PUBLISH, SUBSCRIBE, UNSUBSCRIBE)."""
        return len(self._inflight)

    @property
    def inflight_publishes(self) -> int:
        """QoS 1/2 PUBLISHes sent, not acknowledged (sent again after a reconnection)."""
        return sum(1 for req in self._inflight.values() if req.kind is PUBLISH)

    @property
    def inflight_past_pubrec(self) -> int:
        """Of ``inflight_publishes``, the QoS 2 past PUBREC (their PUBREL goes again)."""
        return sum(r.kind is PUBLISH and r.stage != STAGE_PUBLISH for r in self._inflight.values())

    @property
    def queued(self) -> int:
        """Requests not sent yet."""
        return len(self._queue)

    @property
    def can_publish(self) -> bool:
        """False while ``max_queued`` requests wait: a new one would raise QueueFull."""
        return len(self._queue) < self.max_queued

    @property
    def ping_outstanding(self) -> bool:
        """A PINGREQ went out and its PINGRESP has not come back yet."""
        return self._ping_due is not None

    @property
    def qos2_full(self) -> bool:
        """True while ``max_qos2_inflight`` QoS 2 PUBLISHes are unfinished: QoS 1/2 ones wait."""
        return self._n_qos2 >= self._qos2_cap

    def _room(self, req: Request) -> bool:
        """Whether the PUBLISH ``req`` (QoS 1/2) may be in flight now."""
        return self._n_pub < self._window and self._n_qos2 < self._qos2_cap

    @property
    def window(self) -> int:
        """How many QoS 1/2 PUBLISHes may be in flight at once on this connection."""
        return self._window

    # -- the moves ----------------------------------------------------------------------------
    def _move(self, state: str) -> None:
        if state not in MOVES[self.state]:
            raise ClientError(f"connection cannot go from {self.state} to {state}")
        self.state = state

    def connect(self, now: float) -> None:
        """Start a connection on a fresh transport: CONNECT is queued for data_to_send."""
        self._move(CONNECTING)
        v5 = self._v5
        self._decoder = Decoder(self._max_packet, P.PROTOCOL_5 if v5 else 0, client=True)
        self._out = [encode_connect(P.Connect(
            self.client_id, self.clean_start, self.keepalive, self.will, self.username,
            self.password, self.protocol, properties=self.properties,
            bridge=self.bridge_marker and not v5))]
        self._closing, self._aliases = None, {}
        self._ping_due, self._sent_untimed = None, False
        self._last_sent = self._last_recv = self.moved_at = now
        self._connack_due = now + self.connect_timeout
        self._ka = self.keepalive
        self._window = self.max_inflight
        self._server_max_qos, self._server_retain, self._server_max_packet = 2, True, 0
        self._server_aliases = 0

    def connection_lost(self) -> None:
        """The transport closed or broke: requests are kept for the next ``connect``."""
        if self.state in (CONNECTING, CONNECTED):
            self._lose()
            self._out = []

    def _lose(self) -> None:
        self._move(CLOSED if self._closing is not None else DISCONNECTED)
        self._closing = None
        self._decoder = None
        self._ping_due = None
        if self._unacked:       # QoS 1 is sent again by the server, under a new Message
            self._unacked = {pid: m for pid, m in self._unacked.items() if m.qos == 2}
        if self._qos0_out:      # never handed out: they go first next time
            self._queue.extendleft(reversed(self._qos0_out))
            self._qos0_out = []

    def disconnect(self, reason_code: int = 0, properties: dict | None = None) -> None:
        """End the connection: DISCONNECT is the last thing data_to_send hands out; then the
        state is "closed". Requests not acknowledged are kept (``save``)."""
        if self.state in (DISCONNECTED, CLOSED):
            self._move(CLOSED)
            return
        self._closing = (encode_disconnect5(reason_code, properties) if self._v5
                         else DISCONNECT_BYTES)

    def ack(self, message) -> bool:
        """With ``auto_ack=False``: acknowledge a QoS 1/2 ``Message`` this connection gave out
        (PUBACK for QoS 1, PUBREC for QoS 2), once the caller has made it safe. False when
        there is nothing to acknowledge: QoS 0, acknowledged already, or a QoS 1 message of a
        connection that was lost since (the server sends it again, as a new Message). A QoS 2
        message acknowledged while disconnected is answered when the server sends it again."""
        pid = message.packet_id
        if not message.qos or self._unacked.get(pid) is not message:
            return False
        del self._unacked[pid]
        if self.state is CONNECTED:
            self._out.append(encode_puback(pid) if message.qos == 1
                             else encode_ack(P.PUBREC, pid))
        return True

    @property
    def unacked(self) -> int:
        """Incoming QoS 1/2 messages given out and not yet acknowledged (``auto_ack=False``)."""
        return len(self._unacked)

    # -- requests -----------------------------------------------------------------------------
    def publish(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                properties: dict | None = None, token=None) -> Request:
        """A PUBLISH: sent at once when connected and nothing waits before it, else queued.
        QueueFull when ``max_queued`` requests wait already."""
        return self.submit(make_publish(topic, payload, qos, retain, properties, token))

    def subscribe(self, filters, properties: dict | None = None, token=None) -> Request:
        """A SUBSCRIBE of ``filters``: (filter, QoS or 5.0 options byte) pairs, or filters
        alone (QoS 0). Subscribed comes with the granted codes."""
        return self.submit(make_subscribe(filters, properties, token))

    def unsubscribe(self, filters, properties: dict | None = None, token=None) -> Request:
        """An UNSUBSCRIBE of ``filters``; Unsubscribed comes with its reason codes (5.0)."""
        return self.submit(make_unsubscribe(filters, properties, token))

    def submit(self, req: Request) -> Request:
        """Send or queue a request made by requests.py's ``publish``/``subscribe``/
        ``unsubscribe`` (how the event loop takes them from the user's iterable)."""
        queue = self._queue
        if len(queue) >= self.max_queued:
            raise QueueFull(f"{len(queue)} requests are queued already (max_queued)")
        if req.properties is not None or req.kind is SUBSCRIBE and not self._v5:
            check_sendable(req, self._v5)     # 5.0 over 3.1.1, properties not valid
        if (queue or self._resend_wait or self.state is not CONNECTED
                or self._closing is not None):
            queue.append(req)
        elif req.kind is not PUBLISH:
            if not self._send_other(req):
                queue.append(req)
        elif not req.qos:
            self._send_qos0(req)
        elif not self._room(req) or not self._send_publish(req):
            queue.append(req)
        return req

    def withdraw(self, req: Request) -> bool:
        """While disconnected: forget a SUBSCRIBE or UNSUBSCRIBE not yet answered, so the
        next connection does not send it again (for a caller that subscribes afresh at each
        CONNACK, as the bridge). False when it is no such request or was answered."""
        if req.kind is PUBLISH or self.state is CONNECTED:
            return False
        if req.packet_id is not None and self._inflight.get(req.packet_id) is req:
            del self._inflight[req.packet_id]
            return True
        if req in self._queue:
            self._queue.remove(req)
            return True
        return False

    # -- sending --------------------------------------------------------------------------------
    def _new_pid(self) -> int | None:
        top = self.packet_ids
        pid = self._next_pid if self._next_pid <= top else 1
        inflight = self._inflight
        if pid in inflight:
            for _ in range(top):
                pid = pid % top + 1
                if pid not in inflight:
                    break
            else:
                return None
        self._next_pid = pid % top + 1
        return pid

    # The first sending of a request (client/sending.py's functions, as methods).
    _send_qos0 = send_qos0
    _send_publish = send_publish
    _send_other = send_other

    def _pump(self) -> None:
        """Send queued requests, in order, while the window allows (first those in flight
        whose sending again waits for it)."""
        wait = self._resend_wait
        while wait and self._closing is None:
            req = wait[0]
            if req.kind is PUBLISH and not self._room(req):
                return
            wait.popleft()
            send_again(self, req)
        queue = self._queue
        while queue and self._closing is None:
            req = queue[0]
            if req.kind is PUBLISH:
                if not req.qos:
                    queue.popleft()
                    self._send_qos0(req)
                    continue
                if not self._room(req) or not self._send_publish(req):
                    return
            elif not self._send_other(req):
                return
            queue.popleft()

    def _answered(self, req: Request) -> None:
        """``req``, in flight, got its last answer."""
        del self._inflight[req.packet_id]
        wait = self._resend_wait
        if wait and req in wait:        # answered before it was sent again (odd, harmless)
            wait.remove(req)
        elif req.kind is PUBLISH:
            self._n_pub -= 1
            self._n_qos2 -= req.qos == 2

    def data_to_send(self, now: float | None = None) -> bytes:
        """The bytes to write (b"" if none); the caller writes them all. ``now`` dates them
        for the keepalive (without it, the next ``tick`` does)."""
        out = self._out
        closing = self._closing
        if closing is not None:
            out.append(closing)
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        self._out = []
        if self._qos0_out:
            self._events.extend(map(Acked, self._qos0_out))
            self._qos0_out = []
        if now is None:
            self._sent_untimed = True
        else:
            self._last_sent = now
        if closing is not None:
            self._lose()        # -> closed
        return data

    def acked_qos0(self) -> list:
        """The events made since the last call of this, ``receive_data`` or ``tick``: QoS 0
        requests handed out (Acked), publishes refused before sending."""
        events = self._events
        self._events = []
        return events

    # -- time -----------------------------------------------------------------------------------
    def tick(self, now: float) -> list:
        """Keepalive and the CONNACK deadline: PINGREQ when nothing went out, or nothing came
        in, for the keepalive; PingTimeout when its PINGRESP is not back, no byte came in, and
        no byte that waited in the driver's buffer before the PINGREQ left (``moved_at``),
        for a keepalive."""
        events = self._events
        self._events = []
        state = self.state
        if state is CONNECTING:
            if now >= self._connack_due:
                events.append(ConnectFailed(None, f"no CONNACK within {self.connect_timeout:g} s"))
                self._lose()
            return events
        if state is not CONNECTED or not self._ka:
            return events
        if self._sent_untimed:
            self._last_sent = now
            self._sent_untimed = False
        if self._ping_due is not None:
            alive = self.moved_at if self.moved_at > self._last_recv else self._last_recv
            if now >= self._ping_due and now < alive + self._ka:
                self._ping_due = alive + self._ka       # slow, not dead
            elif now >= self._ping_due:
                events.append(PingTimeout())
                self._lose()
                self._out = []
            return events
        ka = self._ka
        if now - self._last_sent >= ka or now - self._last_recv >= ka:
            self._out.append(PINGREQ_BYTES)
            self.pings_sent += 1
            self._ping_due = now + ka
        return events

    def next_deadline(self) -> float | None:
        """The ``now`` at which ``tick`` next has work, or None."""
        if self.state is CONNECTING:
            return self._connack_due
        if self.state is not CONNECTED or not self._ka:
            return None
        if self._ping_due is not None:
            return self._ping_due
        return min(self._last_sent, self._last_recv) + self._ka

    # -- receiving ------------------------------------------------------------------------------
    def receive_data(self, data, now: float) -> list:
        """Decode the server's bytes (any split): the events, in order. Acknowledgements the
        server is owed are queued for data_to_send. A protocol error of the server gives
        Disconnected and state "disconnected" (the caller closes the transport); a PUBLISH
        over ``max_packet_size`` gives Oversized and the connection goes on."""
        events = self._events
        self._events = []
        state = self.state
        if state is not CONNECTED and state is not CONNECTING:
            return events
        self._last_recv = now
        while True:     # again for the bytes after an oversized PUBLISH's fixed header
            decoder = self._decoder
            try:
                if state is CONNECTED and len(data) >= 8:
                    pids = decoder.pubacks(data)
                    if pids is not None:
                        for pid in pids:
                            on_ack(self, P.Puback(pid), events)
                        if self._queue or self._resend_wait:
                            self._pump()
                        return events
                for packet in decoder.feed(data):
                    handler = HANDLERS[self.state].get(packet.type)
                    if handler is None:
                        raise ProtocolError(
                            f"{P.NAMES[packet.type]} from the server while {self.state}",
                            rule="MQTT-4.8.0-1", reason=PROTOCOL_ERROR)
                    handler(self, packet, events)
                    if self.state is not CONNECTED and self.state is not CONNECTING:
                        break
            except ProtocolError as exc:
                if (rest := start_skipping(self, exc)) is None:  # (read past: oversize.py)
                    protocol_error(self, exc, events, data)
                    return events
                data = rest
                continue
            break
        if (self._queue or self._resend_wait) and self.state is CONNECTED:
            self._pump()
        return events

    # -- state across processes -------------------------------------------------------------
    def save(self) -> dict:
        """The session as JSON-able data (docs/client.md, "The state file"): what is in flight
        and queued, packet ids, the server's QoS 2 ids awaiting PUBREL. The password and the
        will are not kept: pass them to ``load``."""
        return save_state(self)

    @classmethod
    def load(cls, doc: dict, **options) -> "Connection":
        """A connection with ``save()``'s session; ``options`` (password, will, ...) are
        given to the constructor over what ``doc`` says. ValueError names what is wrong."""
        return load_state(cls, doc, options)
