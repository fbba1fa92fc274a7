"""`edgebroker inspect stats|clients|bridges`: ask the running broker through its admin socket.

The socket is ``<state directory>/admin.sock``; the state directory comes from
``--data-dir``, else ``data_dir`` of ``-c FILE``, else the same default as
``serve`` ($STATE_DIRECTORY, else ./edgebroker-data). ``--socket PATH`` names
the socket directly.

``add_subcommands(inspect_subparsers)`` adds these commands under an existing
``inspect`` parser (the offline ``inspect`` commands live in their own module).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys
import time
from contextlib import contextmanager

from edgebroker.cli.options import add_format, seconds
from edgebroker.cli.state_dir import state_dir_of
from edgebroker.core.metrics import SORT_KEYS
from edgebroker.errors import EdgebrokerError
from edgebroker.server.admin import socket_path

TIMEOUT = 10.0        # seconds for a whole reply, from the request sent to its line's end
MAX_REPLY = 32 << 20  # bytes of a reply line (`clients --limit 0`, 10,000 clients: ~6 MiB)


def add_subcommands(inspect_commands) -> None:
    stats = inspect_commands.add_parser(
        "stats", help="figures of the running broker: connections, messages, limits, loop, memory")
    _add_common(stats)
    stats.set_defaults(run=run_stats)

    clients = inspect_commands.add_parser(
        "clients", help="the running broker's connected clients, busiest first")
    _add_common(clients)
    clients.add_argument("--sort", choices=SORT_KEYS, default="msgs_in_rate",
                         help="column to sort by, largest first (default msgs_in_rate)")
    clients.add_argument("--limit", type=_count, default=20, metavar="N",
                         help="show the first N clients (default 20; 0: all)")
    clients.add_argument("--watch", type=seconds, nargs="?", const=2.0, default=None,
                         metavar="SECONDS",
                         help="refresh every SECONDS (default 2) until Ctrl-C or SIGTERM")
    clients.add_argument("--iterations", type=_count, default=0, metavar="N",
                         help="with --watch: stop after N refreshes (default: never)")
    clients.set_defaults(run=run_clients)

    bridges = inspect_commands.add_parser(
        "bridges", help="the running broker's bridges: link, cursor, checkpoint, lag, resends")
    _add_common(bridges)
    bridges.set_defaults(run=run_bridges)


def _add_common(p) -> None:
    p.add_argument("-c", "--config", metavar="FILE", help="configuration file (for data_dir)")
    p.add_argument("--data-dir", metavar="DIR", help="state directory of the running broker")
    p.add_argument("--socket", metavar="PATH", help="admin socket path (instead of the above)")
    add_format(p)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def admin_path(args) -> str:
    if args.socket:
        return args.socket
    return socket_path(state_dir_of(args))


class ConnectionClosed(EdgebrokerError):
    """The broker closed the admin connection (it drops one idle for 60 s; a restart)."""


class NoAnswer(EdgebrokerError):
    """The broker took the request and sent nothing back within the timeout (its loop held:
    a long log replay at start, a stopped process)."""


class Unreachable(EdgebrokerError):
    """No connection to the admin socket; ``error``: the OSError of the connect."""

    def __init__(self, message: str, error: OSError):
        super().__init__(message)
        self.error = error


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return True         # gone meanwhile: the connect's own error says enough


class AdminClient:
    """One connection to the admin socket; ``ask`` sends a request and returns the reply."""

    def __init__(self, path: str, timeout: float = TIMEOUT):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.timeout = timeout
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            why = exc.strerror or exc
            if exc.errno == errno.ECONNREFUSED and not _is_socket(path):
                why = "not a socket"
            hint = ("run this as the broker's user (or root)"
                    if exc.errno in (errno.EACCES, errno.EPERM) else
                    "is the broker running with this data directory? see --data-dir")
            raise Unreachable(f"cannot reach the broker's admin socket {path}: {why} ({hint})",
                              exc) from None
        self.buf = bytearray()

    def ask(self, request: dict) -> dict:
        deadline = time.monotonic() + self.timeout
        try:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
            end = self.buf.find(b"\n")
            while end < 0:
                if len(self.buf) > MAX_REPLY or time.monotonic() >= deadline:
                    raise self._no_line_end()
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionClosed(f"the broker closed the admin connection {self.path}")
                end = chunk.find(b"\n")
                if end >= 0:
                    end += len(self.buf)
                self.buf += chunk
        except (BrokenPipeError, ConnectionResetError):
            raise ConnectionClosed(f"the broker closed the admin connection "
                                   f"{self.path}") from None
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                if self.buf:
                    raise self._no_line_end() from None
                raise NoAnswer(f"admin socket {self.path}: no answer within "
                               f"{self.timeout:g} s") from None
            raise EdgebrokerError(f"admin socket {self.path}: {exc.strerror or exc}") from None
        line = bytes(self.buf[:end])
        del self.buf[:end + 1]
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):    # (JSONDecodeError, UnicodeDecodeError; nesting
            reply = None                            # deeper than the decoder's recursion limit)
        if not isinstance(reply, dict):
            raise EdgebrokerError(f"{self.path} did not answer as the broker's admin socket "
                                  f"does (a JSON object per line): it sent {line[:60]!r}")
        if not reply.get("ok"):
            raise EdgebrokerError(f"the broker answered: {reply.get('error', reply)}")
        return reply

    def _no_line_end(self) -> EdgebrokerError:
        """Bytes and no line end, more than MAX_REPLY or for TIMEOUT s: not the broker."""
        return EdgebrokerError(
            f"{self.path} did not answer as the broker's admin socket does (a JSON object per "
            f"line): it sent {len(self.buf)} bytes without a line end (at most {MAX_REPLY} in "
            f"{self.timeout:g} s): {bytes(self.buf[:60])!r}")

    def close(self) -> None:
        self.sock.close()


@contextmanager
def broker_fields(path: str, cmd: str):
    """Around the use of a reply's fields: one missing or of another type (a socket answering
    JSON objects, but not the broker's) is the one-line error, not a traceback."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise EdgebrokerError(f"{path} did not answer as the broker's admin socket does: its "
                              f"reply to {cmd} is not the broker's ({what})") from None


