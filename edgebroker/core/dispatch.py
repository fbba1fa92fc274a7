"""Which handler takes which packet, in each state of a connection: the handler tables.

``Client._handle`` looks a packet's handler up in its current table and calls it as
``handler(client, packet)`` (one dict lookup per packet); the table is swapped when the
connection's state changes, so no handler checks the state. State rules, in prose:

- Before CONNECT only CONNECT is legal (MQTT-3.1.0-1); a second CONNECT is a
  violation (MQTT-3.1.0-2). The handler table is swapped at CONNECT, so the
  check costs nothing per packet.
- Packets only a server sends (CONNACK, SUBACK, UNSUBACK, PINGRESP) are
  violations when they arrive here (MQTT-4.8.0-1).
- Any violation closes the connection and, once connected, publishes the
  will. DISCONNECT discards the will and closes.
- While a CONNECT's password check runs (the client is "authenticating"),
  later packets are held and replayed in order once CONNACK 0 is sent.
- With messages_rate or bytes_rate set, PUBLISH is charged to the client's
  publish rate after it is handled (``CONNECTED_RATED``).
- Once connected, the other packets a client may send at will (``CONTROL``: PINGREQ,
  SUBSCRIBE, UNSUBSCRIBE, AUTH) are charged to its control_rate after they are handled
  (``Client.charge_control``; a SUBSCRIBE or UNSUBSCRIBE by its number of filters; an
  acknowledgement for no message in flight too, in core.handlers.acks). PUBLISH and the
  acknowledgements of messages in flight are not: the rates above and the windows bound
  those. Many User Properties cost tokens in any packet (``acks.charge_properties``).
- An MQTT 5.0 connection has tables of its own (``CONNECTED5``): its PUBLISH, PUBREC,
  SUBSCRIBE, UNSUBSCRIBE and DISCONNECT say more, and AUTH exists (re-authentication).
- A 5.0 CONNECT with an Authentication Method runs its exchange before CONNACK
  (``AUTH_EXCHANGE``): only AUTH and DISCONNECT are legal until then (MQTT-3.1.2-30).
"""

from __future__ import annotations

from edgebroker.errors import PROTOCOL_ERROR, ProtocolError
from edgebroker.mqtt import packets as P
from edgebroker.core.handlers import acks, auth, connect, publish, subscribe


def on_second_connect(client, p) -> None:
    raise ProtocolError("second CONNECT on one connection", rule="MQTT-3.1.0-2",
                        reason=PROTOCOL_ERROR)


def before_connect(client, p) -> None:
    raise ProtocolError(f"{P.NAMES[p.type]} before CONNECT", rule="MQTT-3.1.0-1",
                        reason=PROTOCOL_ERROR)


def server_only(client, p) -> None:
    raise ProtocolError(f"{P.NAMES[p.type]} is sent only by a server", rule="MQTT-4.8.0-1",
                        reason=PROTOCOL_ERROR)


BEFORE_CONNECT = {t: before_connect for t in P.NAMES}
BEFORE_CONNECT[P.CONNECT] = connect.on_connect

# CONNECT received, password check running: later packets wait (a second CONNECT
# is still a violation, as are server-only packets).
AUTHENTICATING = {t: connect.hold for t in P.NAMES}
AUTHENTICATING[P.CONNECT] = on_second_connect

CONNECTED = {
    P.CONNECT: on_second_connect,
    P.PUBLISH: publish.on_publish,
    P.PUBACK: acks.on_puback,
    P.PUBREC: acks.on_pubrec,
    P.PUBREL: acks.on_pubrel,
    P.PUBCOMP: acks.on_pubcomp,
    P.SUBSCRIBE: subscribe.on_subscribe,
    P.UNSUBSCRIBE: subscribe.on_unsubscribe,
    P.PINGREQ: connect.on_pingreq,
    P.DISCONNECT: connect.on_disconnect,
}
for _t in P.SERVER_TO_CLIENT_ONLY:
    CONNECTED[_t] = server_only
    BEFORE_CONNECT[_t] = before_connect
    AUTHENTICATING[_t] = server_only

