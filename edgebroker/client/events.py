"""What a client connection reports (``Connection.receive_data``, ``tick``, ``acked_qos0``)
and the event loop hands on: plain objects with ``__slots__``, one class per kind.

The loop (edgebroker/client/loop.py) adds nothing to these: a user of the loop sees the same
events as a user of the sans-I/O connection, in the order the connection made them.
"""

from __future__ import annotations


class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None


class Connected(Event):
    """The server accepted the connection (CONNACK with success)."""
    __slots__ = ("session_present", "reason_code", "properties")

    def __init__(self, session_present: bool, reason_code: int = 0,
                 properties: dict | None = None):
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = properties


class ConnectFailed(Event):
    """The server refused the connection (CONNACK with an error: ``reason_code`` is the 3.1.1
    return code or the 5.0 reason code), or no CONNACK came in time (``reason_code`` None)."""
    __slots__ = ("reason_code", "reason")

    def __init__(self, reason_code: int | None, reason: str):
        self.reason_code = reason_code
        self.reason = reason


class Message(Event):
    """A PUBLISH from the server (a QoS 2 message once, however often it is sent)."""
    __slots__ = ("topic", "payload", "qos", "retain", "dup", "properties", "packet_id")

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 dup: bool = False, properties: dict | None = None,
                 packet_id: int | None = None):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.properties = properties
        self.packet_id = packet_id


class Oversized(Event):
    """A PUBLISH from the server larger than the client's ``max_packet_size`` (``size`` bytes,
    over ``limit``): read past without its payload, and acknowledged as a message is (at once,
    or by ``ack()`` with ``auto_ack=False``): it can never be taken, and left unacknowledged
    the server would send it again first at every connection (docs/client.md). ``topic``: its
    first 256 bytes (then "...")."""
    __slots__ = ("topic", "size", "limit", "qos", "retain", "dup", "packet_id")

    def __init__(self, topic: str, size: int, limit: int, qos: int = 0, retain: bool = False,
                 dup: bool = False, packet_id: int | None = None):
        self.topic = topic
        self.size = size
        self.limit = limit
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id


class Acked(Event):
    """A publish request is done: QoS 1 PUBACK, QoS 2 PUBCOMP (or a PUBREC with an error),
    QoS 0 once its bytes were handed out; ``reason_code`` >= 0x80 when the server refused it
    (5.0), or when the client refused to send it (the server's Maximum QoS, Retain Available
    or Maximum Packet Size, see docs/client.md). ``unlisted``: the server's code is one MQTT 5.0
    does not allow in that PUBACK or PUBREC (Mosquitto 2.0's 0x95 for a message over its
    ``message_size_limit``), taken as its refusal; it tells such a code from the client's own
    refusals before sending (0x95, 0x9B, 0x9A, 0x94)."""
    __slots__ = ("request", "reason_code", "unlisted")

    def __init__(self, request, reason_code: int = 0, unlisted: bool = False):
        self.request = request
        self.reason_code = reason_code
        self.unlisted = unlisted


class Subscribed(Event):
    """SUBACK: ``granted`` holds a return/reason code per filter (0-2: the QoS granted)."""
    __slots__ = ("request", "granted")

    def __init__(self, request, granted: list[int]):
        self.request = request
        self.granted = granted


class Unsubscribed(Event):
    """UNSUBACK: ``reason_codes`` one per filter (5.0); 3.1.1 carries none (an empty list)."""
    __slots__ = ("request", "reason_codes")

    def __init__(self, request, reason_codes: list[int]):
        self.request = request
        self.reason_codes = reason_codes


class Disconnected(Event):
    """The connection ended: a DISCONNECT from the server (``reason_code`` its reason code),
    a protocol error of the server (the reason code sent back, ``reason`` what was wrong), or,
    from the loop, the link broke (``reason_code`` None)."""
    __slots__ = ("reason_code", "reason")

    def __init__(self, reason_code: int | None, reason: str):
        self.reason_code = reason_code
        self.reason = reason


class PingTimeout(Event):
    """No PINGRESP within the keepalive after a PINGREQ: the link is taken as dead (the
    connection is then "disconnected"; the loop closes the transport and reconnects)."""
    __slots__ = ()


class RunResult:
    """What ``run`` did: ``done`` the answers (Acked, Subscribed, Unsubscribed) to the batch's
    requests, in order; ``pending`` the batch's requests taken and not answered when it
    returned; ``rest`` an iterator over those it had not taken yet (empty when all were);
    ``events`` everything else that happened meanwhile (messages, connection changes)."""
    __slots__ = ("done", "pending", "rest", "taken_all", "events")

    def __init__(self):
        self.done: list = []
        self.pending: list = []
        self.rest = iter(())
        self.taken_all = True
        self.events: list = []

    @property
    def complete(self) -> bool:
        """Every request of the batch taken and answered."""
        return not self.pending and self.taken_all

    def __repr__(self) -> str:
        return (f"RunResult({len(self.done)} done, {len(self.pending)} pending, "
                f"{'' if self.taken_all else 'more not taken, '}{len(self.events)} other events)")