# ----- stats -------------------------------------------------------------------------------

def ask_once(args, request: dict) -> dict:
    """One request on a connection of its own (the reply, ``ok`` checked)."""
    client = AdminClient(admin_path(args))
    try:
        return client.ask(request)
    finally:
        client.close()


def run_stats(args) -> int:
    reply = ask_once(args, {"cmd": "stats"})
    with broker_fields(admin_path(args), "stats"):
        if not isinstance(reply["stats"], dict):
            raise TypeError("stats is not an object")
        text = (json.dumps(reply["stats"], indent=2, sort_keys=True) if args.format == "json"
                else format_stats(reply["stats"]))
    print(text)
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"


def _nonzero(counts: dict) -> str:
    shown = [f"{name} {value}" for name, value in sorted(counts.items()) if value]
    return ", ".join(shown) if shown else "none"


def format_stats(s: dict) -> str:
    c = s["counters"]
    loop = s["loop"]
    proc = s["process"]
    limit = proc["memory_limit_bytes"]
    memory = f"rss {_size(proc['rss_bytes'])}, cpu {proc['cpu_seconds']:.1f} s, memory_limit "
    if not limit:
        memory += "off"
    else:
        memory += _size(limit)
        if proc["memory_over_limit"]:
            memory += " (OVER: refusing new connections, topics and subscriptions)"
    lines = [
        f"edgebroker {s['version']}, up {duration(s['uptime_seconds'])}",
        f"clients     {s['clients_connected']} connected, {s['sockets_open']} sockets, "
        f"{s['sessions']} sessions, {s['throttled_clients']} throttled now "
        f"({s['throttled_seconds']:.1f} s throttled in all)",
        f"topics      {s['topics']} tracked, {s['subscriptions']} subscriptions, "
        f"{s['retained_messages']} retained",
        f"queued      {s['queued_messages']} messages, {_size(s['queued_bytes'])}",
        f"publish     {c['publish_received']} received, {c['publish_sent']} sent, "
        f"{c['publish_dropped']} dropped, {c.get('publish_lost', 0)} lost (record gone), "
        f"{c.get('publish_refused', 0)} refused (log not writing)",
        f"traffic     {_size(c['bytes_received'])} received, {_size(c['bytes_sent'])} sent, "
        f"{c['packets_received']} packets in, {c['packets_sent']} out",
        f"connects    {c['connects_accepted']} accepted, {c['sockets_accepted']} sockets accepted",
        f"security    logins {c.get('logins_failed', 0)} failed, {c.get('logins_refused', 0)} "
        f"refused; ACL denied {c.get('acl_publish_denied', 0)} publishes, "
        f"{c.get('acl_subscribe_denied', 0)} subscriptions, "
        f"{c.get('acl_deliveries_denied', 0)} deliveries; TLS handshakes "
        f"{c.get('tls_handshakes_failed', 0)} failed",
        f"loop        pass p50 {loop['pass_p50_seconds'] * 1000:.3f} ms, "
        f"p99 {loop['pass_p99_seconds'] * 1000:.3f} ms, {loop['passes']} passes, "
        f"busy polls {loop['busy_polls_hit']} hit / {loop['busy_polls_missed']} "
        f"missed, {_contention_words(loop)}",
        f"process     {memory}",
        f"log         {_log_line(s.get('log'))}",
        f"upload      {upload_line(s.get('upload'))}",
        *(f"bridge      {bridge_line(b)}" for b in s.get("bridges") or ()),
        f"limits hit  {_nonzero(s['limit_hits'])}",
        f"refused     {_nonzero(s['refused'])}",
        f"dropped     {_nonzero(s['dropped'])}",
    ]
    return "\n".join(lines)


