"""The client side of MQTT over WebSocket (ws://, wss://): RFC 6455 framing over a byte stream.

``open_websocket(stream, host, port, path=..., timeout=...)`` takes a connected, non-blocking
byte stream (the plain TCP transport, or client/tls.py's ``TLSTransport`` for wss://), makes
the HTTP upgrade within the timeout (``GET path``, subprotocol ``mqtt``), and returns a
``WebSocketTransport`` with the same interface as the stream (client/transport.py). The
upgrade itself is ``websocket_upgrade``, a client/handshake.py generator, which the asyncio
adapter runs on its loop. The transport:

- ``send(data) -> int``: ``data`` goes out as one masked binary frame (a client's frames are
  masked, RFC 6455 §5.3). The return value counts the bytes of ``data`` whose frame bytes the
  stream took; when the stream takes only part of a frame, the rest of the frame is kept and
  written at the next ``send``, which is then given the caller's unsent bytes (as the event
  loop does): they are the frame's remaining payload, so they are not framed again. So the
  caller sees the usual partial writes and keeps watching write readiness until its bytes,
  and so the whole frame, are out. BlockingIOError when nothing could be taken;
  BrokenPipeError once the connection is closed (the server's close read, or its end) and
  no frame is left half-written: the event loops read it as the link's loss, as a socket's.
- ``recv(n) -> bytes``: the payload of the binary frames that arrived, in any split (a
  message is not gathered whole). A ping is answered with a pong; a close from the server is
  answered with a close and read as the end of the stream (b""); so is the stream's own end.
  A text frame breaks MQTT's rule (MQTT-6.0.0-1): the connection is closed (1003) and
  ConnectionError raised. BlockingIOError when only control frames (or nothing) came.
- ``pending()``: payload bytes decoded and not yet returned, or bytes the stream holds.
- ``close()``: a close frame (1000) when the stream takes it at once, then the stream closed.

Pongs and the close answer wait behind a frame in progress (a control frame may not cut a
frame); they go out at the next ``send`` or ``recv``.

wsproto is imported when a WebSocket connection is made, not by ``edgebroker.client``.
"""

from __future__ import annotations

from edgebroker.client.handshake import READ, WRITE, drive

DEFAULT_PATH = "/mqtt"
SUBPROTOCOL = "mqtt"
# The most bytes read from the stream per recv.
READ_SIZE = 65536
# The most bytes put into one frame.
FRAME = 256 * 1024
# Status codes sent (RFC 6455 §7.4.1).
NORMAL_CLOSURE = 1000
UNSUPPORTED_DATA = 1003


class WebSocketRefused(ConnectionError):
    """The server did not upgrade the connection: its HTTP status and body."""

    def __init__(self, where: str, status: int, body: bytes):
        text = body.decode("utf-8", "replace").strip()
        super().__init__(f"WebSocket upgrade on {where} refused: HTTP {status}"
                         + (f": {text[:300]}" if text else ""))
        self.status = status


def open_websocket(stream, host: str, port: int | None, *, timeout: float,
                   path: str = DEFAULT_PATH, headers: list | None = None) -> "WebSocketTransport":
    """The upgrade on ``stream`` within ``timeout`` s; WebSocketRefused on an HTTP refusal,
    ConnectionError on anything else that ends it. ``stream`` is closed on failure."""
    return drive(websocket_upgrade(stream, host, port, path, headers), stream.fileno(), timeout)


