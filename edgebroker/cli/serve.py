"""`edgebroker serve`: run the broker in the foreground."""

from __future__ import annotations

import errno
import gc
import logging
import os
import signal
import stat
from contextlib import contextmanager

from edgebroker import config as configuration, logs, records
from edgebroker.cli.state_owner import refuse_foreign
from edgebroker.errors import ConfigError
from edgebroker.files import not_a_log_dir
from edgebroker.listener_config import UNIX_SOCKET_HINT


def add_parser(commands) -> None:
    p = commands.add_parser("serve", help="run the broker")
    p.add_argument("-c", "--config", metavar="FILE", help="TOML configuration file")
    p.add_argument("--listen", metavar="HOST:PORT", action="append",
                   help="listen here instead of the configured listeners (repeatable)")
    p.add_argument("--data-dir", metavar="DIR", help="state directory")
    p.set_defaults(run=run)


# A Unix socket's path: 108 bytes with the terminating NUL (sun_path).
UNIX_PATH_MAX = 107


def load(args, read=configuration.load) -> configuration.Config:
    """The config file plus command-line overrides (``read``: how the file is read)."""
    config = _overridden(read(args.config), args)
    with naming_the_file(None if args.listen else args.config):
        if args.listen:     # (those of the file were checked as it was read)
            configuration.check_addresses(config)
        configuration.check_authentication(config)
    return config


def _overridden(config: configuration.Config, args) -> configuration.Config:
    changes = {}
    if args.listen:
        changes["listener"] = tuple(configuration.parse_address(a) for a in args.listen)
    if args.data_dir:
        changes["data_dir"] = args.data_dir
    return records.replace(config, **changes) if changes else config


def load_all(args) -> configuration.Config:
    """``load``; a file with errors in its keys is refused with every problem `config check`
    finds in it (its certificate, password and ACL files, the state directory, the links...),
    not only those of the keys."""
    return load(args, read=_read_all)


def _read_all(path: str | None) -> configuration.Config:
    try:   # (parsed apart: the TOML parser's memory is never the broker's, toml_file)
        return configuration.load(path, apart=True)
    except ConfigError as exc:
        if exc.partial is None:     # (the file could not be read, or is not TOML)
            raise
        raise ConfigError(*exc.problems, *_named(path, problems_of(exc.partial))) from None


@contextmanager
def naming_the_file(where: str | None):
    """A ConfigError raised inside, its problems each prefixed with the configuration file
    ``where`` (``config.load`` names it in its own; checks made after it do not), as `config
    check` reports them. None: what is checked does not come from a file (no ``-c``, or a
    command-line option that overrides it)."""
    try:
        yield
    except ConfigError as exc:
        raise exc.in_file(where) from None


def _unwritable(path: str) -> str | None:
    """cli.state_dir's ``unwritable``, imported only for a directory that is not writable (a
    broker at idle does not hold that module: docs/deploy.md, idle RSS)."""
    if os.access(path, os.W_OK):
        return None
    from edgebroker.cli.state_dir import unwritable
    return unwritable(path)


def _cannot_create(path: str, exc: OSError) -> ConfigError:
    """The data_dir cannot be made: the systemd hint only for what the unit's sandbox may
    cause (a read-only file system, permissions), not for a path under a file, say."""
    why = f"data_dir: cannot create {path}: {exc.strerror}"
    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ConfigError(why)
    from edgebroker.cli.state_dir import with_hint
    return ConfigError(with_hint(path, why))


def prepare_state_dir(path: str) -> None:
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"data_dir: cannot create {path}: it exists and is not a directory")
    try:
        os.makedirs(path, mode=0o750, exist_ok=True)
    except OSError as exc:
        raise _cannot_create(path, exc) from None
    problem = _unwritable(path)
    if problem:
        raise ConfigError(problem)
    _check_log_dir(path)


def _check_log_dir(path: str) -> None:
    """The commit log's directory is not something else (before a listener is bound)."""
    problem = not_a_log_dir(os.path.join(path, "log"))
    if problem:
        raise ConfigError(f"data_dir: {problem}")