def _contention_words(loop: dict) -> str:
    """The loop's wait for a CPU (server/contention.py)."""
    if "cpu_contended" not in loop:
        return "CPU contention not reported"      # a broker from before the figures
    now = "CPU-CONTENDED now (no busy polls, no early sends)" if loop["cpu_contended"] else \
        "not CPU-contended"
    return (f"{now}, {loop['cpu_contention_episodes']} episodes "
            f"({loop['cpu_contended_seconds']:.1f} s)")


def _log_line(fig: dict | None) -> str:
    if fig is None:
        return "none"
    state = "" if fig["writing"] else " (NOT WRITING: disk full or failing)"
    return (f"durability {fig['durability']}, next offset {fig['next_offset']}, written "
            f"{fig['written_offset']}, fsynced {fig['durable_offset']}, {fig['acks_waiting']} acks "
            f"waiting, {fig['fsyncs']} fsyncs ({fig['fsync_errors']} failed){state}")


def upload_line(fig: dict | None) -> str:
    if fig is None:
        return "off"
    alarm = f" ALARM: {fig['last_error']}" if fig["alarm"] else ""
    last = ""
    if fig["last_error"] and not alarm:     # (a past error: when, and whether one went since)
        since = " (uploads succeeded since)" if fig["last_success_time"] > fig[
            "last_error_time"] else ""
        last = (f"; last error {duration(time.time() - fig['last_error_time'])} ago{since}: "
                f"{fig['last_error']}")
    return (f"to {fig['url']} as {fig['gateway_id']}, {fig['state']}, mark "
            f"{fig['uploaded_offset']}; shipped {fig['batches']} batches, {fig['records']} "
            f"records, {_size(fig['bytes'])}; backlog {fig['backlog_batches']} batches, "
            f"{_size(fig['backlog_bytes'])}, oldest {duration(fig['backlog_age_seconds'])}, lag "
            f"{fig['lag_seconds']:.1f} s; {fig['retries']} retries{alarm}{last}")


