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
    """The TLS context of each bridge, with the ``file_stamp`` of its files taken before they
    were read (None without ``cafile``); ConfigError naming the bridge's key when a
    certificate or key file cannot be used."""
    contexts = []
    problems = []
    for i, bc in enumerate(bridges):
        try:
            contexts.append(tls_context(i, bc))
        except ConfigError as exc:
            problems += exc.problems
            contexts.append(None)
    if problems:
        raise ConfigError(*problems)
    return contexts


def tls_context(i: int, bc):
    """(SSLContext, file_stamp) of the bridge ``bc``, the ``i``-th table; None without
    ``cafile``."""
    from edgebroker.client.tls import EncryptedKey, not_regular
    from edgebroker.security.policy import file_stamp
    if not bc.cafile:
        return None
    files = [path for path in (bc.cafile, bc.certfile, bc.keyfile) if path]
    odd = [f"bridge[{i}] ({bc.name}).{key}: {path}: not a regular file"
           for key, path in (("cafile", bc.cafile), ("certfile", bc.certfile),
                             ("keyfile", bc.keyfile)) if path and not_regular(path)]
    if odd:     # (never opened: a FIFO would block the loop thread on SIGHUP)
        raise ConfigError(*odd)
    stamp = file_stamp(*files)
    try:
        return client_context(bc.cafile, bc.certfile, bc.keyfile, bc.tls_verify), stamp
    except EncryptedKey as exc:
        key = "keyfile" if bc.keyfile else "certfile"
        raise ConfigError(f"bridge[{i}] ({bc.name}).{key}: {exc}") from None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"bridge[{i}] ({bc.name}): cannot use its TLS files (cafile "
                          f"{bc.cafile!r}, certfile {bc.certfile!r}, keyfile {bc.keyfile!r}): "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


class Bridges:
    def __init__(self, configs, contexts, broker, loop, state_dir: str):
        self.writer = checkpoint.CheckpointWriter()
        self.loop = loop
        """``contexts``: of each bridge, None or (its TLS context, the file_stamp of its
        files when they were read), as ``tls_contexts`` gives them."""
        self.items = [Bridge(bc, broker, loop.selector, loop.wake, state_dir,
                             tls[0] if tls else None) for bc, tls in zip(configs, contexts)]
        self.stamps = [tls[1] if tls else None for tls in contexts]
        for bridge in self.items:
            bridge.writer = self.writer
        broker.log_consumers.extend(self.items)
        broker.bridge_figures = self.figures

    def reload_tls(self) -> tuple[list, list]:
        """On reload (SIGHUP): each TLS bridge's cafile, certfile and keyfile (those it runs
        with: its table is restart-only) read again when they changed since they were read,
        for its next connection (an open link keeps its session); files that cannot be used
        keep the context in use, with a warning. The bridges read again, and those whose
        files were unchanged."""
        from edgebroker.security.policy import file_stamp
        read, kept = [], []
        for i, bridge in enumerate(self.items):
            bc = bridge.config
            if bridge.tls_context is None:
                continue
            files = [path for path in (bc.cafile, bc.certfile, bc.keyfile) if path]
            if self.stamps[i] is not None and file_stamp(*files) == self.stamps[i]:
                kept.append(f"certificates of bridge {bc.name}")
                continue
            try:
                bridge.tls_context, self.stamps[i] = tls_context(i, bc)
            except ConfigError as exc:
                log.warning("reload: bridge %s keeps the TLS files it read before, for its "
                            "next connections too: %s", bc.name, "; ".join(exc.problems))
                continue
            read.append(f"certificates of bridge {bc.name}")
        return read, kept

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
