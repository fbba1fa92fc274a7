"""A configuration file's TOML table (config.load): read here, parsed by tomllib.

The TOML parser is never kept: a broker's memory is measured at idle (docs/deploy.md, idle
RSS ≤ 20 MB). At the start of ``serve`` the file is parsed in a child process (``apart``):
the parser is then never imported into the broker, and its memory is the child's, gone with
it. Imported and unloaded again here (the other commands, a child that could not be made),
it leaves about 0.2 MB of the broker's memory behind, in pages its freed objects shared with
objects that stay. A reload (SIGHUP) parses here and keeps the parser: unloading takes a full
garbage collection, which in a running broker holds the loop (160 ms at 20,000 sessions).
"""

from __future__ import annotations

import gc
import marshal
import os
import sys

from edgebroker.errors import ConfigError
from edgebroker.files import NotRegularFile, open_config

# The C parts of the TOML parser's imports that have a Python fallback, and the last Python
# version where they have one: datetime's (every version), typing's up to 3.11 (3.12's
# typing.py needs its C part: blocked, it fails).
C_PARTS = {"_datetime": (3, 99), "_typing": (3, 11)}


def read_toml(path: str, apart: bool = False) -> dict:
    """The file's table; a ConfigError naming the file when it cannot be read or is not
    TOML. ``apart``: parsed in a child process when the broker has not started (no
    ``gc.freeze`` yet), here when none can be made or the table holds a value marshal cannot
    carry (a date)."""
    try:
        with open_config(path) as fh:   # (here: a pipe is read once, by this process)
            data = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except NotRegularFile as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if apart and not gc.get_freeze_count():
        table = _parse_apart(path, data)
        if table is not None:
            return table
    return _parse_unloading(path, data)


def _parse_apart(path: str, data: bytes) -> dict | None:
    """``_parse`` in a child process (os.fork), its table or problems sent back marshalled;
    None when the child could not be made or could not send the table."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:    # the child: never returns, ends without the parent's exit handlers
        status = 1
        try:
            os.close(r)
            try:
                out = marshal.dumps((True, _parse(path, data)))
            except ConfigError as exc:
                out = marshal.dumps((False, exc.problems))
            with os.fdopen(w, "wb") as fh:
                fh.write(out)
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        out = fh.read()
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:   # SIGCHLD ignored (a launcher's choice): the kernel reaped it
        status = 0              # (what it sent is checked below: a table ends with its data)
    if status != 0 or not out:
        return None
    try:
        ok, value = marshal.loads(out)
    except (EOFError, ValueError, TypeError):   # cut short: the child did not end well
        return None
    if not ok:
        raise ConfigError(*value)
    return value


def _parse_unloading(path: str, data: bytes) -> dict:
    """``_parse`` here, the parser unloaded again with the modules only it brought in
    (typing, datetime) unless the broker runs (a reload: see the module's docstring)."""
    before = set(sys.modules)
    # The C parts of datetime and typing are shared objects, which stay mapped once loaded
    # (0.2 MB of the broker's memory): their Python fallbacks are used and unloaded instead.
    blocked = [name for name, last in C_PARTS.items()
               if name not in sys.modules and sys.version_info[:2] <= last]
    sys.modules.update(dict.fromkeys(blocked))
    try:
        import tomllib
    finally:
        for name in blocked:
            del sys.modules[name]
    del tomllib     # (imported with the C parts blocked; _parse takes it from sys.modules)
    try:
        return _parse(path, data)
    finally:
        if not gc.get_freeze_count():
            for name in set(sys.modules) - before:
                del sys.modules[name]
            gc.collect()


def _parse(path: str, data: bytes) -> dict:
    import tomllib
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0   # written by Windows editors
    try:
        return tomllib.loads(data[bom:].decode())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start + bom}): not valid TOML") from None
    except ValueError:   # an integer of over 4300 digits (int's own limit)
        raise ConfigError(f"{path}: not valid TOML: an integer of more than 4300 digits") from None
    except RecursionError:  # (the parser recurses once per level of arrays and inline tables)
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