def bridge_line(fig: dict) -> str:
    error = f"; last error: {fig['last_error']}" if fig["last_error"] else ""
    return (f"{fig['name']} to {fig['remote']}, {fig['state']}, cursor {fig['cursor']}; lag "
            f"{fig['lag_messages']} messages, {_size(fig['lag_bytes'])}, "
            f"{fig['lag_seconds']:.1f} s; {fig['forwarded']} forwarded, {fig['resent']} resent, "
            f"{fig['refused']} refused, "
            f"{fig['gaps']} gaps ({fig['gap_offsets']} offsets), {fig['received']} received, "
            f"{fig['reconnects']} reconnects{error}")


# ----- clients -----------------------------------------------------------------------------

COLUMNS = (  # header, width, row key, format
    ("CLIENT ID", 24, "id", "s"), ("PEER", 21, "peer", "s"), ("MQTT", 5, "protocol", "s"),
    ("IN/s", 9, "msgs_in_rate", ".1f"), ("OUT/s", 9, "msgs_out_rate", ".1f"),
    ("IN B/s", 10, "bytes_in_rate", ".0f"), ("OUT B/s", 10, "bytes_out_rate", ".0f"),
    ("IN", 9, "msgs_in", "d"), ("OUT", 9, "msgs_out", "d"), ("DROPPED", 8, "dropped", "d"),
    ("THROTTLED", 9, "throttled_seconds", ".1f"), ("PENDING", 9, "pending_write_bytes", "d"),
    ("QUEUED", 7, "queued", "d"),
)


def table_head(columns) -> str:
    return "  ".join(f"{title:<{w}}" if fmt == "s" else f"{title:>{w}}"
                     for title, w, _, fmt in columns)


def table_row(columns, row: dict) -> str:
    """One row: text cut to its column (ending in ~), numbers right-aligned."""
    cells = []
    for _, width, key, fmt in columns:
        value = row[key]
        if fmt == "s":
            text = str(value)
            if len(text) > width:
                text = text[:width - 1] + "~"
            cells.append(f"{text:<{width}}")
        else:
            cells.append(f"{value:>{width}{fmt}}")
    return "  ".join(cells)


def format_clients(reply: dict, sort: str) -> str:
    lines = [f"{reply['total']} clients connected; sorted by {sort}", table_head(COLUMNS)]
    for row in reply["clients"]:
        lines.append(table_row(COLUMNS, row) + ("  (throttled)" if row["throttled"] else ""))
    return "\n".join(lines)


def _ask_again(client, path: str, request: dict):
    """A later ``--watch`` refresh: ``(client, reply)``, on a new connection when the broker
    closed the old one (it drops one idle for 60 s, a longer --watch; a restart); ``(None,
    why)`` when no broker answers (a restart's down time, a start replaying a long log, whose
    admin socket is open before its loop serves it: the next refresh tries again)."""
    if client is not None:
        try:
            return client, client.ask(request)
        except ConnectionClosed:
            client.close()
        except NoAnswer:
            client.close()
            return None, f"no answer within {client.timeout:g} s"
    try:
        client = AdminClient(path)
    except Unreachable as exc:
        return None, exc.error.strerror or str(exc.error)
    try:
        return client, client.ask(request)
    except ConnectionClosed:
        client.close()
        return None, "it closed the connection"
    except NoAnswer:
        client.close()
        return None, f"no answer within {client.timeout:g} s"


