"""The acknowledgements of QoS 1 and 2: PUBACK, PUBREC, PUBREL, PUBCOMP.

An acknowledgement frees its message's place in the session's window, and the
queue moves on (``broker.pump``). One that does not fit the message sent with its
packet id closes the connection, as Mosquitto does. A PUBREL or PUBREC for no message in
flight is answered all the same; it, and a PUBACK or PUBCOMP for no message in flight, is
charged to the client's control rate (core.dispatch). So are many User Properties in any
packet (``charge_properties``): decoding them costs the loop by their number.
"""

from __future__ import annotations

from edgebroker.errors import PROTOCOL_ERROR, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.encode import encode_ack
from edgebroker.mqtt.encode5 import encode_ack5
from edgebroker.mqtt.properties import USER_PROPERTY
from edgebroker.core.session import AWAIT_ACK, AWAIT_COMP

# What a packet's content costs of the client's control_rate (docs/limits.md, "Control packet
# rate"): one token per USER_PROPERTIES_PER_TOKEN User Properties (none for fewer), and a
# SUBSCRIBE or UNSUBSCRIBE one per FILTERS_PER_TOKEN topic filters (one at least).
USER_PROPERTIES_PER_TOKEN = 100
FILTERS_PER_TOKEN = 10


def charge_properties(client, p) -> None:
    """``p`` (a 5.0 packet) handled: its User Properties charged (core.dispatch calls this
    after each 5.0 packet that may carry them; PUBLISH calls it where it checks them)."""
    props = p.properties
    pairs = None if props is None else props.get(USER_PROPERTY)
    if pairs is not None and len(pairs) >= USER_PROPERTIES_PER_TOKEN:
        client.charge_control(len(pairs) // USER_PROPERTIES_PER_TOKEN,
                              f"{_a(p.type)} of {len(pairs)} User Properties")


