"""`edgebroker upload status`: how far the log is uploaded.

While the broker runs, it is asked through its admin socket (the uploader's figures: state,
shipped, backlog, retries, last error, alarm). When no broker answers, the log directory is read
(read-only) and the upload mark and intent file tell what was shipped and what is left; the
retries and errors of past runs are in the broker's log, not on disk.

Not built yet (issue 23): ``upload run --once`` and ``upload pause|resume``.
"""

from __future__ import annotations

import json
import os
import time

from edgebroker import config as configuration
from edgebroker.cli import inspect, inspect_live
from edgebroker.errors import EdgebrokerError
from edgebroker.server.admin import socket_path
from edgebroker.uploader.uploader import UPLOAD_DIR, read_intent


def add_parser(commands) -> None:
    p = commands.add_parser("upload", help="the upload of the log upstream (status)")
    sub = p.add_subparsers(dest="upload_command", metavar="WHAT", required=True)
    sp = sub.add_parser("status", help="uploaded mark, backlog, last error (asks the running "
                                       "broker, else reads the log directory)")
    sp.add_argument("--data-dir", metavar="DIR", help="state directory (default: as serve)")
    sp.add_argument("-c", "--config", metavar="FILE", help="take data_dir from this config file")
    sp.add_argument("--format", choices=("text", "json"), default="text")
    sp.set_defaults(run=run_status)


def _state_dir(args) -> str:
    if args.data_dir:
        return args.data_dir
    config = configuration.load(args.config) if args.config else configuration.Config()
    return config.state_dir()


def _live(state_dir: str) -> dict | None:
    """The running broker's stats, or None when no broker answers on the admin socket."""
    path = socket_path(state_dir)
    if not os.path.exists(path):
        return None
    try:
        client = inspect_live.AdminClient(path)
    except EdgebrokerError:
        return None
    try:
        return client.ask({"cmd": "stats"})["stats"]
    finally:
        client.close()


def offline_status(state_dir: str) -> dict:
    """What the files say: the uploaded mark, the backlog after it, the intent file."""
    args = type("Args", (), {"data_dir": state_dir, "config": None})()
    cl = inspect.open_log(args)
    try:
        mark = cl.uploaded_offset
        segments, nbytes, oldest, _newest = cl.upload_backlog(mark)
        records = max(0, cl.next_offset - max(mark, cl.first_offset))
        intent = read_intent(os.path.join(state_dir, UPLOAD_DIR))
        return {"running": False, "uploaded_offset": mark, "next_offset": cl.next_offset,
                "backlog_records": records, "backlog_bytes": nbytes,
                "backlog_sealed_segments": segments,
                "backlog_age_seconds": (max(0.0, time.time() - oldest / 1000)
                                        if oldest is not None else 0.0),
                "intent": None if intent is None else {
                    "first": intent.first, "last": intent.last, "key": intent.key,
                    "shipped": intent.last < mark}}
    finally:
        cl.close()


def run_status(args) -> int:
    state_dir = _state_dir(args)
    stats = _live(state_dir)
    if stats is not None:
        fig = stats.get("upload")
        if args.format == "json":
            print(json.dumps({"running": True, "upload": fig}))
        else:
            print(f"broker running; upload {inspect_live.upload_line(fig)}")
        return 0
    st = offline_status(state_dir)
    if args.format == "json":
        print(json.dumps(st))
        return 0
    print(f"broker not running; uploaded up to offset {st['uploaded_offset']} (next offset "
          f"{st['next_offset']})")
    print(f"backlog     {st['backlog_records']} records, {st['backlog_bytes']} bytes "
          f"({st['backlog_sealed_segments']} sealed segments), oldest "
          f"{st['backlog_age_seconds']:.0f} s old")
    intent = st["intent"]
    if intent is not None and not intent["shipped"]:
        print(f"in flight   {intent['key']} (offsets {intent['first']}..{intent['last']}): "
              f"shipped again at the next start")
    return 0
