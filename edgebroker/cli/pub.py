"""`edgebroker pub`: publish messages and exit, as mosquitto_pub does (its options, its exit codes;
docs/client-cli.md), on edgebroker.client. Usable against any MQTT broker.

The message is ``-m TEXT``, ``-f FILE``, ``-n`` (empty), ``-s`` (all of stdin) or, with ``-l``,
each line of stdin (blank lines are not sent, as mosquitto_pub); ``--repeat N`` sends it N
times, ``--repeat-delay S`` apart. The command exits once every message is acknowledged
(QoS 1/2) or written (QoS 0), and then sends DISCONNECT. The messages go through the event
loop (client/loop.py), which takes them as the connection can; when the link is lost after
the first connection, it connects again and sends what was not acknowledged (``-l`` keeps
reading stdin across it: no QoS 1/2 line is lost). A message the broker refuses (a 5.0
reason code of 0x80 or more) is reported and gives exit code 1. When ``STALLS`` connections in
a row end with messages in flight and none acknowledged, it exits with 7 (mosquitto_pub's
"The connection was lost.").
"""

from __future__ import annotations

import itertools
import os
import select
import sys
import time

from edgebroker.cli.mqtt_options import (PROTOCOLS, Exit, Session, add_options, check_options,
                                         run_command, url_topic)
from edgebroker.cli.options import delay, positive

# Connections in a row that end before any message in flight is acknowledged: then pub gives
# up (exit 7, mosquitto_pub's code for a lost connection) instead of sending it again forever
# to a broker that drops the link because of the message (too large, a QoS it refuses).
STALLS = 3


def _stall_hint(args) -> str:
    """What may make a broker close the link at each message, when the options tell: over
    3.1/3.1.1 a broker cannot refuse a QoS 2 message but by closing the connection (Mosquitto
    does so for a QoS over its ``max_qos`` and for more unfinished QoS 2 messages than its
    ``max_inflight_messages``)."""
    if args.qos != 2 or PROTOCOLS[args.protocol_version] == 5:
        return ""
    return (f"\nHint: a 3.1.1 broker closes the connection on a QoS 2 message it does not "
            f"take (it takes no QoS 2, or fewer unfinished than -M {args.max_inflight}): try "
            f"-q 1, a smaller -M, or -V 5 to be told why.")


def add_parser(commands) -> None:
    p = commands.add_parser("pub", add_help=False,
                            help="publish MQTT messages to any broker (mosquitto_pub's options)")
    add_options(p)
    p.add_argument("-t", "--topic", help="the topic to publish to")
    what = p.add_mutually_exclusive_group()
    what.add_argument("-m", "--message", help="the message")
    what.add_argument("-f", "--file", help="send the file's contents as one message")
    what.add_argument("-n", "--null-message", action="store_true", help="an empty message")
    what.add_argument("-s", "--stdin-file", action="store_true", help="stdin as one message")
    what.add_argument("-l", "--stdin-line", action="store_true", help="each line of stdin "
                                                                      "as a message")
    p.add_argument("-r", "--retain", action="store_true")
    p.add_argument("-M", "--max-inflight", type=int, default=20, metavar="N",
                   help="QoS 1/2 messages in flight at once (default 20)")
    p.add_argument("--repeat", type=positive, default=1, metavar="N", help="send N times")
    p.add_argument("--repeat-delay", type=delay, default=0.0, metavar="S",
                   help="seconds between repeats")
    p.set_defaults(run=lambda args: run_command(publish, args))