def charge_filters(client, p) -> None:
    """A SUBSCRIBE or UNSUBSCRIBE handled: charged by its topic filters."""
    n = len(p.topics)
    client.charge_control(-(-n // FILTERS_PER_TOKEN),
                          f"{_a(p.type)} of {n} topic filters" if n > 1 else "")


def _a(t: int) -> str:
    return ("an " if t == P.UNSUBSCRIBE or t == P.AUTH else "a ") + P.NAMES[t]


def on_puback(client, p) -> None:
    session = client.session
    entry = session.inflight.get(p.packet_id)
    if entry is not None:
        if entry.qos != 1:
            raise _wrong_ack(p, entry)
        del session.inflight[p.packet_id]
        session.inflight_bytes -= entry.message.size
        if entry.group is not None and entry.group_qos == 2:
            client.broker.shared_acked(entry)
        if _more(client, session):
            client.broker.pump(session)
    else:
        client.charge_control()     # no window bounds these: a control packet


def on_pubacks(client, pids) -> int:
    """PUBACKs that came in one read (``Decoder.pubacks``): each as ``on_puback``, and the
    queue moves on once, after them. Those for no message in flight are charged as
    ``on_puback`` charges them: the one that takes the client's last token is the last
    handled. Returns how many were handled (the caller keeps the rest for later)."""
    session = client.session
    inflight = session.inflight
    freed = 0
    strays = 0      # for no message in flight
    allowed = -1    # how many of those the control rate lets through (0: no limit)
    handled = len(pids)
    try:
        for i, pid in enumerate(pids):
            entry = inflight.get(pid)
            if entry is not None:
                if entry.qos != 1:
                    raise _wrong_ack(P.Puback(pid), entry)
                del inflight[pid]
                freed += entry.message.size
                if entry.group is not None and entry.group_qos == 2:
                    client.broker.shared_acked(entry)
            else:
                strays += 1
                if allowed < 0:
                    allowed = client.control_allowed()
                if strays == allowed:
                    handled = i + 1
                    break
    finally:
        session.inflight_bytes -= freed
    if strays:
        client.charge_control(strays)
    if _more(client, session):
        client.broker.pump(session)
    return handled


def _more(client, session) -> bool:
    """Whether a place freed in the window lets more go out: a queue, the log (a cursor),
    shared subscriptions' backlogs, or the rest of a resumed window (core.resume)."""
    return bool(session.queue or session.cursor is not None or session.shared
                or session in client.broker.resends)


def _wrong_ack(p, entry) -> ProtocolError:
    """An acknowledgement that does not fit the message sent with its packet id (a PUBACK
    for QoS 2, a PUBREC for QoS 1, a PUBCOMP before PUBREC): closed, as Mosquitto does."""
    return ProtocolError(f"{P.NAMES[p.type]} for packet id {p.packet_id}, which is a QoS "
                        f"{entry.qos} message{' awaiting PUBREC' if entry.qos == 2 else ''}",
                        rule="MQTT-4.3", reason=PROTOCOL_ERROR)


def on_pubrec(client, p) -> None:
    inflight = client.session.inflight
    pid = p.packet_id
    entry = inflight.get(pid)
    if entry is None:
        # Not in flight (acknowledged already, or lost in a crash): PUBREL lets the
        # client finish its side (MQTT-4.3.3-1), as Mosquitto does.
        client.answer(_unknown_id(client, P.PUBREL, pid))
        client.broker.stats.packets_sent += 1
        client.charge_control()     # no window bounds these: a control packet
        return
    if entry.qos != 2:
        raise _wrong_ack(p, entry)
    if entry.state != AWAIT_COMP:
        entry.state = AWAIT_COMP
        # PUBRELs go out (and are re-sent) in PUBREC order (MQTT-4.6.0-4).
        del inflight[pid]
        inflight[pid] = entry
        _journal(client, "released", pid, entry)
    client.answer(encode_ack(P.PUBREL, pid))
    client.broker.stats.packets_sent += 1


def on_pubrec5(client, p) -> None:
    """A 5.0 PUBREC: a reason code of 0x80 or more ends the exchange there (no PUBREL,
    MQTT-4.3.3); else as in 3.1.1."""
    if p.reason_code < 0x80:
        on_pubrec(client, p)
    else:
        session = client.session
        entry = session.inflight.get(p.packet_id)
        if entry is None:
            client.charge_control()
        elif entry.qos != 2 or entry.state != AWAIT_ACK:
            raise _wrong_ack(p, entry)
        else:
            _complete(client, session, p.packet_id, entry)


def on_pubrel(client, p) -> None:
    awaiting = client.session.awaiting_release
    if client.inherited:
        client.inherited.discard(p.packet_id)   # released: a new message may take the id
    if p.packet_id in awaiting:
        del awaiting[p.packet_id]       # (and its digest)
        _journal(client, "freed", p.packet_id)
        client.answer(encode_ack(P.PUBCOMP, p.packet_id))
    else:
        # Released already (a resend), or never received: PUBCOMP all the same, charged
        # to the control rate, as no window bounds these.
        client.answer(_unknown_id(client, P.PUBCOMP, p.packet_id))
        client.charge_control()
    client.broker.stats.packets_sent += 1


def _unknown_id(client, packet_type: int, pid: int) -> bytes:
    """The PUBREL or PUBCOMP that answers a PUBREC or PUBREL for an id the session does not
    hold: a 5.0 client is told so with 0x92 Packet Identifier not found, as Mosquitto does."""
    if client.v5 is not None:
        return encode_ack5(packet_type, pid, 0x92)
    return encode_ack(packet_type, pid)


def forget_inherited(client, awaiting: dict) -> bool:
    """A client's QoS 2 PUBLISH would go past ``receive_maximum`` (a 5.0 client's Receive
    Maximum): if an id held from before this connection still awaits its PUBREL, forget it
    and let the PUBLISH in (True).
    A client resends its PUBRELs (and the PUBLISHes whose PUBREC it did not get, with DUP)
    first thing after reconnecting, so an id it has neither released nor sent again on
    this connection (those leave ``client.inherited``) was finished on its side: the
    snapshot kept it through a crash, or the client let it go. It was routed at first
    receipt, so forgetting it loses nothing; a late PUBREL for it still gets its PUBCOMP.
    An id the client sent again is kept: forgetting it would take its next re-send (DUP,
    after another reconnect) for a new message, delivered twice."""
    inherited = client.inherited
    while inherited:
        pid = inherited.pop()
        if pid in awaiting:
            del awaiting[pid]
            _journal(client, "freed", pid)
            client.warn_once("qos2_inherited_forgotten",
                             "QoS 2 packet id %d held from before this connection, not "
                             "released by the client: forgotten, so that it does not count "
                             "against receive_maximum", pid)
            return True
    return False


def on_pubcomp(client, p) -> None:
    session = client.session
    entry = session.inflight.get(p.packet_id)
    if entry is not None:
        if entry.qos != 2 or entry.state != AWAIT_COMP:
            raise _wrong_ack(p, entry)
        _complete(client, session, p.packet_id, entry)
    else:
        client.charge_control()     # no window bounds these: a control packet


def _complete(client, session, pid: int, entry) -> None:
    """A QoS 2 exchange the broker started is over: its id is free, the queue moves on."""
    del session.inflight[pid]
    _journal(client, "completed", pid, entry)
    session.inflight_bytes -= entry.message.size
    if _more(client, session):
        client.broker.pump(session)


def _journal(client, step: str, pid: int, entry=None) -> None:
    """A persistent session's QoS 2 exchange moved, or that of a message a shared subscription
    group gave (``entry``'s group; any session): journaled (core.exchanges)."""
    session = client.session
    exchanges = client.broker.exchanges
    if exchanges is not None and (not session.clean
                                  or entry is not None and entry.group is not None):
        getattr(exchanges, step)(session.client_id, pid)