# The packets charged to the control rate (limits.control_rate) once connected.
CONTROL = (P.PINGREQ, P.SUBSCRIBE, P.UNSUBSCRIBE, P.AUTH)


# How each control packet is charged once handled (by its content: core.handlers.acks).
_CHARGES = {P.SUBSCRIBE: acks.charge_filters, P.UNSUBSCRIBE: acks.charge_filters}


def _charged(handler, t: int):
    """``handler``, then the packet charged to the client's control rate."""
    charge = _CHARGES.get(t)
    if charge is None:      # PINGREQ, AUTH
        def charged(client, p) -> None:
            handler(client, p)
            client.charge_control()
    else:
        def charged(client, p) -> None:
            handler(client, p)
            charge(client, p)
    charged.__name__ = charged.__qualname__ = f"charged_{handler.__name__}"
    charged.charges = True
    return charged


def _charging(table: dict) -> None:
    """Charge ``table``'s control packets (those not charged already)."""
    for t in CONTROL:
        handler = table.get(t)
        if handler is not None and not getattr(handler, "charges", False):
            table[t] = _charged(handler, t)


# The same, with the publish rate charged (limits.messages_rate / bytes_rate set).
CONNECTED_RATED = dict(CONNECTED)
CONNECTED_RATED[P.PUBLISH] = publish.on_publish_rated
_charging(CONNECTED)
_charging(CONNECTED_RATED)


# CONNECT with an Authentication Method, its exchange running (core/handlers/auth.py).
AUTH_EXCHANGE = {t: auth.before_connack for t in P.NAMES}
AUTH_EXCHANGE[P.CONNECT] = on_second_connect
AUTH_EXCHANGE[P.AUTH] = auth.on_auth_exchange
AUTH_EXCHANGE[P.DISCONNECT] = auth.on_disconnect_exchange
for _t in P.SERVER_TO_CLIENT_ONLY:
    AUTH_EXCHANGE[_t] = server_only

# MQTT 5.0 connections (core.mqtt5): the packets whose 5.0 form asks for more.
CONNECTED5 = dict(CONNECTED)
CONNECTED5.update({
    P.PUBLISH: publish.on_publish5,
    P.PUBREC: acks.on_pubrec5,
    P.SUBSCRIBE: subscribe.on_subscribe5,
    P.UNSUBSCRIBE: subscribe.on_unsubscribe5,
    P.DISCONNECT: connect.on_disconnect5,
    P.AUTH: auth.on_auth,
})
CONNECTED5_RATED = dict(CONNECTED5)
CONNECTED5_RATED[P.PUBLISH] = publish.on_publish5_rated
_charging(CONNECTED5)
_charging(CONNECTED5_RATED)

# The 5.0 packets besides PUBLISH (charged where its properties are checked, on the hot path)
# that may carry User Properties and do not end the connection: charged by their number too.
_WITH_USER_PROPERTIES = (P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP, P.SUBSCRIBE, P.UNSUBSCRIBE,
                         P.AUTH)


def _charging_properties(handler):
    """``handler``, then the packet's User Properties charged (``acks.charge_properties``)."""
    def charged(client, p) -> None:
        handler(client, p)
        acks.charge_properties(client, p)
    charged.__name__ = charged.__qualname__ = f"{handler.__name__}_properties"
    return charged


_wrapped: dict = {}      # one wrapper per handler, whichever table it is in
for _table in (CONNECTED5, CONNECTED5_RATED):
    for _t in _WITH_USER_PROPERTIES:
        _h = _table[_t]
        _table[_t] = _wrapped.get(_h) or _wrapped.setdefault(_h, _charging_properties(_h))

# A read of PUBACKs only goes to ``acks.on_pubacks`` (core.client) when the connection's
# PUBACK handler is one of these (a PUBACK that carries properties is not read that way).
PUBACKS_TOGETHER = (acks.on_puback, _wrapped[acks.on_puback])
