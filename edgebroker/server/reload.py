"""A reload (SIGHUP): ``reload(app)``, over the state of ``server.app.App`` (the loop, the
broker, the listeners, the authenticator), applies what the configuration file says now;
``needs_restart`` names the settings the running broker keeps until a restart, logged in one
warning. ``App.reload`` imports this module at the first SIGHUP: a broker never reloaded does
not load it (docs/deploy.md, idle RSS)."""

from __future__ import annotations

import logging
from collections import Counter

from edgebroker.errors import ConfigError
from edgebroker.server import sdnotify
from edgebroker.server.descriptors import SPARE_DESCRIPTORS, reserve_descriptors
from edgebroker.server.loop import hold_window

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edgebroker.config import Config

log = logging.getLogger("edgebroker.server")


def _listening(lc) -> tuple:
    """What a listener's socket was opened with and speaks: changed only by a restart (a
    certfile added or removed would turn a TLS port plain, or a plain one TLS, under the
    clients configured for it)."""
    return lc.address, lc.protocol, lc.websocket_path, bool(lc.certfile)


def needs_restart(started: Config, new: Config) -> list[str]:
    """The keys of ``new`` that differ from the configuration the broker started with and take
    effect only after a restart (compared with the start, not the last reload: a second reload
    says it again)."""
    changed = []
    # (in any order: each listener keeps its own table when the tables only moved)
    if Counter(map(_listening, new.listeners)) != Counter(map(_listening, started.listeners)):
        changed.append("listeners (addresses, protocol, websocket_path, TLS on or off)")
    if new.state_dir() != started.state_dir():
        changed.append("data_dir")
    for name, key in (("log", "[log]"), ("metrics", "[metrics]"), ("upload", "[upload]"),
                      ("bridge", "[[bridge]]")):
        if getattr(new, name) != getattr(started, name):
            changed.append(key)
    return changed


def reload(app) -> dict:
    """SIGHUP on ``server.app.App`` ``app``, or the admin socket's ``reload``: the
    configuration read again and applied. Returns the admin socket's reply: ``{"ok": True,
    "restart_needed": [keys]}``, or ``{"ok": False, "error": why}`` when the broker refused
    the new configuration and runs on with the one it had (`edgebroker config reload` waits
    for it: docs/deploy.md)."""
    if app.reload_config is None:
        return {"ok": False, "error": "this broker was started without a configuration to "
                                      "read again"}
    sdnotify.reloading()
    try:
        return _reload(app)
    finally:
        sdnotify.notify("READY=1")


def _refused(why: str, exc_info: bool = False) -> dict:
    log.error("reload failed, keeping the running configuration: %s", why, exc_info=exc_info)
    return {"ok": False, "error": f"reload failed, keeping the running configuration: {why}"}


def _reload(app) -> dict:
    try:
        config = app.reload_config()
    except ConfigError as exc:
        return _refused(str(exc))
    except Exception as exc:
        return _refused(f"{type(exc).__name__}: {exc}", exc_info=True)
    changed = needs_restart(app.started, config)
    if changed:
        log.warning("reload: changes to %s take effect after a restart (the running "
                    "values stay)", ", ".join(changed))
    try:
        security = read_security(app, config)
    except ConfigError as exc:
        return _refused(str(exc))
    except (OSError, ValueError) as exc:
        # What reading a file can raise that its loader did not turn into a
        # ConfigError naming it (a gap there): nothing was applied yet.
        return _refused(f"{type(exc).__name__}: {exc}", exc_info=True)
    apply_security(app, config, *security)
    app.config = config
    app.loop.hold_window = hold_window(config.coalesce_ms)
    app.loop.busy_poll.seconds = config.busy_poll_us / 1e6
    app.broker.apply_config(config)
    _apply_limits(app, config)
    logging.getLogger("edgebroker").setLevel(config.log_level.upper())
    log.info("configuration reloaded from %s", config.source or "defaults")
    return {"ok": True, "restart_needed": changed}


def _apply_limits(app, config: Config) -> None:
    """Server-side limits on reload: the accept rate, the per-connection output bound, the
    descriptors reserved for max_connections."""
    limits = config.limits
    reserve_descriptors(limits.max_connections + SPARE_DESCRIPTORS)
    app.warn_open_files()
    gate = app.accept_gate
    if not limits.max_connection_rate:
        app.accept_gate = None
    elif gate is None:
        app.accept_gate = app._make_accept_gate(config)
    else:
        gate.rate = limits.max_connection_rate
        gate.burst = limits.connection_burst
    for transport in app.loop.transports:
        transport.max_pending = limits.max_pending_write_bytes

