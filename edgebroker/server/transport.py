"""A connection's byte stream on a plain socket (TCP or Unix), and with raw MQTT framing the
core's transport: ``write``, ``write_file``, ``close``.

The plain stream is the base behaviour and the hot path: ``TLSTransport`` (server/tls.py)
overrides reading and writing; WebSocket framing sits between it and the core (framing.py).

Writes are queued and flushed by the loop once per pass with one ``sendmsg`` over all queued
buffers (no per-message syscalls; ``send_now`` and ``offer`` may send earlier in a pass). Only
the unsent remainder stays queued; the socket is watched for writing only while it has some.

``write_file`` queues a header and a byte range of a commit-log segment (server/filechunk.py),
sent with sendfile; dropped if retention deleted its record.

The queue is bounded for what may be dropped: ``offer`` (a QoS 0 PUBLISH) refuses once
``max_pending`` bytes are waiting (FileChunks count with their full length); the core then
drops the message or keeps it in the session's queue, calls ``wait_for_drain()``, and is
called back (``client.writable()``) when everything has been written. Replies are bounded
by not reading a client that does not read them (``hold_input``).

First bytes are sniffed (server/sniff.py): TLS or HTTP on a plain MQTT port is refused, logged.

The core may pause reading for independent reasons (``pause_reading``): ``"auth"`` while a
CONNECT waits for its password check, ``"rate"`` while a client is over its publish or control
packet rate, ``"log"`` while the commit log cannot write (``"output"``: see above). Read again
once every reason is resumed; meanwhile the peer's bytes stay in the kernel and TCP slows it
(and only it) down."""

from __future__ import annotations

import errno
import logging
import selectors
import socket

from edgebroker import _native
from edgebroker.server.filechunk import FileChunk
from edgebroker.server.peers import peer_end
from edgebroker.server.sniff import sniff

log = logging.getLogger("edgebroker.server")

# Reads per readiness event while large packets arrive (each read is one packet or less, or
# several alike ones); no more after the connection's share of the pass (Loop.large_budget).
_LARGE_READS = 8
_MAX_IOV = 512  # buffers per sendmsg: under Linux's IOV_MAX (1024)
_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE
# Used until the loop sets the configured limit.max_pending_write_bytes.
DEFAULT_MAX_PENDING = 1 << 20
# A connection with nothing to send shares this empty queue instead of keeping an empty list
# (56 bytes each); the first write gives it a list of its own.
NO_OUTPUT: tuple = ()

# Why reading may be paused: one bit each, so one holder cannot resume another's pause.
PAUSE_REASONS = {"auth": 1, "rate": 2, "log": 4, "output": 8, "frames": 16}
# Output no reading client leaves queued (replies to a flood of requests it does not read:
# PINGRESPs, acknowledgements, pongs): past it, it is not read until that is written.
HELD_WRITES = 65536
HELD_FACTOR = 8            # times max_pending, in bytes
_HELD = PAUSE_REASONS["output"]


class _Unrecoverable(Exception):
    """The connection's output cannot be completed; it must be closed."""


