"""What `edgebroker pub` and `edgebroker sub` share: mosquitto_pub/sub's connection options, the
client they make (a Dialer and a Connection of edgebroker.client), and the event loop that
drives it (``Session``).

The options and their defaults are mosquitto_pub/sub's (docs/client-cli.md lists them and the
few differences). Exit codes as theirs: 0 done; the CONNACK's return or reason code when the
broker refuses the connection (5 not authorised in 3.1.1, 135 in 5.0); 1 for a network, TLS
or protocol error; 27 when ``sub -W`` times out; usage errors are the project's 2
(``check_options``: before anything is read or sent).

``Session`` runs edgebroker.client's synchronous event loop (client/loop.py: no threads) over
the Dialer's transports (TCP, TLS, WebSocket, Unix). As mosquitto_pub/sub, a command whose
first connection fails exits with its code; once connected, a lost link is connected again
(policy ``after_first_success``, back-off 0.5 s doubling up to 5 s, with full jitter), and
the requests not yet acknowledged are sent again on the new connection.
"""

from __future__ import annotations

import argparse
import os
import sys

from edgebroker.cli.options import seconds
from edgebroker.errors import REASON_NAMES
from edgebroker.mqtt import packets as P
from edgebroker.mqtt.properties import SESSION_EXPIRY

# mosquitto's texts for the 3.1.1 CONNACK return codes.
_REFUSED_311 = {1: "unacceptable protocol version", 2: "identifier rejected",
                3: "broker unavailable", 4: "bad user name or password", 5: "not authorised"}
PROTOCOLS = {"5": 5, "mqttv5": 5, "311": 4, "mqttv311": 4, "31": 3, "mqttv31": 3}
TIMED_OUT = 27      # mosquitto_sub -W (ETIMEDOUT)
# Reconnection after a loss: full-jitter back-off from 0.5 s, waits of at most 5 s (libmosquitto
# retries every second by default; a command line user waits for the broker to come back).
RECONNECT_BASE = 0.5
RECONNECT_CAP = 5.0