def run_clients(args) -> int:
    path = admin_path(args)
    client = AdminClient(path)
    request = {"cmd": "clients", "sort": args.sort, "limit": args.limit}
    clear = args.watch is not None and sys.stdout.isatty()
    done = 0
    answered = True
    try:
        while True:
            if not done:
                reply = client.ask(request)
            else:
                client, reply = _ask_again(client, path, request)
            answered = client is not None
            if not answered:
                # A restart's down time: say so, and try again at the next refresh.
                print(f"{time.strftime('%H:%M:%S')} the broker is not answering on {path} "
                      f"({reply}); trying again in {args.watch:g} s", file=sys.stderr,
                      flush=True)
            else:
                show_clients(args, path, reply, clear)
            done += 1
            if args.watch is None or (args.iterations and done >= args.iterations):
                return 0 if answered else 1
            time.sleep(args.watch)
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the way to end --watch
        if args.watch is None:
            raise
        return 0
    finally:
        if client is not None:
            client.close()


def show_clients(args, path: str, reply: dict, clear: bool) -> None:
    with broker_fields(path, "clients"):
        if args.format == "json":
            if not (isinstance(reply["clients"], list)
                    and isinstance(reply["total"], int)):
                raise TypeError("clients is not a list, or total not a number")
            text = json.dumps({"total": reply["total"], "clients": reply["clients"]})
        else:
            text = format_clients(reply, args.sort)
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    if args.watch is not None and args.format == "text":
        print(time.strftime("%H:%M:%S"))
    print(text, flush=True)


# ----- bridges -----------------------------------------------------------------------------

BRIDGE_COLUMNS = (  # header, width, row key, format
    ("BRIDGE", 12, "name", "s"), ("REMOTE", 21, "remote", "s"), ("STATE", 10, "state", "s"),
    ("CURSOR", 10, "cursor", "d"), ("ON DISK", 10, "checkpoint_cursor", "d"),
    ("LAG", 9, "lag_messages", "d"), ("LAG B", 10, "lag_bytes", "d"),
    ("LAG s", 7, "lag_seconds", ".1f"), ("INFLIGHT", 8, "inflight", "d"),
    ("FORWARDED", 10, "forwarded", "d"), ("RESENT", 8, "resent", "d"),
    ("REFUSED", 8, "refused", "d"), ("GAPS", 5, "gaps", "d"),
    ("RECEIVED", 9, "received", "d"), ("RECONNECTS", 10, "reconnects", "d"),
)


def format_bridges(bridges: list[dict]) -> str:
    if not bridges:
        return "no bridges ([[bridge]] tables in the configuration: docs/bridge.md)"
    lines = [table_head(BRIDGE_COLUMNS)]
    for row in bridges:
        lines.append(table_row(BRIDGE_COLUMNS, row))
        if row["gaps"]:
            lines.append(f"  {row['name']}: {row['gap_offsets']} log offsets lost to the "
                         f"remote in {row['gaps']} gaps (retention_bytes)")
        if row["unsendable"]:
            lines.append(f"  {row['name']}: {row['unsendable']} messages skipped, their remote "
                         "topic no valid MQTT topic name (unsendable)")
        if row.get("expired"):
            lines.append(f"  {row['name']}: {row['expired']} messages skipped, their Message "
                         "Expiry passed before they were forwarded (expired)")
        if row["checkpoint_damaged"]:
            lines.append(f"  {row['name']}: started {row['checkpoint_damaged']} time(s) at the "
                         "head of the log, its checkpoint damaged (bridge-*.json.damaged)")
        if row["checkpoint_failures"]:
            lines.append(f"  {row['name']}: {row['checkpoint_failures']} checkpoint writes "
                         "failed")
        if row["last_error"]:
            lines.append(f"  {row['name']}: last error: {row['last_error']}")
    return "\n".join(lines)


def run_bridges(args) -> int:
    reply = ask_once(args, {"cmd": "bridges"})
    with broker_fields(admin_path(args), "bridges"):
        if not isinstance(reply["bridges"], (list, type(None))):
            raise TypeError("bridges is not a list")
        text = (json.dumps({"bridges": reply["bridges"]}, indent=2, sort_keys=True)
                if args.format == "json" else format_bridges(reply["bridges"]))
    print(text)
    return 0
