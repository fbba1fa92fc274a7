"""Per-packet handlers: plain functions called as ``handler(client, packet)``.

One module per packet family: ``connect`` (CONNECT and the password check's answer,
PINGREQ, DISCONNECT), ``publish``, ``acks`` (PUBACK, PUBREC, PUBREL, PUBCOMP),
``subscribe`` (SUBSCRIBE, UNSUBSCRIBE). Which handler takes which packet in which
state of the connection is decided in one place, the tables of ``core.dispatch``.
Handlers change the connection's state through ``Client`` (``core.client``) and act
on the broker through ``client.broker``; they never import either.
"""
