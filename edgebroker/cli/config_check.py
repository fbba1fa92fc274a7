"""`edgebroker config check`: validate a configuration file and say so.

Besides the keys, it applies the safe-default rules for listeners and reads
every certificate, password and ACL file the configuration names.
"""

from __future__ import annotations

import time

from edgebroker import config as configuration
from edgebroker.security.authenticator import Authenticator
from edgebroker.security.policy import ListenerPolicy
from edgebroker.server.tls import make_context


def add_parser(commands) -> None:
    p = commands.add_parser("config", help="configuration tools")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate a configuration file")
    check.add_argument("-c", "--config", metavar="FILE", required=True)
    check.set_defaults(run=run)


def run(args) -> int:
    config = configuration.load(args.config)
    configuration.check_authentication(config)
    authenticator = Authenticator(lambda: None, time.monotonic)
    files: dict = {}
    for i, lc in enumerate(config.listeners):
        if lc.tls:
            make_context(lc, f"listener[{i}]")
        ListenerPolicy.build(lc, config.auth(lc), authenticator, files)
    listeners = ", ".join(lc.address + (" (TLS)" if lc.tls else "")
                          + (f" (WebSockets {lc.websocket_path})"
                             if lc.protocol == "websockets" else "")
                          for lc in config.listeners)
    print(f"{args.config}: OK (listeners: {listeners}; state directory: {config.state_dir()})")
    return 0
