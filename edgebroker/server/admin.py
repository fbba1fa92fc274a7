"""The admin socket: a Unix socket in the state directory for live questions to the broker.

``<state_dir>/admin.sock``, mode 0600 (only the broker's user). Served by the
core loop like any other socket, never blocking it: one request per line, one
JSON reply per line, on the same connection as long as the caller likes.

A request is a JSON object with ``cmd`` and the command's arguments, or just
the command's name (``stats``) for quick use with ``socat``:

    {"cmd": "stats"}                                     -> {"ok": true, "stats": {...}}
    {"cmd": "clients", "sort": "msgs_in_rate", "limit": 20}
                                                         -> {"ok": true, "total": N, "clients": [...]}
    {"cmd": "bridges"}                                   -> {"ok": true, "bridges": [{...}, ...]}
    {"cmd": "upload_pause"}                              -> {"ok": true, "changed": bool, "upload": {...}}
    {"cmd": "upload_resume"}               -> {"ok": true, "changed": bool, "was": str, "upload": {...}}
                        (was: "paused", "alarm" or "retrying": a back-off cut short; else "")
    {"cmd": "reload"}                       -> {"ok": true, "restart_needed": [...]}
                        (the configuration read again and applied before the reply, as on
                        SIGHUP; refused: {"ok": false, "error": why}; `edgebroker config reload`)
    {"cmd": "help"}                                      -> {"ok": true, "commands": {...}}

Errors: ``{"ok": false, "error": "..."}``. ``docs/metrics.md`` describes the
fields. At most ``MAX_CONNECTIONS`` callers at a time; a request line is at
most ``MAX_LINE`` bytes; a caller silent for ``IDLE_TIMEOUT`` s is dropped. At most
``MAX_REQUESTS_PER_PASS`` requests of one connection are answered per loop pass, and the
next ones only once the caller has taken the replies to those.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import selectors
import socket

from edgebroker.listener_config import ADMIN_SOCKET
from edgebroker.core import metrics
from edgebroker.core.timers import Timer
from edgebroker.errors import EdgebrokerError

log = logging.getLogger("edgebroker.admin")

SOCKET_NAME = ADMIN_SOCKET
MAX_CONNECTIONS = 8
MAX_LINE = 64 * 1024
# Request lines answered per connection per loop pass.
MAX_REQUESTS_PER_PASS = 16
IDLE_TIMEOUT = 60.0
# sun_path holds 108 bytes including the terminating NUL.
MAX_PATH = 107

COMMANDS = {
    "stats": "broker-wide figures: connections, messages, limits hit, refusals, drops, loop, process",
    "clients": "connected clients with counters and rates; args: sort (one of "
               + ", ".join(metrics.SORT_KEYS) + "), limit (0: all; default 20)",
    "bridges": "each [[bridge]]: link state, cursor, lag, forwarded, resent, gaps (docs/bridge.md)",
    "upload_pause": "stop starting uploads and retries (a put in flight finishes)",
    "upload_resume": "go on uploading at once",
    "reload": "read the configuration again and apply it, as SIGHUP does; the reply comes "
              "once it is applied or refused (with the reason)",
    "help": "this list",
}


def socket_path(state_dir: str) -> str:
    """``<state_dir>/admin.sock``; relative to the working directory when the absolute path is
    over MAX_PATH and that one is not (the broker and the CLI both bind or connect so)."""
    path = os.path.join(state_dir, SOCKET_NAME)
    if len(os.fsencode(path)) > MAX_PATH:
        relative = os.path.relpath(path)
        if len(os.fsencode(relative)) <= MAX_PATH:
            return relative
    return path


class AdminServer:
    def __init__(self, loop, path: str, sock: socket.socket):
        self.loop = loop
        self.path = path
        self.sock = sock
        self.connections: set[AdminConnection] = set()
        loop.selector.register(sock, selectors.EVENT_READ, self.on_accept)

    @classmethod
    def open(cls, loop, state_dir: str) -> "AdminServer | None":
        path = socket_path(state_dir)
        if len(os.fsencode(path)) > MAX_PATH:
            log.warning("admin socket disabled: the path %s is longer than %d bytes (a Unix socket "
                        "limit); use a shorter data_dir for `edgebroker inspect`", path, MAX_PATH)
            return None
        _remove_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600: only the broker's user may ask
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            raise EdgebrokerError(f"cannot create the admin socket {path}: "
                                  f"{exc.strerror or exc}") from None
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(MAX_CONNECTIONS)
        sock.setblocking(False)
        log.info("admin socket %s", path)
        return cls(loop, path, sock)

    def on_accept(self, mask: int) -> None:
        for _ in range(MAX_CONNECTIONS):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("admin socket: accept failed: %s", exc.strerror or exc)
                return
            if len(self.connections) >= MAX_CONNECTIONS:
                try:
                    conn.send(_encode({"ok": False, "error": f"busy: {MAX_CONNECTIONS} admin "
                                                             "connections are open"}))
                except OSError:
                    pass
                conn.close()
                continue
            self.connections.add(AdminConnection(self, conn))

    def handle(self, line: bytes) -> dict:
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return {"ok": False, "error": "empty request"}
        if text.startswith("{"):
            try:
                request = json.loads(text)
            except (ValueError, RecursionError) as exc:    # (nested too deep to parse)
                return {"ok": False, "error": f"not valid JSON: {exc}"}
            if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
                return {"ok": False, "error": "expected a JSON object with a \"cmd\" string"}
        else:
            request = {"cmd": text}
        command = request["cmd"]
        broker = self.loop.broker
        now = self.loop.clock()
        if command == "stats":
            return {"ok": True, "stats": metrics.snapshot(broker, now)}
        if command == "clients":
            sort = request.get("sort", "msgs_in_rate")
            limit = request.get("limit", 20)
            if sort not in metrics.SORT_KEYS:
                return {"ok": False, "error": f"sort must be one of {', '.join(metrics.SORT_KEYS)}"}
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                return {"ok": False, "error": "limit must be a whole number >= 0 (0: all)"}
            total, rows = metrics.client_rows(broker, now, sort, limit)
            return {"ok": True, "total": total, "clients": rows}
        if command == "bridges":
            figures = broker.bridge_figures
            return {"ok": True, "bridges": figures(broker.journal.wall_ms()) if figures else []}
        if command in ("upload_pause", "upload_resume"):
            uploader = getattr(self.loop, "uploader", None)
            if uploader is None:
                return {"ok": False, "error": "uploading is off ([upload] url is not set)"}
            if command == "upload_pause":
                return {"ok": True, "changed": uploader.pause(), "upload": uploader.figures()}
            was = uploader.resume()   # "paused", "alarm", "retrying" (a back-off cut short), ""
            return {"ok": True, "changed": bool(was), "was": was, "upload": uploader.figures()}
        if command == "reload":
            if self.loop.on_reload is None:
                return {"ok": False, "error": "this broker cannot reload"}
            return self.loop.on_reload()
        if command == "help":
            return {"ok": True, "commands": COMMANDS}
        return {"ok": False, "error": f"unknown command {command!r}; try \"help\""}

    def close(self) -> None:
        for conn in list(self.connections):
            conn.close()
        try:
            self.loop.selector.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _remove_stale(path: str) -> None:
    """Remove a socket file left by a broker that died; refuse if a broker still answers, or
    if something listens on it without answering (a connection that times out or finds the
    queue of callers full: a broker whose loop is busy, or stopped, is still there). Only a
    refused connection (nobody listens) or a file gone meanwhile means a leftover."""
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # nobody listens: a leftover
    except (TimeoutError, BlockingIOError, InterruptedError):
        raise EdgebrokerError(f"another broker seems to be running with this state directory: "
                              f"its admin socket {path} is listened on but does not answer (its "
                              f"queue of callers is full or the process is stopped); not "
                              f"starting") from None
    except OSError as exc:
        raise EdgebrokerError(f"cannot tell whether another broker is running with this state "
                              f"directory: connecting to its admin socket {path} failed: "
                              f"{exc.strerror or exc}; not starting") from None
    else:
        raise EdgebrokerError(f"another broker is running with this state directory (its admin "
                              f"socket {path} answers)")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except OSError as exc:
        raise EdgebrokerError(f"cannot remove the old admin socket {path}: "
                              f"{exc.strerror or exc}") from None


def _encode(reply: dict) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


class AdminConnection:
    def __init__(self, server: AdminServer, sock: socket.socket):
        self.server = server
        self.sock = sock
        self.inbuf = bytearray()
        self.out = bytearray()
        self.closing = False
        self.events = selectors.EVENT_READ
        sock.setblocking(False)
        server.loop.selector.register(sock, self.events, self.on_event)
        self.timer = Timer(self._on_idle)
        self._touch()

    def _touch(self) -> None:
        loop = self.server.loop
        self.timer.start(loop.broker, loop.clock() + IDLE_TIMEOUT)

    def _on_idle(self) -> None:
        self.close()

    def on_event(self, mask: int) -> None:
        if mask & selectors.EVENT_READ and not self.closing:
            self._read()
        if mask & selectors.EVENT_WRITE and self.sock.fileno() != -1:
            if not self.out and not self.closing:
                self._answer()  # requests left from the last read
            self._flush()

    def _read(self) -> None:
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self._touch()
        self.inbuf += data
        self._answer()
        self._flush()

    def _answer(self) -> None:
        """Answer up to ``MAX_REQUESTS_PER_PASS`` complete request lines; the rest wait for
        the next pass (``_flush`` asks for it), so one read full of requests cannot hold the
        loop, and the replies wait in memory no further ahead of the caller than that."""
        for _ in range(MAX_REQUESTS_PER_PASS):
            end = self.inbuf.find(b"\n")
            if end < 0:
                break
            line = bytes(self.inbuf[:end])
            del self.inbuf[:end + 1]
            try:
                reply = self.server.handle(line)
            except Exception:  # a bug answering one request must not take the broker down
                log.exception("admin socket: internal error answering %r", line[:200])
                reply = {"ok": False, "error": "internal error (logged by the broker)"}
            self.out += _encode(reply)
        else:
            return
        if len(self.inbuf) > MAX_LINE:
            self.out += _encode({"ok": False, "error": f"request line longer than {MAX_LINE} bytes"})
            self.inbuf.clear()
            self.closing = True

    def _flush(self) -> None:
        if self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log.debug("admin socket: send failed: %s", exc)
                self.close()
                return
            del self.out[:sent]
        if not self.out and self.closing:
            self.close()
            return
        # Writable while replies or complete requests wait (the next pass answers those);
        # readable, for more requests, once none do.
        want = (selectors.EVENT_WRITE if self.out or b"\n" in self.inbuf
                else selectors.EVENT_READ)
        if want != self.events:
            self.events = want
            self.server.loop.selector.modify(self.sock, want, self.on_event)

    def close(self) -> None:
        if self.sock.fileno() == -1:
            return
        self.timer.cancel()
        self.server.connections.discard(self)
        try:
            self.server.loop.selector.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()