def match_listeners(running: list, new: tuple) -> list:
    """The index in the new file of the listener each running one (its ListenerConfig in
    ``running``) is, or None when it is not there (gone, or moved: it runs on until a
    restart). As many listeners as running: each whose address, protocol, WebSocket path and
    TLS are those of the table at its position takes that table. The others by those, and a
    listener on port 0 (``HOST:0`` may name several) only by a table equal to the one it
    runs with."""
    out: list = [None] * len(running)
    if len(running) == len(new):
        out = [i if _listening(lc) == _listening(new[i]) else None
               for i, lc in enumerate(running)]
    taken = set(out)
    for i, lc in enumerate(running):
        if out[i] is not None:
            continue
        fits = [j for j, c in enumerate(new) if j not in taken and _listening(c) == _listening(lc)
                and (lc.unix_socket or lc.port or c == lc)]
        j = i if i in fits else (fits[0] if fits else None)
        if j is not None:
            taken.add(j)
        out[i] = j
    return out

def read_security(app, config: Config) -> tuple[list, list]:
    """Re-read certificates, password and ACL files (SIGHUP), changing nothing yet: the
    (index in the new file, ListenerConfig) of each running listener, and its
    (TLSServer or None, ListenerPolicy). A running listener no longer in the file keeps its
    settings and security as they are: None for both. The files of every listener in the
    file are read, also those of one that a restart opens (added or moved): ConfigError,
    naming each, when a file cannot be used (the next start would refuse it)."""
    new = config.listeners
    read = app._security(config, list(enumerate(new)))
    matched = match_listeners([x.config for x in app.listeners], new)
    running = [None if j is None else (j, new[j]) for j in matched]
    return running, [None if j is None else read[j] for j in matched]

def apply_security(app, config: Config, running: list, security: list) -> None:
    """Put what ``read_security`` read in force. New connections use it; open TLS
    connections keep their session; ACL decisions of connected clients and stored sessions
    follow the re-read ACL."""
    for listener, found, read in zip(app.listeners, running, security):
        if found is None:
            log.warning("reload: listener %s is no longer in the file (removed, or its "
                        "address, protocol or websocket_path changed, or TLS turned on or "
                        "off; on port 0: its table changed while the listeners did): it keeps "
                        "its running settings, authentication, ACL and TLS until a restart",
                        listener.address)
            continue
        listener.reconfigure(found[1])
        listener.set_security(*read)
    app.authenticator.configure(config.max_login_failures, config.login_failure_window)
    _rebind_acls(app)
    unchanged = app.files_unchanged
    read, kept = [], []
    for listener, found in zip(app.listeners, running):
        if found is not None and listener.tls is not None:
            name = f"certificates of {listener.address}"
            (kept if ("tls", found[1]) in unchanged else read).append(name)
    for kind in ("password_file", "acl_file"):
        for path in sorted({getattr(r[1].settings, kind) for r in security if r} - {None, ""}):
            (kept if (kind, path) in unchanged else read).append(path)
    if app.bridges is not None:
        bridges_read, bridges_kept = app.bridges.reload_tls()
        read += bridges_read
        kept += bridges_kept
    log.info("reload: re-read %s%s", ", ".join(read) or "no security files",
             f"; unchanged since they were read, not read again: {', '.join(kept)}"
             if kept else "")

def _rebind_acls(app) -> None:
    """After a reload: each session follows the ACL of the listener its client came in on
    (the ACL file re-read, another one, or none any more). A connected client whose
    listener has an ACL file now and had none gets a view of it, and so does an offline
    session with a delayed will (the will is checked against it when due). Another offline
    session without one gets it when its client comes back (what it is sent is checked
    then, core.router)."""
    acls = {listener.address: listener.policy.acl for listener in app.listeners
            if listener.policy is not None}
    will_timers = app.broker.will_timers
    for session in app.broker.sessions.values():
        client = session.client
        view = session.acl
        if client is not None:
            address, username = client.listener_address, client.username
        elif view is not None:
            address, username = view.listener, view.username
        elif session in will_timers:
            # Its client (or the Departed standing for it after a restart) knows its listener.
            publisher = will_timers[session].publisher
            address, username = publisher.listener_address, publisher.username
        else:
            continue
        if address not in acls:
            continue        # a bridge's inbound side, or a listener no longer served
        acl = acls[address]
        if acl is None:
            view = None
        elif view is None:
            view = acl.view(session.client_id, username, address)
        else:
            view.rebind(acl)
        session.acl = view
        if client is not None:
            client.acl = view
