"""What `edgebroker pub` and `edgebroker sub` share: mosquitto_pub/sub's connection options, the
client they make (a Dialer and a Connection of edgebroker.client), and the link that drives it.

The options and their defaults are mosquitto_pub/sub's (docs/client-cli.md lists them and the
few differences). Exit codes as theirs: 0 done; the CONNACK's return or reason code when the
broker refuses the connection (5 not authorised in 3.1.1, 135 in 5.0); 1 for a network, TLS
or protocol error; 27 when ``sub -W`` times out; usage errors are the project's 2.

``Link`` drives one client without threads: one ``select.poll`` per step over the transport
(read, and write while bytes wait), with the keepalive ticked at the connection's deadlines.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time

from edgebroker.errors import REASON_NAMES
from edgebroker.mqtt import packets as P

# mosquitto's texts for the 3.1.1 CONNACK return codes.
_REFUSED_311 = {1: "unacceptable protocol version", 2: "identifier rejected",
                3: "broker unavailable", 4: "bad user name or password", 5: "not authorised"}
PROTOCOLS = {"5": 5, "mqttv5": 5, "311": 4, "mqttv311": 4, "31": 3, "mqttv31": 3}
TIMED_OUT = 27      # mosquitto_sub -W (ETIMEDOUT)
READ_SIZE = 256 * 1024


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
                   help="keep the session (needs -i)")
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
    p.add_argument("--will-payload", default="")
    p.add_argument("--will-qos", type=int, default=0, choices=(0, 1, 2))
    p.add_argument("--will-retain", action="store_true")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to connect and to finish (default 10)")


def url_topic(args) -> str | None:
    """The topic of an mqtt[s]:// -L URL (mosquitto's form), or None."""
    if not args.url:
        return None
    from edgebroker.client.address import parse_url
    address = parse_url(args.url)
    return address.path or None if not address.websocket else None


def make_client(args, tool: str):
    """(Dialer, Connection) from the options; Exit(2) for options that do not fit."""
    from edgebroker.client.address import Address, Dialer, parse_url
    from edgebroker.client.connection import Connection
    protocol = PROTOCOLS[args.protocol_version]
    if args.url:
        address = parse_url(args.url)
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
        will = P.Will(args.will_topic, args.will_payload.encode(), args.will_qos,
                      args.will_retain)
    from edgebroker.client.tls import TLSError
    try:
        dialer = Dialer(address, timeout=args.timeout, cafile=args.cafile, certfile=args.cert,
                        keyfile=args.key, verify=not args.insecure,
                        tls=bool(args.cafile or args.insecure or args.cert) or None)
    except TLSError as exc:
        raise Exit(1, f"Error: {exc}") from None
    conn = Connection(client_id, protocol, clean_start=not args.disable_clean_session,
                      keepalive=args.keepalive, username=username, password=password,
                      will=will, max_inflight=getattr(args, "max_inflight", 20) or 20,
                      max_queued=1000, connect_timeout=args.timeout)
    return dialer, conn


def refusal(code: int | None, reason: str, protocol: int) -> Exit:
    """The Exit of a refused connection: mosquitto's line and code."""
    if code is None:
        return Exit(1, f"Error: {reason}")
    if protocol == 5:
        return Exit(code, f"Connection error: {REASON_NAMES.get(code, reason)}")
    return Exit(code, f"Connection error: Connection Refused: "
                      f"{_REFUSED_311.get(code, reason)}.")


class Link:
    """One client's connection, driven step by step without threads (module docstring)."""

    def __init__(self, dialer, conn, debug: bool = False):
        self.dial = dialer
        self.conn = conn
        self.debug = debug
        self.transport = None
        self._out = bytearray()
        self._poll = None

    def say(self, text: str) -> None:
        if self.debug:
            name = self.conn.client_id or "(null)"
            print(f"Client {name} {text}", file=sys.stderr, flush=True)

    def open(self, deadline: float):
        """Connect; the Connected event, or Exit (refused: the CONNACK's code; else 1)."""
        from edgebroker.client.events import ConnectFailed, Connected, Disconnected
        try:
            self.transport = self.dial()
        except OSError as exc:
            raise Exit(1, f"Error: {exc.strerror or exc}") from None
        self._poll = select.poll()
        self.conn.connect(time.monotonic())
        self.say("sending CONNECT")
        while True:
            for event in self.step(deadline):
                if isinstance(event, Connected):
                    self.say(f"received CONNACK ({event.reason_code})")
                    return event
                if isinstance(event, ConnectFailed):
                    raise refusal(event.reason_code, event.reason, self.conn.protocol)
                if isinstance(event, Disconnected):
                    raise Exit(1, f"Error: {event.reason}")
            if time.monotonic() >= deadline:
                raise Exit(1, "Error: no CONNACK in time")

    def flush(self) -> list:
        """Write what the connection has to send; the QoS 0 Acked events."""
        conn = self.conn
        data = conn.data_to_send(time.monotonic())
        if data:
            self._out += data
        out = self._out
        try:
            while out:
                del out[:self.transport.send(out)]
        except BlockingIOError:
            pass
        except OSError as exc:
            raise Exit(1, f"Error: write failed: {exc}") from None
        return conn.acked_qos0()

    def step(self, deadline: float | None) -> list:
        """Flush, wait (until a read, the keepalive's deadline or ``deadline``), read, tick:
        the events. Exit(1) when the link ends."""
        conn = self.conn
        events = self.flush()
        t = self.transport
        if events or t.pending():
            wait = 0
        else:
            due = [d for d in (deadline, conn.next_deadline()) if d is not None]
            wait = max(0.0, min(due) - time.monotonic()) if due else None
        poll = self._poll
        poll.register(t.fileno(), select.POLLIN | (select.POLLOUT if self._out else 0))
        ready = poll.poll(None if wait is None else wait * 1000) if wait != 0 else []
        now = time.monotonic()
        if ready or t.pending():
            while True:
                try:
                    data = t.recv(READ_SIZE)
                except BlockingIOError:
                    break
                except OSError as exc:
                    raise Exit(1, f"Error: connection lost: {exc}") from None
                if not data:
                    if conn.state == "closed":
                        break
                    raise Exit(1, "Error: the broker closed the connection")
                events += conn.receive_data(data, now)
                if not t.pending():
                    break
        events += conn.tick(now)
        events += self.flush()
        from edgebroker.client.events import Disconnected, PingTimeout
        for event in events:
            if isinstance(event, Disconnected) and self.conn.state != "connecting":
                raise Exit(1, f"Error: disconnected by the broker: {event.reason}")
            if isinstance(event, PingTimeout):
                raise Exit(1, "Error: the broker did not answer a PINGREQ in time")
        return events

    def close(self, deadline: float) -> None:
        """DISCONNECT once everything before it is written, then close."""
        if self.transport is None:
            return
        if self.conn.state == "connected":
            self.conn.disconnect()
            self.say("sending DISCONNECT")
            try:
                self.flush()
                while self._out and time.monotonic() < deadline:
                    self._poll.register(self.transport.fileno(), select.POLLOUT)
                    self._poll.poll(max(0, deadline - time.monotonic()) * 1000)
                    self.flush()
            except Exit:
                pass
        self.transport.close()
        self.transport = None


def run_command(body, args) -> int:
    """Run ``body(args)`` and turn an Exit into its message and code."""
    try:
        return body(args)
    except Exit as exc:
        if exc.message and not args.quiet:
            print(exc.message, file=sys.stderr)
        return exc.code
