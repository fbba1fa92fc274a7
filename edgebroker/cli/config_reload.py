"""`edgebroker config reload`: make the running broker read its configuration again, and wait
until it has applied it or refused it (the systemd unit's last ``ExecReload=`` line, so that
`systemctl reload edgebroker` returns once the new configuration is live: docs/deploy.md).

It asks through the admin socket (``{"cmd": "reload"}``, server/admin.py): the broker does
what a SIGHUP does, in its loop, and answers when done. Exit 0 once the configuration is
live; 1 with the broker's reason when it refused it (and runs on with the one it had), when
no broker answers on the socket, or when none answered within ``--timeout`` seconds.

The broker reads the file it was started with (``serve -c``); ``-c`` here only says where the
state directory, and so the admin socket, is, as for `inspect stats`.
"""

from __future__ import annotations

from edgebroker.cli.options import seconds

TIMEOUT = 30.0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "reload", help="make the running broker read its configuration again, and wait for it",
        description="Ask the running broker (its admin socket) to read its configuration file "
                    "again and apply it, as SIGHUP does; return once it has, or fail with the "
                    "broker's reason when it refused the file.")
    p.add_argument("-c", "--config", metavar="FILE",
                   help="configuration file (for data_dir: where the admin socket is)")
    p.add_argument("--data-dir", metavar="DIR", help="state directory of the running broker")
    p.add_argument("--socket", metavar="PATH", help="admin socket path (instead of the above)")
    p.add_argument("--timeout", type=seconds, default=TIMEOUT, metavar="SECONDS",
                   help=f"give up when no answer came within SECONDS (default {TIMEOUT:g})")
    p.set_defaults(run=run)


def run(args) -> int:
    from edgebroker.cli.inspect_live import AdminClient, admin_path, broker_fields
    path = admin_path(args)
    client = AdminClient(path, timeout=args.timeout)
    try:
        reply = client.ask({"cmd": "reload"})   # (a refusal: EdgebrokerError, its reason)
    finally:
        client.close()
    with broker_fields(path, "reload"):
        later = ", ".join(reply["restart_needed"])
    print("configuration reloaded" + (f"; changes to {later} take effect after a restart"
                                      if later else ""))
    return 0
