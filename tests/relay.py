"""A loopback TCP relay for the client tests: forwards each connection to a target, and can
stop forwarding the connections it has without closing them (``freeze``), as a link that
silently drops everything does; ``thaw`` forwards again. New connections are forwarded."""

from __future__ import annotations

import selectors
import socket
import threading


class Relay:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._frozen: set = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, name="test-relay", daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        with self._lock:
            for a, b in self._pairs:
                for s in (a, b):
                    if s.fileno() >= 0 and s not in self._frozen:
                        self._frozen.add(s)
                        self._sel.unregister(s)

    def thaw(self) -> None:
        with self._lock:
            for s in list(self._frozen):
                if s.fileno() >= 0:
                    self._sel.register(s, selectors.EVENT_READ)
            self._frozen.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for a, b in self._pairs:
            a.close()
            b.close()
        self.listener.close()

    def _run(self) -> None:
        peers: dict = {}
        while not self._stop.is_set():
            with self._lock:
                ready = self._sel.select(0.02)
                for key, _ in ready:
                    s = key.fileobj
                    if s is self.listener:
                        try:
                            a, _ = s.accept()
                        except BlockingIOError:
                            continue
                        b = socket.create_connection(self.target, timeout=5)
                        self.accepted += 1
                        for x in (a, b):
                            x.setblocking(True)
                            x.settimeout(5)
                        peers[a], peers[b] = b, a
                        self._pairs.append((a, b))
                        self._sel.register(a, selectors.EVENT_READ)
                        self._sel.register(b, selectors.EVENT_READ)
                        continue
                    if s in self._frozen:
                        continue
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    other = peers[s]
                    if not data:
                        for x in (s, other):
                            if x not in self._frozen:
                                try:
                                    self._sel.unregister(x)
                                except (KeyError, ValueError):
                                    pass
                            x.close()
                        continue
                    try:
                        other.sendall(data)
                    except OSError:
                        pass
