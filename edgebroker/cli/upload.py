"""`edgebroker upload status|pause|resume|run --once`: the upload of the log.

While the broker runs, it is asked through its admin socket (the uploader's figures: state,
shipped, backlog, retries, last error, alarm). When no broker answers, the log directory is read
(read-only) and the upload mark and intent file tell what was shipped and what is left; the
retries and errors of past runs are in the broker's log, not on disk. A broker that runs (it
holds the log's lock: cli/log_lock.py) but cannot be asked (its socket 0600 and another user,
or none: a data_dir too long for a socket path) is an error that says so, not the files' view.
A lock held with nobody listening on the socket (a broker replaying its log before it opens
the socket; ``run --once``) gets the files' view, with a line saying who may hold the log.

``pause`` and ``resume`` ask the running broker through its admin socket. ``run --once`` ships
every batch sealed now from a log no broker holds (it takes the log's lock, as ``serve`` does)
and exits; while a broker runs on the state directory the lock is taken and it refuses, naming
the broker's commands instead. On a terminal it shows a progress line. Run as root on a state
directory another user owns (the service's), it gives what it wrote there to that user
(cli/state_owner.py).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time

from edgebroker import config as configuration
from edgebroker.cli import inspect_common, inspect_live, log_lock
from edgebroker.cli.options import add_format
from edgebroker.cli.state_dir import state_dir_of
from edgebroker.cli.state_owner import handed_over
from edgebroker.errors import ConfigError, EdgebrokerError
from edgebroker.files import not_a_log_dir
from edgebroker.server.admin import MAX_PATH, socket_path


def add_parser(commands) -> None:
    p = commands.add_parser("upload", help="the upload of the log upstream (status, pause, "
                                                  "resume, run --once)")
    sub = p.add_subparsers(dest="upload_command", metavar="WHAT", required=True)
    sp = sub.add_parser("status", help="uploaded mark, backlog, last error (asks the running "
                                       "broker, else reads the log directory)")
    sp.add_argument("--data-dir", metavar="DIR", help="state directory (default: as serve)")
    sp.add_argument("-c", "--config", metavar="FILE", help="take data_dir from this config file")
    add_format(sp)
    sp.set_defaults(run=run_status)
    for name, what in (("pause", "stop uploading on the running broker (until resume)"),
                       ("resume", "go on uploading on the running broker")):
        cp = sub.add_parser(name, help=what)
        cp.add_argument("--data-dir", metavar="DIR", help="state directory (default: as serve)")
        cp.add_argument("-c", "--config", metavar="FILE", help="take data_dir from this file")
        add_format(cp)
        cp.set_defaults(run=run_control, action=name)
    rp = sub.add_parser("run", help="ship what is sealed now and exit (no broker running)")
    rp.add_argument("--once", action="store_true", required=True,
                    help="ship every sealed batch, then exit (the only mode)")
    rp.add_argument("-c", "--config", metavar="FILE", required=True,
                    help="the broker's config file ([upload] url, credentials, data_dir)")
    rp.add_argument("--data-dir", metavar="DIR", help="state directory (overrides the file's)")
    add_format(rp)
    rp.set_defaults(run=run_once)


def _state_dir(args) -> str:
    return state_dir_of(args)


def _live(state_dir: str) -> dict | str | None:
    """The running broker's stats, why its admin socket cannot be asked, or None when nobody
    listens there (no socket file, or one a broker left behind)."""
    path = socket_path(state_dir)
    if len(os.fsencode(path)) > MAX_PATH:
        return (f"the path is longer than {MAX_PATH} bytes (a Unix socket limit): the broker "
                f"runs without it; give it a shorter data_dir")
    try:
        client = inspect_live.AdminClient(path)
    except inspect_live.Unreachable as exc:
        if exc.error.errno == errno.EACCES:
            return (f"{exc.error.strerror} (only the broker's user may ask it: run the command "
                    f"as that user)")
        if exc.error.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        return exc.error.strerror or str(exc.error)
    try:
        reply = client.ask({"cmd": "stats"})
    finally:
        client.close()
    with inspect_live.broker_fields(path, "stats"):
        if not isinstance(reply["stats"], dict):
            raise TypeError("stats is not an object")
        return reply["stats"]


def offline_status(state_dir: str) -> dict:
    """What the files say: the uploaded mark, the backlog after it, the intent file."""
    args = type("Args", (), {"data_dir": state_dir, "config": None})()
    cl = inspect_common.open_log(args)
    try:
        mark = cl.uploaded_offset
        segments, nbytes, oldest, _newest = cl.upload_backlog(mark)
        records = max(0, cl.next_offset - max(mark, cl.first_offset))
        from edgebroker.uploader.uploader import UPLOAD_DIR, read_intent  # zstandard: on use
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


def live_status(stats: dict, state_dir: str) -> dict:
    """``--format json`` of a running broker, in the shape of the files' view: its keys from
    the uploader's figures (no intent: the uploader ships that batch itself), and all the
    figures under ``upload``. Uploading off, the broker does not measure the backlog: the
    files' view. KeyError or TypeError: not the broker's stats."""
    fig, log_fig = stats["upload"], stats["log"]
    if fig is None or log_fig is None:
        return {**offline_status(state_dir), "running": True, "log_held": False, "upload": None}
    mark, next_offset = fig["uploaded_offset"], log_fig["next_offset"]
    return {"running": True, "log_held": False, "uploaded_offset": mark,
            "next_offset": next_offset, "backlog_records": max(0, next_offset - mark),
            "backlog_bytes": fig["backlog_bytes"],
            "backlog_sealed_segments": fig["backlog_segments"],
            "backlog_age_seconds": fig["backlog_age_seconds"], "intent": None, "upload": fig}


def run_status(args) -> int:
    state_dir = _state_dir(args)
    stats = _live(state_dir)
    held = None
    if not isinstance(stats, dict):
        log_dir = os.path.join(state_dir, "log")
        if log_lock.held(log_dir):
            if stats is not None:
                raise EdgebrokerError(
                    f"a broker runs on {state_dir} (it holds the lock of {log_dir}) but its "
                    f"admin socket {socket_path(state_dir)} cannot be asked: {stats}")
            # Nobody listens on the socket: a broker replaying its log before it opens the
            # socket, or `upload run --once`, which has none. The files tell what they can.
            held = (f"another process holds the lock of {log_dir} and nobody answers on "
                    f"{socket_path(state_dir)} (a broker starting, or `edgebroker upload run "
                    f"--once`)")
    else:
        fig = stats.get("upload")
        with inspect_live.broker_fields(socket_path(state_dir), "stats"):
            text = (json.dumps(live_status(stats, state_dir)) if args.format == "json"
                    else f"broker running; upload {inspect_live.upload_line(fig)}")
        print(text)
        return 0
    st = offline_status(state_dir)
    if args.format == "json":
        print(json.dumps({**st, "log_held": held is not None, "upload": None}))
        return 0
    if held is not None:
        print(f"{held}: what the log directory says now")
    print(f"{'broker not running; ' if held is None else ''}uploaded up to offset "
          f"{st['uploaded_offset']} (next offset {st['next_offset']})")
    print(f"backlog     {st['backlog_records']} records, {st['backlog_bytes']} bytes "
          f"({st['backlog_sealed_segments']} sealed segments), oldest "
          f"{st['backlog_age_seconds']:.0f} s old")
    intent = st["intent"]
    if intent is not None and not intent["shipped"]:
        print(f"in flight   {intent['key']} (offsets {intent['first']}..{intent['last']}): "
              f"shipped again at the next start")
    return 0


def run_control(args) -> int:
    """``upload pause`` / ``upload resume`` through the admin socket."""
    path = socket_path(_state_dir(args))
    client = inspect_live.AdminClient(path)
    try:
        reply = client.ask({"cmd": f"upload_{args.action}"})
    finally:
        client.close()
    done = "paused" if args.action == "pause" else "resumed"
    with inspect_live.broker_fields(path, f"upload_{args.action}"):
        if not isinstance(reply["changed"], bool) or not isinstance(reply["upload"], dict):
            raise TypeError("changed is not true or false, or upload not an object")
        out = {"changed": reply["changed"]}
        if args.action == "resume":   # was: "paused", "alarm", "retrying" (a back-off cut short)
            out["was"] = str(reply["was"])
            if out["was"] in ("alarm", "retrying"):   # the batch goes again now
                done = "retrying now (the upload was " + (
                    "in alarm)" if out["was"] == "alarm" else "backing off after an error)")
        if args.format == "json":
            text = json.dumps({**out, "upload": reply["upload"]})
        else:
            text = (f"upload {done}" if reply["changed"] else f"upload was already {done}") + \
                f"\nupload {inspect_live.upload_line(reply['upload'])}"
    print(text)
    return 0


def run_once(args) -> int:
    """Ship the sealed batches of a log no broker holds, then exit (0: all shipped)."""
    config = configuration.load(args.config)
    if not config.upload.url:
        raise ConfigError(f"{args.config}: [upload] url is not set: nowhere to upload to")
    state_dir = state_dir_of(args, config)
    log_dir = os.path.join(state_dir, "log")
    if not os.path.isdir(log_dir):
        raise EdgebrokerError(not_a_log_dir(log_dir)
                              or f"no commit log at {log_dir} (use --data-dir)")
    inspect_common.ensure_stderr_logging()
    # As root on the service's state directory: what it writes there becomes the owner's.
    with handed_over(state_dir):
        return _ship(args, config, state_dir, log_dir)


def _held(state_dir: str, log_dir: str) -> str:
    """Why ``run --once`` cannot take the log: the running broker's uploader ships it, or
    it has uploading off, or (its admin socket unanswered) what holds the lock is unknown."""
    try:
        stats = _live(state_dir)
    except EdgebrokerError:          # (no answer in time, the connection closed)
        stats = None
    where = f"--data-dir {state_dir}"
    if not isinstance(stats, dict) or "upload" not in stats:
        return (f"another process holds the lock of {log_dir} (a broker, or another `upload "
                f"run --once`) and nobody answers on its admin socket; `edgebroker upload "
                f"status {where}` tells more")
    if stats["upload"] is None:
        return (f"a running broker owns the log in {log_dir} and has uploading off (no "
                f"[upload] url in its configuration): nothing ships while it runs; add "
                f"[upload] to its configuration and restart it, or stop it and run this again")
    return (f"a running broker owns the log in {log_dir}: its uploader ships the batches; use "
            f"`edgebroker upload status|pause|resume {where}` instead")


def _ship(args, config, state_dir: str, log_dir: str) -> int:
    from edgebroker.commitlog import CommitLog, LogLockedError, LogOptions
    from edgebroker.uploader.uploader import Uploader
    try:
        cl = CommitLog.open(log_dir, LogOptions.from_config(config.log, True))
    except LogLockedError:
        raise EdgebrokerError(_held(state_dir, log_dir)) from None
    tty = sys.stderr.isatty()
    started = time.monotonic()

    def progress(fig: dict) -> None:
        if tty:
            print(f"\rshipped {fig['batches']} batches, {fig['records']} records, "
                  f"{fig['bytes']} bytes; left {fig['backlog_bytes']} bytes of sealed and "
                  f"open segments   ", end="", file=sys.stderr, flush=True)

    try:
        uploader = Uploader(cl, state_dir, config.upload)
        try:
            shipped = uploader.run_once(progress)
        except OSError as exc:    # the upload directory itself (its own files: LocalError)
            raise EdgebrokerError(f"upload run: {exc.filename or uploader.dir}: "
                                  f"{exc.strerror or exc}") from None
        except KeyboardInterrupt:
            print(file=sys.stderr)
            print("interrupted; the batch in flight goes again at the next run", file=sys.stderr)
            return 130
        fig = uploader.figures()
    finally:
        cl.close()
    if tty and shipped:
        print(file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"shipped_batches": shipped,
                          "seconds": round(time.monotonic() - started, 3), **fig}))
        return 0
    print(f"shipped {shipped} batches ({fig['records']} records, {fig['bytes']} bytes) to "
          f"{fig['url']} in {time.monotonic() - started:.1f} s; uploaded up to offset "
          f"{fig['uploaded_offset']}; {fig['backlog_bytes']} bytes wait in the segment being "
          f"written")
    return 0