def _messages(args, topic: str):
    """The payloads to send: read now (a file that cannot be read, or larger than MQTT's
    largest message, fails before connecting and before it is read), except ``-l``'s lines,
    read as they come; stdin closed (``<&-``) for ``-l`` or ``-s`` fails before connecting."""
    if (args.stdin_line or args.stdin_file) and sys.stdin is None:
        option = "-l" if args.stdin_line else "-s"
        raise Exit(1, f"Error: standard input is closed ({option} reads the message from it)")
    if args.stdin_line:
        return _stdin_lines()
    if args.message is not None:
        payload = os.fsencode(args.message)     # the bytes as given (as mosquitto_pub)
    elif args.file:
        from edgebroker.client.requests import largest_payload
        try:
            with open(args.file, "rb") as fh:
                size, most = os.fstat(fh.fileno()).st_size, largest_payload(topic, args.qos)
                if size > most:
                    raise Exit(1, f"Error: {args.file}: {size:,} bytes, over MQTT's largest "
                                  f"message: {most:,} bytes with this topic")
                payload = fh.read()
        except OSError as exc:
            raise Exit(1, f"Error: cannot read {args.file}: {exc.strerror}") from None
    elif args.stdin_file:
        payload = sys.stdin.buffer.read()
    elif args.null_message:
        payload = b""
    else:
        raise Exit(2, "edgebroker pub: give a message: -m, -f, -n, -s or -l")
    return itertools.repeat(payload, args.repeat)


def _stdin_lines():
    """Lines of stdin without their end of line; None while none is ready (the event loop
    then runs on, keepalive and acknowledgements included, and asks again when stdin is
    readable: it watches stdin's descriptor, ``set_source(watch=)``)."""
    fd = sys.stdin.fileno()
    held = b""
    while True:
        if not select.select([fd], [], [], 0)[0]:
            yield None
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            if held.rstrip(b"\r"):
                yield held.rstrip(b"\r")
            return
        lines = (held + chunk).split(b"\n")
        held = lines.pop()
        for line in lines:
            line = line.rstrip(b"\r")
            if line:
                yield line


def _requests(args, topic: str, messages, session):
    """The PUBLISH requests of the messages, for the event loop to take as the connection
    can (back-pressure: at most max_queued wait)."""
    from edgebroker.client.requests import ClientError, make_publish
    delay = args.repeat_delay if args.repeat > 1 else 0.0
    next_at = 0.0
    for payload in messages:
        while payload is not None and delay and time.monotonic() < next_at:
            yield None          # --repeat-delay: nothing yet
        if payload is None:
            yield None
            continue
        try:
            request = make_publish(topic, payload, args.qos, args.retain)
        except ClientError as exc:
            raise Exit(1, f"Error: {exc}") from None
        session.say(f"sending PUBLISH (q{args.qos}, r{int(args.retain)}, '{topic}', ... "
                    f"({len(payload)} bytes))")
        yield request
        next_at = time.monotonic() + delay


def publish(args) -> int:
    check_options(args, "pub")
    if not 1 <= args.max_inflight <= 65535:
        raise Exit(2, f"edgebroker pub: -M {args.max_inflight}: messages in flight are 1 to 65535")
    topic = args.topic or url_topic(args, "pub")
    if not topic:
        raise Exit(2, "edgebroker pub: a topic is needed (-t, or the path of -L)")
    messages = _messages(args, topic)
    session = Session(args, "pub")
    loop = session.loop
    loop.end_when_idle = True       # poll() says None once every message is answered
    loop.set_source(_requests(args, topic, messages, session),
                    watch=sys.stdin.fileno() if args.stdin_line else None)
    from edgebroker.client.events import Acked, Connected, Disconnected, PingTimeout
    failed = 0
    stalls = 0          # connections in a row lost with a message in flight and none acked
    up = progress = False
    try:
        while (event := session.next()) is not None:
            kind = type(event)
            if kind is Connected:
                up, progress = True, False
            elif (kind is Disconnected or kind is PingTimeout) and up:
                up = False
                stalls = stalls + 1 if session.conn.inflight and not progress else 0
                if stalls >= STALLS:     # the broker drops the link for the message itself
                    raise Exit(7, "Error: The connection was lost." + _stall_hint(args))
            if kind is not Acked:
                continue
            progress = True
            code = event.reason_code
            if code >= 0x80:
                failed += 1
                if not args.quiet:
                    print(f"Warning: Publish to {topic} failed: reason code {code:#04x}",
                          file=sys.stderr)
            elif event.request.qos:
                session.say(f"received {'PUBACK' if event.request.qos == 1 else 'PUBCOMP'}"
                            f" (Mid: {event.request.packet_id}, RC:{code})")
        if not loop.idle:
            raise Exit(1, "Error: the connection ended before every message was sent")
    finally:
        session.close()
    return 1 if failed else 0