class Exit(Exception):
    """End the command with ``code``, after printing ``message`` (if any) to stderr."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


def add_options(p: argparse.ArgumentParser) -> None:
    """The connection options of both commands (``-h`` is the host, as in mosquitto's)."""
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("-h", "--host", default="localhost", help="broker host (default localhost)")
    p.add_argument("-p", "--port", type=int, help="port (default 1883, 8883 with TLS)")
    p.add_argument("-L", "--url", metavar="URL",
                   help="mqtt[s]://[user[:password]@]host[:port]/topic or ws[s]://"
                        "[user[:password]@]host[:port][/path] (then the topic is -t's)")
    p.add_argument("--unix", metavar="PATH", help="connect through this Unix socket")
    p.add_argument("-i", "--id", default=None, help="client id (default: the broker's "
                                                   "choice; edgebroker_<tool>_<pid> for 3.1)")
    p.add_argument("-I", "--id-prefix", metavar="PREFIX", help="client id PREFIX + the pid")
    p.add_argument("-u", "--username")
    p.add_argument("-P", "--pw", dest="password", metavar="PASSWORD")
    p.add_argument("-k", "--keepalive", type=int, default=60, help="seconds (default 60)")
    p.add_argument("-V", "--protocol-version", default="311", choices=sorted(PROTOCOLS),
                   metavar="V", help="5, 311 or 31 (also mqttv5, mqttv311, mqttv31)")
    p.add_argument("-c", "--disable-clean-session", action="store_true",
                   help="keep the session (needs -i or -I)")
    p.add_argument("-q", "--qos", type=int, default=0, choices=(0, 1, 2))
    p.add_argument("-d", "--debug", action="store_true", help="print what is sent and "
                                                             "received (to stderr)")
    p.add_argument("--quiet", action="store_true", help="print no error messages")
    p.add_argument("--cafile", help="trust the CAs in this file (turns TLS on)")
    p.add_argument("--cert", help="client certificate (PEM)")
    p.add_argument("--key", help="client certificate's key (PEM)")
    p.add_argument("--insecure", action="store_true",
                   help="TLS without checking the server's certificate and name")
    p.add_argument("--will-topic")
    p.add_argument("--will-payload")
    p.add_argument("--will-qos", type=int, choices=(0, 1, 2))
    p.add_argument("--will-retain", action="store_true")
    p.add_argument("--timeout", type=seconds, default=10.0, metavar="S",
                   help="seconds to connect (default 10)")


def check_options(args, tool: str) -> None:
    """Exit(2), a usage error, for an option value no connection could use: a -L URL that does
    not parse, a port or keepalive out of range, a --will-topic that is not a topic name, the
    will's payload, QoS or retain without its topic (no will would be set)."""
    from edgebroker.errors import ProtocolError
    from edgebroker.mqtt.topics import validate_topic_name
    if args.url:
        _parse_url(args, tool)
    if args.port is not None and not 1 <= args.port <= 65535:
        raise Exit(2, f"edgebroker {tool}: -p {args.port}: a port is 1 to 65535")
    if not 0 <= args.keepalive <= 65535:
        raise Exit(2, f"edgebroker {tool}: -k {args.keepalive}: the keepalive is 0 to 65535 "
                      f"seconds")
    if args.will_topic:
        try:
            validate_topic_name(args.will_topic)
        except ProtocolError as exc:
            raise Exit(2, f"edgebroker {tool}: --will-topic: {exc}") from None
    else:
        given = [what for what, value in (("payload", args.will_payload), ("QoS", args.will_qos),
                                          ("retain", args.will_retain or None))
                 if value is not None]
        if given:       # mosquitto_pub's words
            raise Exit(2, f"edgebroker {tool}: will {' and '.join(given)} given, but no will "
                          f"topic given (--will-topic)")


def _parse_url(args, tool: str):
    from edgebroker.client.address import parse_url
    from edgebroker.errors import AddressError
    try:
        return parse_url(args.url)
    except AddressError as exc:
        raise Exit(2, f"edgebroker {tool}: -L {exc}") from None


def url_topic(args, tool: str) -> str | None:
    """The topic of an mqtt[s]:// -L URL (mosquitto's form), or None."""
    if not args.url:
        return None
    address = _parse_url(args, tool)
    return address.path or None if not address.websocket else None


def make_client(args, tool: str, auto_ack: bool = True):
    """(Dialer, Connection) from the options (``check_options`` passed); Exit(2) for options
    that do not fit together. ``auto_ack=False``: the command acknowledges each QoS 1/2
    message itself (``Connection.ack``) once it has handled it."""
    from edgebroker.client.address import Address, Dialer
    from edgebroker.client.connection import Connection
    protocol = PROTOCOLS[args.protocol_version]
    if args.url:
        address = _parse_url(args, tool)
        username = args.username or address.username
        password = args.password or address.password
    elif args.unix:
        address, username, password = Address("unix", unix_path=args.unix), None, None
    else:
        tls = bool(args.cafile or args.insecure)
        address = Address("mqtt", args.host, args.port or (8883 if tls else 1883))
    username = args.username if not args.url else username
    password = args.password if not args.url else password
    client_id = args.id
    if client_id is None and args.id_prefix:
        client_id = f"{args.id_prefix}{os.getpid()}"
    if client_id is None:
        if args.disable_clean_session:
            raise Exit(2, f"edgebroker {tool}: -c needs a client id (-i or -I)")
        client_id = f"edgebroker_{tool}_{os.getpid()}" if protocol == 3 else ""
    will = None
    if args.will_topic:
        will = P.Will(args.will_topic, os.fsencode(args.will_payload or ""),
                      args.will_qos or 0, args.will_retain)
    from edgebroker.client.tls import TLSError
    try:
        dialer = Dialer(address, timeout=args.timeout, cafile=args.cafile, certfile=args.cert,
                        keyfile=args.key, verify=not args.insecure,
                        tls=bool(args.cafile or args.insecure or args.cert) or None)
    except TLSError as exc:
        raise Exit(1, f"Error: {exc}") from None
    if isinstance(password, str):   # the command line's bytes as given (as mosquitto_pub)
        password = os.fsencode(password)
    from edgebroker.client.requests import ClientError
    # -c over 5.0: the session outlives the connection only with a Session Expiry Interval;
    # mosquitto_pub/sub send the largest (never expires), and so does this.
    keep = args.disable_clean_session and protocol == 5
    try:
        conn = Connection(client_id, protocol, clean_start=not args.disable_clean_session,
                          keepalive=args.keepalive, username=username, password=password,
                          will=will, properties={SESSION_EXPIRY: 0xFFFFFFFF} if keep else None,
                          max_inflight=getattr(args, "max_inflight", 20),
                          max_queued=1000, connect_timeout=args.timeout, auto_ack=auto_ack)
    except ClientError as exc:
        raise Exit(2, f"edgebroker {tool}: {exc}") from None
    return dialer, conn


def refusal(code: int | None, reason: str, protocol: int) -> Exit:
    """The Exit of a refused connection: mosquitto's line and code."""
    if code is None:
        return Exit(1, f"Error: {reason}")
    if protocol == 5:
        return Exit(code, f"Connection error: {REASON_NAMES.get(code, reason)}")
    return Exit(code, f"Connection error: Connection Refused: "
                      f"{_REFUSED_311.get(code, reason)}.")


class Session:
    """The event loop of one command (client/loop.py, no threads) over the Dialer's
    transports: reconnects after a loss once a first connection succeeded (mosquitto's
    clients do), prints the connection's changes with ``-d``, and turns a failed first
    connection into its Exit. ``auto_ack``: as ``make_client``'s."""

    def __init__(self, args, tool: str, auto_ack: bool = True):
        from edgebroker.client.backoff import AFTER_FIRST_SUCCESS
        from edgebroker.client.loop import EventLoop
        dialer, self.conn = make_client(args, tool, auto_ack)
        self.loop = EventLoop(transport_factory=dialer, connection=self.conn,
                              reconnect=AFTER_FIRST_SUCCESS, connect_timeout=args.timeout,
                              backoff_base=RECONNECT_BASE, backoff_cap=RECONNECT_CAP)
        self.debug = args.debug
        self.up_once = False      # a CONNACK with success came (then losses reconnect)
        self.say("sending CONNECT")

    def say(self, text: str) -> None:
        if self.debug:
            name = self.conn.client_id or "(null)"
            print(f"Client {name} {text}", file=sys.stderr, flush=True)

    def next(self, timeout: float | None = None):
        """The loop's next event (None when ``timeout`` s passed without one); Exit when the
        first connection fails."""
        from edgebroker.client.events import ConnectFailed, Connected, Disconnected, PingTimeout
        event = self.loop.poll(timeout)
        kind = type(event)
        if kind is Connected:
            self.up_once = True
            self.say(f"received CONNACK ({event.reason_code})")
        elif kind is ConnectFailed:
            if not self.up_once:
                raise refusal(event.reason_code, event.reason, self.conn.protocol)
            self.say(f"could not connect again ({event.reason}); trying again")
        elif kind is Disconnected or kind is PingTimeout:
            reason = "no PINGRESP in time" if kind is PingTimeout else event.reason
            if not self.up_once:
                raise Exit(1, f"Error: {reason}")
            self.say(f"lost the connection ({reason}); reconnecting")
        return event

    def close(self) -> None:
        """DISCONNECT after what is buffered (for 2 s at most), then close."""
        try:
            if self.conn.state == "connected":
                self.say("sending DISCONNECT")
            self.loop.disconnect()
        finally:
            self.loop.close()


def run_command(body, args) -> int:
    """Run ``body(args)`` and turn an Exit into its message and code."""
    try:
        return body(args)
    except Exit as exc:
        if exc.message and not args.quiet:
            print(exc.message, file=sys.stderr)
        return exc.code
