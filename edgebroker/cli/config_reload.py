"""`edgebroker config reload`: make the running broker read its configuration again, and wait
until it has applied it or refused it (the systemd unit's last ``ExecReload=`` line, so that
`systemctl reload edgebroker` returns once the new configuration is live: docs/deploy.md).

It asks through the admin socket (``{"cmd": "reload"}``, server/admin.py): the broker does
what a SIGHUP does, in its loop, and answers when done. Exit 0 once the configuration is
live; 1 with the broker's reason when it refused it (and runs on with the one it had), when
no broker answers on the socket, or when none answered within ``--timeout`` seconds.

The broker reads the file it was started with (``serve -c``); ``-c`` here only says where the
state directory, and so the admin socket, is, as for `inspect stats`. When the file's data_dir
was changed (that takes a restart), the socket is not where the file says: with ``--pid`` (the
unit gives $MAINPID) the broker is sent SIGHUP instead, which applies the rest of the file,
without waiting. A timeout does not take the request back: the broker applies it when its
loop goes on.
"""

from __future__ import annotations

import os
import signal

from edgebroker.cli.options import seconds
from edgebroker.errors import EdgebrokerError

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
                   help=f"give up when no answer came within SECONDS (default {TIMEOUT:g}; "
                        f"the broker still applies the request when it gets to it)")
    p.add_argument("--pid", type=int, metavar="PID",
                   help="the broker's process (systemd: $MAINPID): when its admin socket cannot "
                        "be reached (data_dir changed in the file), send it SIGHUP instead, "
                        "without waiting")
    p.set_defaults(run=run)


def run(args) -> int:
    from edgebroker.cli.inspect_live import AdminClient, NoAnswer, admin_path, broker_fields
    try:
        path = admin_path(args)
        client = AdminClient(path, timeout=args.timeout)
    except EdgebrokerError as exc:   # no socket there, or no state directory
        if not args.pid:
            raise
        return _signal(args.pid, exc)
    try:
        reply = client.ask({"cmd": "reload"})   # (a refusal: EdgebrokerError, its reason)
    except NoAnswer as exc:
        raise NoAnswer(f"{exc}: the request stays with the broker, which applies it when its "
                       f"loop goes on (see the journal)") from None
    finally:
        client.close()
    with broker_fields(path, "reload"):
        later = ", ".join(reply["restart_needed"])
    print("configuration reloaded" + (f"; changes to {later} take effect after a restart"
                                      if later else ""))
    return 0


def _signal(pid: int, why: EdgebrokerError) -> int:
    """The admin socket is not where the file says: SIGHUP to the broker's process instead."""
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise EdgebrokerError(f"{why}; and cannot send SIGHUP to process {pid}: "
                              f"{exc.strerror}") from None
    print(f"{why}; sent SIGHUP to process {pid} instead (a data_dir changed in the file takes "
          f"effect after a restart): not waiting for the result, see the journal")
    return 0
