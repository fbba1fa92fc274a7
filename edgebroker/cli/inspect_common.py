"""What the ``inspect`` commands that read a state directory share: finding and opening its
commit log read-only (``open_log``), and printing tables (``table``, ``human_bytes``, ``out``).
cli/inspect.py holds the log commands, cli/inspect_sessions.py ``inspect sessions``."""

from __future__ import annotations

import errno
import logging
import os
import sys

from edgebroker.cli.state_dir import state_dir_of
from edgebroker.errors import EdgebrokerError
from edgebroker.files import not_a_log_dir


def log_dir(args) -> str:
    return os.path.join(state_dir_of(args), "log")


def open_log(args):
    from edgebroker.commitlog import CommitLog, LogError
    from edgebroker.commitlog.format import SEGMENT_SUFFIX
    logging.getLogger("edgebroker.commitlog").setLevel(logging.WARNING)
    ensure_stderr_logging()
    path = log_dir(args)
    try:
        os.stat(path)
    except PermissionError as exc:      # (isdir says False: the state directory is shut)
        raise EdgebrokerError(f"cannot read the commit log at {path}: {exc.strerror}") \
            from None
    except OSError:
        pass
    problem = not_a_log_dir(path)
    if problem:
        raise EdgebrokerError(problem)
    if not os.path.isdir(path):
        raise EdgebrokerError(f"no commit log at {path} (use --data-dir)")
    try:
        return CommitLog.open(path, readonly=True)
    except LogError as exc:
        cause = exc.__context__     # (LogError says what failed, raised from None)
        if not isinstance(cause, OSError) or cause.errno != errno.EMFILE:
            raise
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        segments = sum(name.endswith(SEGMENT_SUFFIX) for name in os.listdir(path))
        raise EdgebrokerError(
            f"{path}: {cause.strerror} ({segments} segments, two descriptors each; the open "
            f"files limit is {soft}, its hard limit {hard}): raise the hard limit (ulimit -Hn, "
            f"as root; systemd LimitNOFILE=) to "
            f"{2 * segments + 64} or more") from None


def ensure_stderr_logging() -> None:
    root = logging.getLogger("edgebroker")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        root.addHandler(handler)
        root.propagate = False


def table(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def out(text: str) -> None:
    sys.stdout.write(text + "\n")
