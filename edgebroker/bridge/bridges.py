"""The broker's bridges together, as the composition root (server/app.py) uses them: made from
the ``[[bridge]]`` tables, hooked into the core as log consumers, started, asked for their
figures, stopped with a final checkpoint each."""

from __future__ import annotations

import logging
import ssl

from edgebroker.bridge import checkpoint
from edgebroker.bridge.bridge import Bridge
from edgebroker.bridge.link import client_context
from edgebroker.errors import ConfigError

log = logging.getLogger("edgebroker.bridge")


def tls_contexts(bridges) -> list:
    """The TLS context of each bridge (None without ``cafile``); ConfigError naming the
    bridge's key when a certificate or key file cannot be used."""
    from edgebroker.client.tls import EncryptedKey, not_regular
    contexts = []
    problems = []
    for i, bc in enumerate(bridges):
        if not bc.cafile:
            contexts.append(None)
            continue
        odd = [f"bridge[{i}] ({bc.name}).{key}: {path}: not a regular file"
               for key, path in (("cafile", bc.cafile), ("certfile", bc.certfile),
                                 ("keyfile", bc.keyfile)) if path and not_regular(path)]
        if odd:     # (never opened: a FIFO would block the loop thread on SIGHUP)
            problems += odd
            contexts.append(None)
            continue
        try:
            contexts.append(client_context(bc.cafile, bc.certfile, bc.keyfile, bc.tls_verify))
        except EncryptedKey as exc:
            key = "keyfile" if bc.keyfile else "certfile"
            problems.append(f"bridge[{i}] ({bc.name}).{key}: {exc}")
            contexts.append(None)
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"bridge[{i}] ({bc.name}): cannot use its TLS files (cafile "
                            f"{bc.cafile!r}, certfile {bc.certfile!r}, keyfile {bc.keyfile!r}): "
                            f"{getattr(exc, 'strerror', None) or exc}")
            contexts.append(None)
    if problems:
        raise ConfigError(*problems)
    return contexts


class Bridges:
    def __init__(self, configs, contexts, broker, loop, state_dir: str):
        self.writer = checkpoint.CheckpointWriter()
        self.loop = loop
        self.items = [Bridge(bc, broker, loop.selector, loop.wake, state_dir, ctx)
                      for bc, ctx in zip(configs, contexts)]
        for bridge in self.items:
            bridge.writer = self.writer
        broker.log_consumers.extend(self.items)
        broker.bridge_figures = self.figures

    def start(self) -> None:
        self.writer.start()
        for bridge in self.items:
            bridge.start()

    def deliver(self) -> None:
        """After a wake-up (host names resolved)."""
        for bridge in self.items:
            bridge.deliver()

    def figures(self, wall_ms: int) -> list[dict]:
        """Those started (the metrics endpoint asks once before the bridges start)."""
        return [bridge.figures(wall_ms) for bridge in self.started()]

    def halt(self) -> None:
        """At shutdown, before the journal's final fsync: nothing new (stopping.py)."""
        for bridge in self.started():
            bridge.halt()

    def disconnect(self) -> None:
        """After the final fsync released the last acknowledgements: DISCONNECT behind them."""
        for bridge in self.started():
            bridge.disconnect()

    def closing(self) -> set:
        """The loop callbacks of the links still closing (the loop's drain at shutdown)."""
        found = {bridge.closing() for bridge in self.started()}
        found.discard(None)
        return found

    def started(self) -> list:
        return [bridge for bridge in self.items if bridge.outbound is not None]

    def stop(self) -> None:
        """Close the links and write each bridge's final cursor (durably, before returning)."""
        finals = [bridge.stop() for bridge in self.started()]
        self.writer.stop()
        for path, name, cursor, sent, packet_ids, subscriptions in finals:
            try:
                checkpoint.write(path, name, cursor, sent, packet_ids, subscriptions)
            except OSError as exc:
                log.error("bridge %s: cannot write its final checkpoint %s: %s", name, path,
                          exc.strerror or exc)