def websocket_upgrade(stream, host: str, port: int | None, path: str = DEFAULT_PATH,
                      headers: list | None = None):
    """The upgrade as a client/handshake.py generator (yields READ/WRITE while the stream
    would block, returns the WebSocketTransport); the errors of ``open_websocket``."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, RejectConnection, RejectData, Request
    from wsproto.utilities import ProtocolError

    where = f"{host}:{port}{path}" if port else f"{host}{path}"
    ws = WSConnection(ConnectionType.CLIENT)
    status, body, accepted = None, b"", None
    try:
        authority = host if port in (None, 80, 443) else f"{host}:{port}"
        request = memoryview(ws.send(Request(host=authority, target=path,
                                             subprotocols=[SUBPROTOCOL],
                                             extra_headers=list(headers or ()))))
        while request:
            try:
                request = request[stream.send(request):]
            except BlockingIOError:
                yield WRITE
        while accepted is None:
            try:
                data = stream.recv(READ_SIZE)
            except BlockingIOError:
                yield READ
                continue
            if not data:
                if status is not None:
                    raise WebSocketRefused(where, status, body)
                raise ConnectionError(f"WebSocket upgrade on {where}: the server closed the "
                                      f"connection without an answer")
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    accepted = event
                    break
                if isinstance(event, RejectConnection):
                    status = event.status_code
                    if not event.has_body:
                        raise WebSocketRefused(where, status, b"")
                elif isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        raise WebSocketRefused(where, status, body)
        if accepted.subprotocol != SUBPROTOCOL:
            raise ConnectionError(f"WebSocket upgrade on {where}: the server chose the "
                                  f"subprotocol {accepted.subprotocol!r}, not {SUBPROTOCOL!r}")
    except ProtocolError as exc:
        stream.close()
        raise ConnectionError(f"WebSocket upgrade on {where}: not a WebSocket answer "
                              f"({exc})") from None
    except TimeoutError:              # thrown in by the driver
        stream.close()
        raise TimeoutError(f"WebSocket upgrade on {where}: no answer in time") from None
    except BaseException:
        stream.close()
        raise
    transport = WebSocketTransport(stream, ws)
    try:
        transport.take_events()     # frames that came with the 101 answer
    except ConnectionError:
        stream.close()
        raise
    return transport


class WebSocketTransport:
    """An open WebSocket connection carrying MQTT (module docstring)."""

    __slots__ = ("stream", "ws", "_held", "_frame", "_frame_head", "_control", "_closed",
                 "_events", "_states", "_local_error")

    def __init__(self, stream, ws):
        from wsproto import events
        from wsproto.connection import ConnectionState
        from wsproto.utilities import LocalProtocolError
        self.stream = stream
        self.ws = ws
        self._events = events
        self._states = ConnectionState
        self._local_error = LocalProtocolError
        self._held = bytearray()    # payload decoded, not yet returned by recv
        self._frame = b""           # the frame being written (its unwritten part)
        self._frame_head = 0        # bytes of it (header included) not yet covering payload
        self._control = b""         # pongs, close frames waiting to go out
        self._closed = False        # the stream's end (or the close handshake) was read

    def fileno(self) -> int:
        return self.stream.fileno()

    def pending(self) -> bool:
        return bool(self._held) or self.stream.pending()

    # -- writing ----------------------------------------------------------------------------------

    def send(self, data) -> int:
        if self._control and not self._frame:
            self._flush_control()
        if not self._frame:
            if self._closed or self.ws.state is not self._states.OPEN:
                raise BrokenPipeError("the WebSocket connection is closed")
            payload = bytes(data[:FRAME])
            try:
                frame = self.ws.send(self._events.Message(data=payload))
            except self._local_error as exc:
                raise ConnectionError(f"WebSocket: {exc}") from None
            self._frame = frame
            self._frame_head = len(frame) - len(payload)
        taken = self._write_frame()
        if taken == 0:
            raise BlockingIOError("WebSocket write would block")
        return taken

    def _write_frame(self) -> int:
        """Write what the stream takes of the frame in progress; the caller's bytes covered."""
        frame = self._frame
        written = 0
        try:
            while written < len(frame):
                written += self.stream.send(frame[written:])
        except BlockingIOError:
            pass
        self._frame = frame = frame[written:]
        head = self._frame_head
        self._frame_head = max(0, head - written)
        covered = max(0, written - head)
        if not frame and self._control:
            self._flush_control()
        return covered

    def _flush_control(self) -> None:
        data = self._control
        try:
            while data:
                data = data[self.stream.send(data):]
        except BlockingIOError:
            pass
        except OSError:
            data = b""
        self._control = data

    # -- reading ----------------------------------------------------------------------------------

    def recv(self, n: int) -> bytes:
        while not self._held and not self._closed:
            data = self.stream.recv(READ_SIZE)     # BlockingIOError passes to the caller
            if not data:
                self._closed = True
                break
            self.ws.receive_data(data)
            self.take_events()
            if not self._held and not self._closed and not self.stream.pending():
                if self._control and not self._frame:
                    self._flush_control()
                raise BlockingIOError("only WebSocket control frames")
        if self._control and not self._frame:
            self._flush_control()
        held = self._held
        if not held:
            return b""
        if len(held) <= n:
            self._held = bytearray()
            return bytes(held)
        out = bytes(held[:n])
        del held[:n]
        return out

    def take_events(self) -> None:
        events = self._events
        for event in self.ws.events():
            if isinstance(event, events.BytesMessage):
                self._held += event.data
            elif isinstance(event, events.Ping):
                if self.ws.state is self._states.OPEN:     # no pong once closing
                    self._control += self.ws.send(event.response())
            elif isinstance(event, events.CloseConnection):
                if self.ws.state is self._states.REMOTE_CLOSING:
                    self._control += self.ws.send(event.response())
                self._closed = True
                return
            elif isinstance(event, events.TextMessage):
                self._control += self.ws.send(events.CloseConnection(UNSUPPORTED_DATA,
                                                                     "binary frames only"))
                self._flush_control()
                self._closed = True
                raise ConnectionError("the server sent a WebSocket text frame (MQTT travels "
                                      "in binary frames only); connection closed")

    def close(self) -> None:
        if self.stream.fileno() < 0:
            return
        if not self._closed and not self._frame and self.ws.state is self._states.OPEN:
            self._control += self.ws.send(self._events.CloseConnection(NORMAL_CLOSURE))
        if not self._frame:
            self._flush_control()
        self._closed = True
        self.stream.close()
