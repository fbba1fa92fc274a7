"""When a bridge connects again (``Bridge`` takes these methods): the client library's
back-off (client/backoff.py's ``Backoff``: each failure in a row doubles the longest wait,
from ``reconnect_min`` up to ``reconnect_max``, the wait drawn between ``reconnect_min`` and
it), and what the log says of it.

The count of failures starts again only once a connection lasted ``STABLE_AFTER`` seconds
past its CONNACK, as in the client library: a remote that ends the link soon after each
CONNACK (another gateway connected with the same client id, a message larger than a 3.1.1
remote takes, which it answers by closing the link) meets a growing wait, not a reconnection
every ``reconnect_min``. Such a run of short links is logged once (again when the reason
changes), not at each loss; a connection that failed is logged once per reason.

A host name may resolve to several addresses (AAAA and A records: an IPv6 address first,
which a gateway without IPv6 cannot reach): as ``socket.create_connection`` does, a
connection attempt tries each in getaddrinfo's order, the next one at once when one fails
before the link is up (TCP and TLS), each within ``connect_timeout``; only when all failed
does the back-off wait. The name is resolved again at each attempt.

Over MQTT 3.1.1 the CONNECT carries Mosquitto's bridge marker (``try_private``: protocol
level 0x84); a remote that does not know it answers CONNACK 0x01 (unacceptable protocol
version): logged once, and from then on, for the rest of the run, the bridge connects as a
plain 3.1.1 client (docs/bridge.md, "Loops").
"""

from __future__ import annotations

import logging

from edgebroker.bridge.link import Resolver, numeric_address
from edgebroker.client.backoff import ALWAYS, STABLE_AFTER, Backoff

log = logging.getLogger("edgebroker.bridge")


class Reconnecting:
    """``Bridge``'s side of it (a mixin over its state)."""

    def init_reconnect(self) -> None:
        config = self.config
        self.backoff = Backoff(ALWAYS, config.reconnect_min, config.reconnect_max,
                               floor=True)
        self.short_links = 0        # links lost within STABLE_AFTER of their CONNACK
        self._short_reason = None   # the reason logged for the current run of them
        self._addresses: list = []  # the host's addresses this attempt has not tried yet

    def next_address(self):
        """The (family, sockaddr) to connect to: the host's address in digits, else the next
        one its name resolved to; None while the name is being resolved (``deliver`` comes
        back once it is); an error text when it cannot be resolved."""
        if self._addresses:
            return self._addresses.pop(0)
        address = numeric_address(self.host, self.port)
        if address is not None:
            return address
        resolver = self.resolver
        if resolver is None:
            self.state = "resolving"
            self.resolver = Resolver(self.host, self.port, self.wake)
            return None
        self.resolver = None
        if isinstance(resolver.result, str):
            return resolver.result
        first, *self._addresses = resolver.result
        return first

    def marker_refused(self, reason: str) -> None:
        """The remote refused the CONNECT with the bridge marker: the next ones go without."""
        self.conn.bridge_marker = False
        self.inbound.as_published = self.inbound.v5
        self.last_error = f"ConnectFailed: {reason}"    # (logged here, not by _failed)
        log.warning("bridge %s: %s refused the bridge marker (protocol level 0x84, "
                    "try_private) with CONNACK 0x01 (unacceptable protocol version): it is no "
                    "Mosquitto-like broker; connecting again as a plain MQTT 3.1.1 client for "
                    "the rest of this run. Without the marker the remote sends the bridge back "
                    "what it published there (published here once more), and its live "
                    "messages come without the retain flag; another bridge whose rules cover "
                    "the same topics forwards those echoes, which can go round for ever "
                    "(docs/bridge.md, Loops). Set try_private = false for this remote, or use "
                    "protocol_version = 5", self.name, self.config.address)

    def _up(self) -> None:
        """A CONNACK with success came."""
        self.backoff.succeeded(self.clock())

    def _failed(self, reason: str) -> None:
        """The connection attempt or the link failed: try again after a jittered back-off."""
        if self.state == "stopped":
            return
        if self.state == "connecting" and self._addresses:
            log.debug("bridge %s: %s (%s); trying its next address %s", self.name,
                      self.config.address, reason, self._addresses[0][1][0])
            self._give_up.cancel()
            self._connect()
            return
        now = self.clock()
        if self.state == "up":
            self._lost(reason, now)
        elif reason != self.last_error:
            log.warning("bridge %s: cannot connect to %s (%s); retrying with back-off up to "
                        "%g s (logged again when the reason changes)", self.name,
                        self.config.address, reason, self.config.reconnect_max)
        self.last_error = reason
        self.state = "down"
        self._give_up.cancel()
        self._tick.cancel()
        self._retry.start(self.broker, now + self.backoff.delay())

    def _lost(self, reason: str, now: float) -> None:
        """The link, up, was lost: logged once per run of short links (and reason)."""
        since = self.backoff.up_since
        lasted = now - since if since is not None else 0.0
        if self.backoff.lost(now):
            self._short_reason = None
            log.warning("bridge %s: link to %s lost (%s); reconnecting", self.name,
                        self.config.address, reason)
            return
        self.short_links += 1
        if reason == self._short_reason:
            log.debug("bridge %s: link to %s lost again %.1f s after its CONNACK (%s)",
                      self.name, self.config.address, lasted, reason)
            return
        self._short_reason = reason
        # What makes a remote close links soon after their CONNACK (not a keepalive timeout
        # or a reset: the remote stopped or went away)
        why = (" (another client with the same client id? over 3.1.1, a message larger than "
               "the remote takes?)" if reason == "the remote closed the connection" else "")
        log.warning("bridge %s: link to %s lost %.1f s after its CONNACK (%s; cursor at log "
                    "offset %d); while links end within %g s of their CONNACK the wait "
                    "before reconnecting doubles up to reconnect_max (%g s), and this is "
                    "logged again only when the reason changes%s",
                    self.name, self.config.address, lasted, reason, self.outbound.cursor,
                    STABLE_AFTER, self.config.reconnect_max, why)
