"""`edgebroker sub`: subscribe and print the messages, as mosquitto_sub does (its options, its
exit codes; docs/client-cli.md), on edgebroker.client. Usable against any MQTT broker.

Each message is printed as its payload (``-v``: the topic, a space, the payload), then a
newline (``-N``: none), flushed at once; an empty payload as mosquitto_sub prints it: nothing,
or with ``-v`` the topic and `` (null)`` (nothing with ``-v -N`` either); it counts for
``-C``. ``-C N`` exits after N messages, ``-W S`` after S seconds with code 27, ``-E``
once the subscriptions are acknowledged. ``-R`` skips retained messages, ``-T FILTER``
(repeatable) skips topics matching it, ``-U FILTER`` unsubscribes.
A QoS 1/2 message is acknowledged (PUBACK, PUBREC) only once printed, or skipped by ``-R`` or
``-T``: those read past the count of ``-C``, the first non-retained one of
``--retained-only`` and those still unread at ``-W``, Ctrl-C or SIGTERM stay unacknowledged,
so a kept session (``-c``) has the broker send them again at the next connection.
Ctrl-C or SIGTERM: DISCONNECT and exit 0, as mosquitto_sub; one that comes while a message is
being written (a reader slower than the messages, its pipe full) lets it be written in full
and acknowledged first (Stop), as mosquitto_sub's handler that only sets a flag: no record is
cut off, none printed comes again. A second one ends the wait at once: exit 130, the message
cut off and unacknowledged. Stdout closed (``>&-``) is refused before connecting, exit 1; a
write that fails (ENOSPC, EIO) ends with one line, exit 1, the message unacknowledged; a
reader gone (EPIPE) ends quietly with 141 (cli/main.py). A link lost after the first
connection is connected again (mqtt_options.Session), and the event loop subscribes again
to the filters when the broker did not keep the session (its ``resubscribe``).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from edgebroker.cli.mqtt_options import (TIMED_OUT, Exit, Session, add_options, check_options,
                                         run_command, url_topic)
from edgebroker.cli.options import positive, seconds


def add_parser(commands) -> None:
    p = commands.add_parser("sub", add_help=False,
                            help="subscribe and print MQTT messages from any broker "
                                 "(mosquitto_sub's options)")
    add_options(p)
    p.add_argument("-t", "--topic", action="append", default=[],
                   help="a filter to subscribe to (repeatable)")
    p.add_argument("-T", "--filter-out", action="append", default=[], metavar="FILTER",
                   help="do not print topics matching FILTER (repeatable)")
    p.add_argument("-U", "--unsubscribe", action="append", default=[], metavar="FILTER",
                   help="unsubscribe from FILTER first (repeatable)")
    p.add_argument("-C", "--count", type=positive, default=0, metavar="N",
                   help="exit after N messages")
    p.add_argument("-W", "--wait", type=seconds, default=0.0, metavar="S",
                   help="exit (code 27) after S seconds (above 0)")
    p.add_argument("-E", "--exit-after-subscribe", action="store_true",
                   help="exit once the subscriptions are acknowledged")
    p.add_argument("-R", "--no-retained", action="store_true",
                   help="do not print retained (stale) messages")
    p.add_argument("--retained-only", action="store_true",
                   help="print only retained messages; exit at the first other one")
    p.add_argument("-N", "--no-newline", action="store_true",
                   help="no newline after each payload")
    p.add_argument("-v", "--verbose", action="store_true", help="print the topic too")
    p.set_defaults(run=lambda args: run_command(subscribe, args))


def subscribe(args) -> int:
    from edgebroker.client.events import Message, Subscribed, Unsubscribed
    from edgebroker.errors import ProtocolError
    from edgebroker.mqtt.topics import topic_matches, validate_topic_filter
    check_options(args, "sub")
    for topic_filter in args.filter_out:
        try:
            validate_topic_filter(topic_filter)
        except ProtocolError as exc:
            raise Exit(2, f"edgebroker sub: -T: {exc}") from None
    filters = list(args.topic) or [t for t in [url_topic(args, "sub")] if t]
    if not filters and not args.unsubscribe:
        raise Exit(2, "edgebroker sub: a topic is needed (-t, or the path of -L)")
    if sys.stdout is None:
        raise Exit(1, "Error: standard output is closed: nowhere to print the messages")
    session = Session(args, "sub", auto_ack=False)     # ack: once printed or skipped
    stop = Stop(session.say)
    conn = session.conn
    end = time.monotonic() + args.wait if args.wait else None
    out = sys.stdout.fileno()
    newline = b"" if args.no_newline else b"\n"
    printed = 0
    waiting = set()         # the SUBSCRIBE/UNSUBSCRIBE requests not answered yet

    # queued now, sent once the CONNACK came; made again by the event loop itself after a
    # reconnection to a broker that forgot the session (its resubscribe option)
    if args.unsubscribe:
        waiting.add(conn.unsubscribe(args.unsubscribe))
    if filters:
        waiting.add(conn.subscribe([(f, args.qos) for f in filters]))
        session.say(f"sending SUBSCRIBE ({', '.join(filters)}, QoS: {args.qos})")
    try:
        while True:
            left = None if end is None else end - time.monotonic()
            event = session.next(left) if left is None or left > 0 else None
            if event is None:
                if not args.quiet:
                    print("Timed out", file=sys.stderr)
                return TIMED_OUT
            kind = type(event)
            if kind is Message:
                if args.retained_only and not event.retain:
                    return 0                # left unacknowledged: not handled
                if args.no_retained and event.retain or any(
                        topic_matches(f, event.topic) for f in args.filter_out):
                    conn.ack(event)         # skipped as asked: handled
                    continue
                session.say(f"received PUBLISH (d{int(event.dup)}, q{event.qos}, "
                            f"r{int(event.retain)}, '{event.topic}', ... "
                            f"({len(event.payload)} bytes))")
                if event.payload:
                    head = event.topic.encode() + b" " if args.verbose else b""
                    record = head + event.payload + newline
                elif args.verbose and newline:       # as mosquitto_sub: "(null)", or nothing
                    record = event.topic.encode() + b" (null)\n"
                else:
                    record = b""
                stop.writing = True
                try:
                    write_all(out, record)
                except KeyboardInterrupt:   # a second Ctrl-C or SIGTERM while writing
                    raise Exit(130, "edgebroker sub: interrupted while writing a message: "
                                    "it is cut off and was not acknowledged") from None
                conn.ack(event)             # printed: the broker may forget it
                stop.writing = False
                printed += 1
                if stop.asked or args.count and printed >= args.count:
                    return 0
            elif kind is Subscribed or kind is Unsubscribed:
                waiting.discard(event.request)
                if kind is Subscribed:
                    session.say(f"received SUBACK: {event.granted}")
                    if all(code >= 0x80 for code in event.granted):
                        raise Exit(1, "All subscription requests were denied.")
                if args.exit_after_subscribe and not waiting:
                    return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop.writing = False                # a signal during the DISCONNECT: at once
        session.close()


class Stop:
    """SIGINT (Ctrl-C) and SIGTERM: KeyboardInterrupt at once, except the first one that comes
    while a message is being written (``writing``): that one only sets ``asked``, so that the
    message is written in full and acknowledged before `sub` exits. SIGINT is left alone when
    it is ignored (a background job of a script). ``say``: Session.say (``-d``)."""

    def __init__(self, say):
        self.say = say
        self.writing = False
        self.asked = False
        signal.signal(signal.SIGTERM, self.handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame):
        if self.writing and not self.asked:
            self.asked = True
            self.say("interrupted: writing the message in full, then exiting (interrupt again "
                     "to exit at once)")
            return
        raise KeyboardInterrupt


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` in full (a write to a pipe may take part of it), with no
    buffer left behind; a write that fails is one line and exit 1 (a reader gone: main's
    BrokenPipeError, 141)."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:     # a non-blocking stdout, its reader behind: wait
                select.select([], [fd], [])
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise Exit(1, f"Error: writing the message to standard output: {exc.strerror}") from None