def check_state_dir(path: str) -> None:
    """The ConfigError ``prepare_state_dir`` would raise for ``path``, found without creating
    it (``config check``): an existing directory must be writable; else the nearest existing
    parent must take a new directory, which is tried by making one and removing it at once
    (the rights alone would not tell: /proc looks writable to root)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"data_dir: cannot create {path}: it exists and is not a directory")
    if os.path.isdir(path):
        problem = _unwritable(path)
        if problem:
            raise ConfigError(problem)
        _check_log_dir(path)
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    import tempfile
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".edgebroker-check-", dir=parent))
    except OSError as exc:
        raise _cannot_create(path, exc) from None


def check_links(config: configuration.Config) -> list:
    """What would stop the uploader or a bridge at start, before any state is opened: the
    bridges' TLS files, the uploader's gateway id, credentials and CA file; every problem at
    once. The modules are imported only when configured, as the broker does. Returns the
    bridges' TLS contexts (bridges.tls_contexts), which the broker then uses."""
    problems = []
    contexts = []
    if config.bridge:
        from edgebroker.bridge.bridges import tls_contexts
        try:
            contexts = tls_contexts(config.bridge)
        except ConfigError as exc:
            problems += exc.problems
    if config.upload.url:
        from edgebroker.uploader.configure import check_config
        try:
            check_config(config.upload)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(*problems)
    return contexts


def unix_socket_problems(config: configuration.Config) -> list[str]:
    """What would stop serve binding each Unix socket listener: a path too long, a directory
    missing (the state directory, serve creates before it listens) or, with no socket there
    yet, one this user cannot write (a socket there may be systemd's: socket activation), a
    file other than a socket in the way. Nothing is created or removed."""
    problems = []
    for i, lc in enumerate(config.listeners):
        path, key = lc.unix_socket, f"listener[{i}].unix_socket"
        if not path:
            continue
        if len(os.fsencode(path)) > UNIX_PATH_MAX:
            problems.append(f"{key}: {path} is longer than {UNIX_PATH_MAX} bytes (a Unix "
                            f"socket's path limit): serve cannot listen there")
            continue
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory) and directory != os.path.abspath(config.state_dir()):
            problems.append(f"{key}: the directory {directory} does not exist: serve cannot "
                            f"listen on {path}")
            continue
        try:
            mode = os.lstat(path).st_mode
        except OSError:     # (nothing there: serve creates the socket, in that directory)
            if os.path.isdir(directory) and not os.access(directory, os.W_OK | os.X_OK):
                problems.append(f"{key}: the directory {directory} is not writable by this "
                                f"user: serve cannot listen on {path} ({UNIX_SOCKET_HINT})")
            continue
        if not stat.S_ISSOCK(mode):     # (a stale socket, serve replaces)
            problems.append(f"{key}: {path}: a file that is not a socket is in the way: serve "
                            f"cannot listen there (remove it, or choose another path)")
    return problems


def load_again(args) -> configuration.Config:
    """On SIGHUP: ``load``, and the checks serve makes before it starts that hold for a
    running broker too (a file that a restart would refuse is refused now): the bridges' TLS
    files and the uploader's credentials (``check_links``), the state directory and the Unix
    socket paths, every problem at once. The certificate, password and ACL files are read by
    the reload itself (server/reload.py), after these; when something here is wrong they are
    read here too, so that the error says all that `config check` would (cli/config_check)."""
    config = load_all(args)
    checks = ((args.config, lambda: check_links(config)),
              (None if args.data_dir else args.config,
               lambda: check_state_dir(config.state_dir())),
              (None if args.listen else args.config, lambda: _raise(unix_socket_problems(config))))
    problems = []
    for where, check in checks:
        try:
            with naming_the_file(where):
                check()
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(*problems, *_named(args.config, file_problems(config)))
    _warn_exposed(config)
    return config


def _warn_exposed(config: configuration.Config) -> None:
    """At start and at each reload: a configuration file holding secrets that other users
    can read (config.exposed_secrets); a listener's certificate, or a bridge's client
    certificate, out of its dates; bridge rules that do not do what they seem
    (bridge_config.bridge_warnings)."""
    for warning in configuration.exposed_secrets(config):
        logging.getLogger(__name__).warning("%s", warning)
    if config.bridge:     # (bridge_config is loaded for [[bridge]] tables only)
        from edgebroker.bridge_config import bridge_warnings
        for warning in bridge_warnings(config.bridge):
            logging.getLogger(__name__).warning("%s", warning)
    # (ssl is loaded for TLS listeners and bridges only)
    if any(lc.tls for lc in config.listeners) or any(bc.cafile and bc.certfile
                                                     for bc in config.bridge):
        from edgebroker.server.tls_dates import certificate_date_warnings
        for warning in certificate_date_warnings(config.listeners, bridges=config.bridge):
            logging.getLogger(__name__).warning("%s", warning)