class Transport:
    __slots__ = ("loop", "sock", "peer", "client", "out", "out_bytes", "dirty", "closing",
                 "closed", "events", "paused", "listener", "want_drain", "max_pending",
                 "msgs_out", "bytes_in", "bytes_out", "file_progress", "sniff")

    def __init__(self, loop, sock: socket.socket, peer: str, listener=None,
                 max_pending: int = DEFAULT_MAX_PENDING):
        self.loop = loop
        self.sock = sock
        self.peer = peer
        self.client = None
        self.out = NO_OUTPUT     # list of bytes / FileChunk while anything is queued
        self.out_bytes = 0
        self.dirty = False       # listed in the loop's flush list for this pass
        self.closing = False     # the core asked to close once the queue is sent
        self.closed = False
        self.events = _READ      # what the selector watches (0: unregistered)
        self.paused = 0           # PAUSE_REASONS bits of who paused reading (0: reading)
        self.listener = listener  # has .address and .max_connections (server.listeners.Listener)
        self.want_drain = False   # call client.writable() once the queue is empty
        self.max_pending = max_pending
        self.msgs_out = 0         # PUBLISH packets queued (offer, and the core's counted writes)
        self.bytes_in = 0
        self.bytes_out = 0
        self.file_progress = 0    # bytes of out[0] already sent when it is a FileChunk
        self.sniff = b""          # first bytes, until they show MQTT (then None; server/sniff.py)

    @property
    def reading(self) -> bool:
        return not self.paused  # no reason to pause reading is held

    @property
    def listener_name(self) -> str:
        return self.listener.address if self.listener is not None else ""

    @property
    def policy(self):
        """The listener's ListenerPolicy (authentication, ACL) as a reload left it."""
        return self.listener.policy if self.listener is not None else None

    # ----- the core's side --------------------------------------------------------------

    def _queue(self, item, size: int) -> None:
        """Append to the output queue (its own list from the first item); listed for the flush."""
        out = self.out
        if out is NO_OUTPUT:
            self.out = out = []
        out.append(item)
        self.out_bytes += size
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    def write(self, data) -> None:
        if not self.closed:
            self._queue(data, len(data))

    def send_now(self, always: bool = False) -> None:
        """``flush(early=True)`` in the middle of a pass, unless nothing is queued, the socket
        is full (a failing send per call would cost the whole loop) or, unless ``always``
        (``offer``), the loop waits for a CPU (server/contention.py: the pass's flush sends)."""
        if (self.out and not self.closed and not self.events & _WRITE
                and (always or not self.loop.contention.contended)):
            self.flush(early=True)

    def wait_for_drain(self) -> None:
        """Refused or held back by ``max_pending``: ``client.writable()`` once all is written."""
        self.want_drain = True

    def count_publish(self, n: int = 1) -> None:
        """Count ``n`` PUBLISHes queued with ``write`` or ``write_file`` (``offer``: its own)."""
        self.msgs_out += n

    def offer(self, data, rest=None) -> bool:
        """Queue one PUBLISH frame (``data``, then ``rest`` unless None) unless ``max_pending``
        bytes are already waiting and the socket does not take them now."""
        if self.closed:
            return True  # a closed transport swallows writes, as write() does
        if self.out_bytes >= self.max_pending:
            # One pass may route many reads to this connection before the loop flushes it:
            # send now what the socket takes, so that only a client that does not read
            # loses messages.
            self.send_now(always=True)
            if self.out_bytes >= self.max_pending:
                return False
        self.msgs_out += 1
        if rest is None:
            self._queue(data, len(data))
        else:
            self._queue(data, len(data) + len(rest))
            self.out.append(rest)  # a list now (see _queue)
        return True

    def write_file(self, head: bytes, fd: int, position: int, length: int, offset: int) -> None:
        if self.closed:
            return
        generation = self.loop.log_generation()
        self._queue(FileChunk(head, fd, position, length, offset, generation), len(head) + length)

    def close(self) -> None:
        """Close after a last attempt to send what is queued (e.g. a refusing CONNACK), in
        this pass: the client may be waiting for the end (Broker.prompt)."""
        if self.closing or self.closed:
            return
        self.closing = True
        self.loop.broker.prompt = True
        if not self.dirty:
            self.dirty = True
            self.loop.dirty.append(self)

    def end_output(self) -> bool:
        """Send what is queued now, then the end of the stream (FIN), reading on: True when
        done. A closing handshake (server/framing.py) then waits for the peer's end."""
        if self.out:
            self.flush(early=True)
        if self.out or self.closed:
            return False
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        return True

    def pause_reading(self, reason: str) -> None:
        """Stop reading this socket for ``reason`` (one of PAUSE_REASONS) until it is resumed.

        The kernel's TCP window then holds the peer back."""
        bit = PAUSE_REASONS[reason]
        paused = self.paused
        if paused & bit:
            return
        self.paused = paused | bit
        if not paused and not self.closed:
            self.update_events()

    def resume_reading(self, reason: str) -> None:
        """Drop ``reason``; the socket is read again only when no other reason holds it."""
        bit = PAUSE_REASONS[reason]
        paused = self.paused
        if not paused & bit:
            return
        self.paused = paused = paused & ~bit
        if not paused and not self.closed:
            self.update_events()

    def peer_end(self) -> int | None:
        return peer_end(self.sock)      # (server.peers)

    # ----- the loop's side --------------------------------------------------------------

    def update_events(self) -> None:
        """Watch the socket for what is needed now: input unless paused, output if queued."""
        events = (0 if self.paused else _READ) | (_WRITE if self.out else 0)
        if events != self.events:
            self._want(events)

    def _want(self, events: int) -> None:
        """Register, modify or unregister the socket so the selector watches ``events``."""
        if self.closed or events == self.events:
            return
        selector = self.loop.selector
        if not events:
            selector.unregister(self.sock)
        elif not self.events:
            selector.register(self.sock, events, self)
        else:
            selector.modify(self.sock, events, self)
        self.events = events

    def on_event(self, mask: int) -> None:
        if self.closed:
            return  # shut down earlier in this pass
        if mask & _READ and not self.closing:
            # Read (in here, not in a method of its own: this runs for every packet).
            decoder = self.client.decoder
            if decoder.room is not None or decoder.read_hint:
                self._read_large(decoder)
            else:
                loop = self.loop
                n = self._recv_into(loop.buffer, 0)
                if n:
                    if self.sniff is not None and not sniff(self, loop.view[:n]):
                        return
                    self.client.data_received(loop.view[:n])
        if mask & _WRITE and not self.closed:
            self.flush()

    # The transport itself is the selector key's callback: a bound method per connection
    # would cost 64 bytes each (10,000 idle connections: 640 KB). Subclasses that override
    # on_event set __call__ again.
    __call__ = on_event

    def _read_large(self, decoder) -> None:
        """Large packets are arriving: the rest of one goes straight into its payload buffer
        (``decoder.room``); between them, short reads (``decoder.read_hint``). Reads on, a
        few times, while the socket fills what was asked for, up to the connection's share
        of the pass: what is left of the loop's budget for large reads, at least the bytes
        one plain read may take (the loop's shared buffer)."""
        loop = self.loop
        client = self.client
        share = max(loop.large_budget, len(loop.buffer))
        total = 0
        for _ in range(_LARGE_READS):
            room = decoder.room
            if room is not None:
                want = len(room)
                n = self._recv_into(room, 0)
                del room  # the decoder may grow the buffer it views
                if not n:
                    break
                client.payload_received(n)
            else:
                parts = decoder.repeat_buffers(share - total)
                if parts is not None:
                    # The next frames are expected to be like the last two: one read puts
                    # their headers and payloads in buffers of their own.
                    want = sum(map(len, parts))
                    n = self._recv_into(parts, 0)
                    if not n:
                        break
                    client.repeat_received(parts, n)
                else:
                    want = decoder.read_hint
                    n = self._recv_into(loop.buffer, want)
                    if not n:
                        break
                    client.data_received(loop.view[:n])
            total += n
            if (n < want or total >= share or self.closing or self.closed
                    or self.paused or decoder.room is None and not decoder.read_hint):
                break
        loop.large_budget -= total

    def _recv_into(self, target, nbytes: int) -> int:
        """Receive into ``target`` (``nbytes`` at most, 0: its size; a list: into its buffers
        in turn); 0 when nothing came (an error or the end of the stream is handled here)."""
        try:
            n = (self.sock.recv_into(target, nbytes) if type(target) is not list else
                 self.sock.recvmsg_into(target)[0])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self.lost(exc.strerror or str(exc))
            return 0
        if n == 0:
            self.ended("closed by peer")
            return 0
        self.loop.broker.stats.bytes_received += n
        self.bytes_in += n
        return n

    def flush(self, early: bool = False) -> None:
        """Send as much of the queue as the socket takes, without blocking.

        ``early``: in the middle of a pass (routing); errors and a drained queue are left
        for the pass's own flush to report. The QoS 2 exchange records of what is queued
        are written first (``Broker.before_send``, core.exchanges)."""
        self.loop.broker.before_send()
        out = self.out
        if len(out) == 1 and type(out[0]) is not FileChunk:
            # The commonest flush: one acknowledgement, or one delivery.
            data = out[0]
            error = None
            try:
                sent_total = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent_total = 0
            except OSError as exc:
                sent_total = 0
                error = exc.strerror or str(exc)
            if sent_total == len(data):
                self.out = NO_OUTPUT
            elif sent_total:
                out[0] = memoryview(data)[sent_total:]
        else:
            sent_total, error = self._send_queue(out)
        self.out_bytes -= sent_total
        self.bytes_out += sent_total
        self.loop.broker.stats.bytes_sent += sent_total
        if error is not None and not early:
            self.lost(error)
            return
        self.update_events()  # early, what is left waits for the socket (see offer)
        if early:
            return
        if self.out or self.paused:     # (most flushes leave neither: no call)
            self.hold_input()
        if self.out is NO_OUTPUT and self.want_drain and not self.closed:
            self.drained()

    def hold_input(self) -> None:
        """After a flush: not read while more than HELD_* waits for it (counted, logged)."""
        out = self.out
        if not out:
            if self.paused & _HELD:
                self.resume_reading("output")
            return
        if self.paused & _HELD or (len(out) < HELD_WRITES
                               and self.out_bytes < HELD_FACTOR * self.max_pending):
            return
        self.pause_reading("output")
        broker = self.loop.broker
        broker.hit("max_pending_write_bytes")
        client = getattr(self.client, "client", self.client)   # (under a Framing, its client)
        broker.peer_log.log(log, logging.WARNING, "held_output", self.peer,
                            "%s: %d bytes in %d writes wait for the client to read them "
                            "(bound: %d writes or %d bytes); not reading it until they are "
                            "written", client.describe() if client is not None else self.peer,
                            self.out_bytes, len(out), HELD_WRITES,
                            HELD_FACTOR * self.max_pending)

    def _send_queue(self, out: list) -> tuple[int, str | None]:
        """Send what the socket takes of ``out``: (bytes sent, the error that stopped it)."""
        sock = self.sock
        sent_total = 0
        error = None
        while out:
            if type(out[0]) is FileChunk:
                try:
                    sent, full, error = self._send_files()
                except _Unrecoverable as exc:
                    error = str(exc)
                    break
                sent_total += sent
                if full or error:
                    break
                continue
            n = 0
            limit = min(len(out), _MAX_IOV)
            while n < limit and type(out[n]) is not FileChunk:
                n += 1
            try:
                # One buffer (an acknowledgement, say): send() costs less than sendmsg().
                sent = (sock.send(out[0]) if n == 1 else
                        sock.sendmsg(out[:n] if n < len(out) else out))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                error = exc.strerror or str(exc)
                break
            sent_total += sent
            # Drop fully sent buffers; keep a view of a partly sent one.
            i = 0
            while i < n and sent >= len(out[i]):
                sent -= len(out[i])
                i += 1
            if i < n and sent:
                out[i] = memoryview(out[i])[sent:]
            del out[:i]
            if i < n:
                break  # the socket buffer is full
        if not out:
            self.out = NO_OUTPUT
        return sent_total, error

    def drained(self) -> None:
        """Everything queued is written after the core was refused (``want_drain``)."""
        self.want_drain = False
        self.client.writable()

    def _send_files(self) -> tuple[int, bool, str | None]:
        """Send the leading run of FileChunks: (bytes sent, socket full, error)."""
        out = self.out
        generation = self.loop.log_generation()
        run = []
        for item in out:
            if type(item) is not FileChunk or len(run) == _MAX_IOV:
                break
            if item.generation != generation and not self._relocate(item, generation, not run):
                break
            run.append(item)
        if not run:
            return 0, False, None   # the head chunk was dropped; the caller goes on
        result = _native.send_batch(self.sock, [(c.head, c.fd, c.position, c.length) for c in run],
                                    0, self.file_progress)
        # Bytes of the whole items completed, plus progress into the next one.
        sent = result.sent
        del out[:result.item]
        self.file_progress = result.progress if result.item < len(run) else 0
        if result.error in (0, errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
            return sent, result.error != 0, None
        return sent, False, errno.errorcode.get(result.error, str(result.error))

    def _relocate(self, chunk: FileChunk, generation: int, at_head: bool) -> bool:
        """Segments were deleted since ``chunk`` was queued: find its record again."""
        where = self.loop.locate(chunk.offset)
        if where is None:
            if at_head and self.file_progress:
                # Half of this PUBLISH is on the wire; it cannot be completed.
                raise _Unrecoverable(f"log record {chunk.offset} deleted while being sent")
            self.out.remove(chunk)
            self.out_bytes -= len(chunk)
            receiver = self.client                # the core's Client, or a Framing over it
            self.loop.broker.record_gone(getattr(receiver, "client", receiver), chunk.offset)
            return False
        chunk.fd, chunk.position, chunk.generation = where.fd, where.payload_position, generation
        return True

    def ended(self, reason: str) -> None:
        """The peer ended its side of the stream (it may still read): tell the core, send
        what is queued (the CONNACK of a client that sent CONNECT and shut down its writing
        side), then close, at the end of this pass."""
        if self.closed or self.closing:
            return
        client = self.client
        self.close()
        client.connection_lost(reason)

    def lost(self, reason: str) -> None:
        """The socket failed: tell the core, release the socket (nothing more can be sent)."""
        if self.closed:
            return
        client = self.client
        self.shutdown()
        client.connection_lost(reason)

    def shutdown(self) -> None:
        """Close the socket, and let go of the receiver (``client``): a closed connection
        and its client are freed as soon as nothing else holds them, without waiting for
        the garbage collector to find the cycle."""
        if self.closed:
            return
        self.closed = True
        self.client = None
        self.out = NO_OUTPUT
        self.out_bytes = 0
        loop = self.loop
        loop.forget(self)   # (and out of the poller while its descriptor is still known)
        try:
            self.sock.close()
        except OSError as exc:  # pragma: no cover - close on a socket we own
            if exc.errno != errno.EBADF:
                log.debug("close %s: %s", self.peer, exc)
        loop.released(self)
