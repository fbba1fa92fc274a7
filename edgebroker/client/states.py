"""A client connection's states (``Connection.state``) and the moves between them.

States and the moves between them (``MOVES``; any other move is the caller's error):

* disconnected -> connecting: ``connect(now)`` on a fresh transport queues CONNECT.
* connecting -> connected: a CONNACK with success. With Session Present 1 the PUBLISHes
  not yet acknowledged are sent again with DUP=1 (a PUBREL for those the server already
  has), SUBSCRIBE/UNSUBSCRIBE too, all in the order first sent; with Session Present 0 the
  server has no session, so they all go out again as new requests (DUP=0, new packet ids,
  a QoS 2 publish from its PUBLISH even past PUBREC: at least once). Then the queued
  requests.
* connecting -> disconnected: a refusal (ConnectFailed), no CONNACK within
  ``connect_timeout``, a server DISCONNECT or protocol error, ``connection_lost()``.
* connected -> disconnected: a server DISCONNECT (Disconnected), a protocol error of the
  server (Disconnected; in 5.0 a DISCONNECT with the reason code is queued), no PINGRESP
  within the keepalive (PingTimeout), ``connection_lost()``.
* connecting/connected -> closed: ``disconnect()`` queues DISCONNECT; "closed" once
  ``data_to_send`` has handed it out. disconnected -> closed: ``disconnect()`` at once.
* closed -> connecting: ``connect(now)`` again.
"""

DISCONNECTED = "disconnected"
CONNECTING = "connecting"
CONNECTED = "connected"
CLOSED = "closed"

MOVES = {
    DISCONNECTED: frozenset((CONNECTING, CLOSED)),
    CONNECTING: frozenset((CONNECTED, DISCONNECTED, CLOSED)),
    CONNECTED: frozenset((DISCONNECTED, CLOSED)),
    CLOSED: frozenset((CONNECTING, CLOSED)),
}