def problems_of(config: configuration.Config) -> list[str]:
    """What would stop ``serve`` after the file itself was read: the safe defaults for
    listeners, a state directory serve could not create or write (nothing is created), the
    bridges' TLS files and the uploader's credentials and CA file (``check_links``),
    and each certificate, password and ACL file (each file once). Of a file with errors, the
    [[listener]] and [[bridge]] tables with errors have their files read, not the rest."""
    problems: list[str] = []
    _collect(problems, configuration.check_authentication,
             records.replace(config, listener=configuration.undamaged(config.listener)))
    _collect(problems, check_state_dir, config.state_dir())
    _collect(problems, check_links, config)
    problems += unix_socket_problems(config)
    return problems + file_problems(config)


def file_problems(config: configuration.Config) -> list[str]:
    """The problems of each listener's certificate, password and ACL files (each file once),
    as ``problems_of`` reports them; also said by a failed reload (``load_again``): `config check`'s list."""
    from edgebroker.security.acl import Acl     # (serve itself reads them in server/app.py)
    from edgebroker.security.passwords import PasswordFile
    from edgebroker.security.policy import file_key
    problems: list[str] = []
    files_read = set()
    for i, lc in enumerate(config.listeners):
        if lc.tls:
            from edgebroker.server.tls import make_context
            _collect(problems, make_context, lc, f"listener[{i}]")
        auth = config.auth(lc)
        for load, kind in ((PasswordFile.load, "password_file"), (Acl.load, "acl_file")):
            path = getattr(auth, kind)
            if path and (load, path) not in files_read:
                files_read.add((load, path))
                _collect(problems, load, path, file_key(lc, kind, i))
    return problems


def _collect(problems: list[str], check, *args) -> None:
    try:
        check(*args)
    except ConfigError as exc:
        problems += exc.problems


def _named(where: str | None, problems: list[str]) -> list[str]:
    """``problems`` each prefixed with the configuration file, as ``naming_the_file`` does."""
    return ConfigError(*problems).in_file(where).problems if problems else []


def _raise(problems: list[str]) -> None:
    if problems:
        raise ConfigError(*problems)


class ReloadAfterStart:
    """The SIGHUP handler while the broker starts (its default action would end the process:
    a reload during a long restore, say): the loop, installing its own handler, does the
    reload once serving (server/loop.py)."""

    pending = False

    def __call__(self, signum, frame) -> None:
        self.pending = True


class StopAfterStart:
    """The SIGTERM and SIGINT handler while the broker starts (their default actions end
    the process at once, with no line in the log and the admin socket left behind): the
    broker stops once its state is restored, as after a stop while serving
    (server/loop.py)."""

    signum = 0    # the first stop signal received

    def __call__(self, signum, frame) -> None:
        self.signum = self.signum or signum


def run(args) -> int:
    signal.signal(signal.SIGHUP, ReloadAfterStart())
    # Ctrl-C ends the process while the configuration is read, even when started with SIGINT
    # ignored (a background job of a shell); the broker's own handlers take it from the start.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = load_all(args)
    logs.install(config.log_level)
    where = args.config
    with naming_the_file(where):
        bridge_tls = check_links(config)
    state_dir = config.state_dir()
    refuse_foreign(state_dir, "edgebroker serve")   # root on the service's state directory
    with naming_the_file(None if args.data_dir else where):
        prepare_state_dir(state_dir)
    with naming_the_file(None if args.listen else where):
        _raise(unix_socket_problems(config))    # (exit 2, as the checks above)
    _warn_exposed(config)
    # Imported after the configuration is read: the TOML parser's memory, when freed again
    # (toml_file), is then not interleaved with the broker's modules. What start-up
    # left to the garbage collector (the argument parser, `locale` unloaded by cli/main) is
    # collected first (1 to 2 ms): its room goes to the broker's modules, where gc.freeze at
    # READY=1 would keep it for good (docs/deploy.md, idle RSS).
    gc.collect()
    from edgebroker.server.app import App
    # Installed once the configuration is read: a read from a pipe (-c /dev/stdin, a FIFO)
    # that waits for its writer is then still ended by a stop signal.
    stop = StopAfterStart()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return App(config, reload_config=lambda: load_again(args), bridge_tls=bridge_tls).start()
