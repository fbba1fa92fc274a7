"""A reload (SIGHUP) onto a configuration, or a file it names, that `serve` would refuse: the
running broker logs "reload failed, keeping the running configuration" and serves on; `config
check` and `serve` refuse the same file with one line naming the file and what is wrong."""

import os
import signal
import threading

from conftest import default_config, run_cli, toml_dumps

from edgebroker.security.passwords import hash_password
from edgebroker.security.scram import derive, format_keys

FAILED = "reload failed, keeping the running configuration"


def one_line(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


def reload_refused(b, cfg: dict, *words: str) -> str:
    """Write ``cfg``, SIGHUP, and wait for the failed reload's line (holding ``words``); the
    broker still serves."""
    b.config_path.write_text(toml_dumps(cfg))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: FAILED in ln or "configuration reloaded" in ln, timeout=10,
                      start=mark)
    assert line is not None and FAILED in line, f"{line!r}\n{b.log_text()}"
    assert all(w in line for w in words), line
    assert b.alive()
    c = b.client("after-reload")
    c.subscribe("after/t")
    c.publish("after/t", b"still here")
    assert c.recv_publish().payload == b"still here"
    return line


def _superscript(digits: str) -> str:
    """``digits`` in superscript figures: str.isdigit() says yes, int() refuses them."""
    return digits.translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def test_password_file_numbers_in_other_digits_are_refused_not_a_crash(broker, tmp_path):
    """A hash's numbers (PBKDF2 iterations, scrypt parameters, SCRAM iterations) written with
    digits other than 0-9 killed the broker on SIGHUP (int() raised ValueError past the
    isdigit() check) and gave config check a traceback. Full-width digits, which int() takes,
    are refused the same way."""
    pbkdf2 = hash_password("pw", "pbkdf2")
    scrypt = hash_password("pw")
    count = pbkdf2.split("$")[2]
    scram = ("$scram-sha-256$v=1$i=4096$" + "A" * 22 + "$" + "A" * 43 + "=$" + "A" * 43 + "=")
    cases = [("pbkdf2", pbkdf2.replace(f"$7${count}$", f"$7${_superscript(count)}$")),
             ("scrypt", scrypt.replace("ln=14", "ln=" + _superscript("14"))),
             ("full-width", pbkdf2.replace(f"$7${count}$", "$7$" + "".join(
                 chr(ord(d) - ord("0") + ord("０")) for d in count) + "$")),
             ("scram", f"{pbkdf2}:{scram.replace('i=4096', 'i=' + _superscript('4096'))}")]
    b = broker()
    for name, stored in cases:
        pw = tmp_path / f"{name}.pw"
        pw.write_text(f"alice:{stored}\n", encoding="utf-8")
        pw.chmod(0o600)
        cfg = dict(b.config, password_file=str(pw))
        line = reload_refused(b, cfg, f"{b.config_path}: password_file: {pw} line 1: "
                                      f"user 'alice'")
        path = tmp_path / f"{name}.toml"
        path.write_text(toml_dumps(cfg))
        problem = line.split(f"{FAILED}: {b.config_path}: ", 1)[1]
        for command in ("config check", "serve"):
            r = run_cli(*command.split(), "-c", str(path))
            assert one_line(r) == f"edgebroker: config error: {path}: {problem}", command


def test_ports_in_other_digits_are_one_line_errors(tmp_path):
    """A port of '²' in --listen, metrics.listen or a bridge's address ended in a traceback."""
    r = run_cli("serve", "--listen", "127.0.0.1:²", "--data-dir", str(tmp_path / "d"))
    assert one_line(r) == "edgebroker: config error: --listen '127.0.0.1:²': expected HOST:PORT"
    for key, table in (("metrics.listen", {"metrics": {"listen": "127.0.0.1:１８８３"}}),
                       ("bridge[0].address", {"bridge": [{"name": "up", "address": "h:²",
                                                          "topic": [{"pattern": "a/#"}]}]})):
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), **table}))
        line = one_line(run_cli("config", "check", "-c", str(path)))
        assert line.startswith(f"edgebroker: config error: {path}: {key}: expected HOST:PORT"), line


NUL_PATHS = [  # (the key as problems name it, the table it is set in)
    ("data_dir", {"data_dir": "/tmp/d\0x"}),
    ("password_file", {"password_file": "/tmp/p\0w"}),
    ("acl_file", {"acl_file": "/tmp/a\0cl"}),
    ("listener[0].unix_socket", {"listener": [{"unix_socket": "/tmp/s\0ock"}]}),
    ("listener[0].certfile", {"listener": [{"port": 0, "certfile": "/tmp/c\0ert"}]}),
    ("listener[0].keyfile", {"listener": [{"port": 0, "certfile": "/c", "keyfile": "/k\0"}]}),
    ("listener[0].cafile", {"listener": [{"port": 0, "certfile": "/c", "cafile": "/\0ca"}]}),
    ("listener[0].password_file", {"listener": [{"port": 0, "password_file": "\0"}]}),
    ("listener[0].acl_file", {"listener": [{"port": 0, "acl_file": "a\0"}]}),
    ("bridge[0].cafile", {"bridge": [{"name": "up", "address": "h:1", "cafile": "/\0",
                                      "topic": [{"pattern": "a/#"}]}]}),
    ("bridge[0].certfile", {"bridge": [{"name": "up", "address": "h:1", "cafile": "/c",
                                        "certfile": "/\0", "topic": [{"pattern": "a/#"}]}]}),
    ("bridge[0].keyfile", {"bridge": [{"name": "up", "address": "h:1", "cafile": "/c",
                                       "certfile": "/c", "keyfile": "/\0",
                                       "topic": [{"pattern": "a/#"}]}]}),
    ("upload.ca_file", {"upload": {"url": "s3://bucket/p", "ca_file": "/\0"}}),
]


def test_a_path_with_a_nul_is_refused_naming_its_key(broker, tmp_path):
    """A path setting holding U+0000 passed config check (data_dir, unix_socket: "OK") and
    then gave serve a traceback ("embedded null byte"), or killed the broker on SIGHUP
    (password_file). Now it is refused as the file is read, naming the key."""
    for key, table in NUL_PATHS:
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), **table}))
        r = run_cli("config", "check", "-c", str(path))
        assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr
        want = f"edgebroker: config error: {path}: {key}: a path cannot contain U+0000 (NUL)"
        assert want in r.stderr, r.stderr
    path.write_text(toml_dumps({"data_dir": "/tmp/d\0x", "listener": [{"port": 0}]}))
    assert one_line(run_cli("serve", "-c", str(path))).startswith(
        f"edgebroker: config error: {path}: data_dir: a path cannot contain U+0000 (NUL), got ")
    b = broker()
    reload_refused(b, dict(b.config, password_file="/tmp/x\0y"),
                   f"{b.config_path}: password_file: a path cannot contain U+0000 (NUL)")


def test_a_reload_makes_the_checks_serve_makes_before_it_starts(broker, tmp_path, monkeypatch):
    """A reload took a configuration that config check and the next start refuse: a bridge
    whose CA file is missing, an s3 [upload] without credentials, a data_dir that cannot be
    made, a Unix socket in a directory that does not exist (each of these needs a restart,
    which would then fail). Each is refused as config check says it, naming the file."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)     # (the broker's environment)
    missing = tmp_path / "missing"
    (tmp_path / "a-file").write_text("")
    b = broker()
    changes = [
        ({"bridge": [{"name": "up", "address": "127.0.0.1:1", "cafile": str(missing / "ca"),
                      "topic": [{"pattern": "t/#"}]}]},
         f"bridge[0] (up): cannot use its TLS files (cafile '{missing / 'ca'}'"),
        ({"upload": {"url": "s3://bucket-x/p", "access_key_id": "AKIA"}},
         "upload.secret_access_key: empty while upload.access_key_id is set"),
        ({"data_dir": str(tmp_path / "a-file" / "data")},
         f"data_dir: cannot create {tmp_path / 'a-file' / 'data'}: Not a directory"),
        ({"listener": [*b.config["listener"], {"unix_socket": str(missing / "s.sock")}]},
         f"listener[1].unix_socket: the directory {missing} does not exist"),
    ]
    for change, problem in changes:
        cfg = dict(b.config, **change)
        reload_refused(b, cfg, f"{b.config_path}: {problem}")
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        r = run_cli("config", "check", "-c", str(path))
        assert f"edgebroker: config error: {path}: {problem}" in r.stderr, r.stderr
    b.config_path.write_text(toml_dumps(b.config))
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("configuration reloaded", timeout=10, start=mark), b.log_text()


def test_an_acl_file_that_is_not_a_regular_file_is_refused(broker, tmp_path):
    """An acl_file naming a FIFO blocked the broker's loop thread in open() on SIGHUP (no
    client served) and hung config check; /dev/zero ran config check out of memory. As for
    password_file, anything but a regular file is refused."""
    fifo = tmp_path / "acl.fifo"
    os.mkfifo(fifo)
    b = broker()
    for acl in (str(fifo), "/dev/zero"):
        cfg = dict(b.config, acl_file=acl)
        reload_refused(b, cfg, f"{b.config_path}: acl_file: {acl}: not a regular file")
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        for command in ("config check", "serve"):
            r = run_cli(*command.split(), "-c", str(path), timeout=30)
            assert one_line(r) == (f"edgebroker: config error: {path}: acl_file: {acl}: not a "
                                   f"regular file"), command


def test_the_files_of_a_listener_a_restart_opens_are_checked(broker, tmp_path):
    """A reload that adds a listener, or moves one (both need a restart), took the file
    although the listener's certificate, password or ACL file was missing; the next start
    refused it. They are read at the reload as at a start, and the reload is refused naming
    each, as config check does."""
    missing = tmp_path / "missing"
    files = {"certfile": str(missing / "c.crt"), "password_file": str(missing / "pw"),
             "acl_file": str(missing / "acl")}
    b = broker()
    running = b.config["listener"][0]
    for listeners in ([running, {"host": "127.0.0.1", "port": 0, **files}],
                      [{"host": "127.0.0.2", "port": 0, **files}]):
        i = len(listeners) - 1
        problems = [f"{b.config_path}: listener[{i}].{key}: {path}: file not found"
                    for key, path in files.items()]
        cfg = dict(b.config, listener=listeners)
        reload_refused(b, cfg, *problems)
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        r = run_cli("config", "check", "-c", str(path))
        for problem in problems:
            problem = problem.replace(str(b.config_path), str(path))
            assert f"edgebroker: config error: {problem}" in r.stderr, r.stderr


def test_values_nested_too_deeply_are_not_valid_toml(broker, tmp_path):
    """A value nested 500 arrays deep: config check and serve died with a RecursionError
    traceback (exit 1, which systemd restarts), a reload logged a traceback. Now one line
    naming the file, exit 2; a reload is refused."""
    b = broker()
    deep = "[" * 500 + "]" * 500
    text = toml_dumps(b.config) + f"\n[metrics]\nlisten = {deep}\n"
    path = tmp_path / "c.toml"
    path.write_text(text)
    for command in ("config check", "serve"):
        r = run_cli(*command.split(), "-c", str(path), timeout=30)
        assert one_line(r) == (f"edgebroker: config error: {path}: not valid TOML: arrays or "
                               f"tables nested too deeply"), command
    b.config_path.write_text(text)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: FAILED in ln or "configuration reloaded" in ln, timeout=10,
                      start=mark)
    assert line is not None and line.endswith(
        f"{FAILED}: {b.config_path}: not valid TOML: arrays or tables nested too deeply"), line
    assert "Traceback" not in b.log_text()
    assert b.client("after-reload").ping() == []


def test_password_file_numbers_of_thousands_of_digits_are_refused_not_a_crash(broker,
                                                                                tmp_path):
    """A hash's number of over 4300 digits (int()'s limit) gave config check and serve a
    traceback and a reload one not naming the file. Now refused as out of range, naming the
    file and line; leading zeros do not count."""
    pbkdf2 = hash_password("pw", "pbkdf2")
    count = pbkdf2.split("$")[2]
    scrypt = hash_password("pw")
    scram = ("$scram-sha-256$v=1$i=4096$" + "A" * 22 + "$" + "A" * 43 + "=$" + "A" * 43 + "=")
    big = "1" * 5000
    cases = [(pbkdf2.replace(f"$7${count}$", f"$7${big}$"), "PBKDF2 hash: iterations out of "
                                                            "range"),
             (scrypt.replace("ln=14", f"ln={big}"), "scrypt hash: parameters out of range"),
             (f"{pbkdf2}:{scram.replace('i=4096', f'i={big}')}",
              "SCRAM keys: iterations must be 4096 to 10000000")]
    b = broker()
    for n, (stored, problem) in enumerate(cases):
        pw = tmp_path / f"{n}.pw"
        pw.write_text(f"alice:{stored}\n", encoding="utf-8")
        pw.chmod(0o600)
        cfg = dict(b.config, password_file=str(pw))
        reload_refused(b, cfg, f"{b.config_path}: password_file: {pw} line 1: user 'alice': "
                               f"{problem}")
        path = tmp_path / f"{n}.toml"
        path.write_text(toml_dumps(cfg))
        for command in ("config check", "serve"):
            r = run_cli(*command.split(), "-c", str(path))
            assert one_line(r).startswith(f"edgebroker: config error: {path}: password_file: "
                                          f"{pw} line 1: user 'alice': {problem}"), command
    pw = tmp_path / "zeros.pw"
    zeros = "0" * 5000
    keys = format_keys(derive("pw", iterations=4096))
    pw.write_text(f"alice:{pbkdf2.replace(f'$7${count}$', f'$7${zeros}{count}$')}:"
                  f"{keys.replace('i=4096', f'i={zeros}4096')}\n")
    pw.chmod(0o600)
    path = tmp_path / "zeros.toml"
    path.write_text(toml_dumps(dict(b.config, password_file=str(pw))))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr


def test_a_pipe_as_the_configuration_is_read_at_start_only(broker, tmp_path):
    """`serve -c FIFO` (or -c /dev/stdin from a pipe, -c <(...)): a SIGHUP opened the pipe
    again on the loop thread and waited for a writer that never came: no client was served
    and SIGTERM was not acted on. The pipe is read at start; a reload is refused at once,
    saying why. A device is refused at start (/dev/zero never ends)."""
    fifo = tmp_path / "edgebroker.toml"
    os.mkfifo(fifo)
    text = toml_dumps(default_config(tmp_path))
    b = broker(config_file=False, args=["-c", str(fifo)], wait=False)
    written = threading.Event()

    def write():
        with open(fifo, "w") as fh:    # (returns once the broker opened the pipe)
            fh.write(text)
        written.set()

    threading.Thread(target=write, daemon=True).start()
    if not written.wait(15):
        with open(fifo, "rb"):   # unblocks the writer
            pass
        raise AssertionError(f"the broker never read {fifo}:\n{b.log_text()}")
    b.wait_ready()
    c = b.client("before")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log(lambda ln: FAILED in ln or "configuration reloaded" in ln, timeout=10,
                      start=mark)
    assert line and line.endswith(
        f"{FAILED}: {fifo}: not a regular file (a pipe), read at start: it cannot be read "
        f"again; restart to change the configuration"), f"{line!r}\n{b.log_text()}"
    assert c.ping() == []
    assert b.client("after-reload").ping() == []
    assert b.stop() == 0
    for command in ("config check", "serve"):
        r = run_cli(*command.split(), "-c", "/dev/zero")
        assert one_line(r) == ("edgebroker: config error: /dev/zero: not a regular file (a "
                               "character device)"), command


def test_a_failed_reload_says_every_problem_config_check_says(broker, tmp_path):
    """A reload refused for the configuration's keys, or for a bridge's TLS files, said only
    those: the password, certificate and ACL files were read after, so their problems came
    at the next reload. It says all of them at once, as config check does."""
    missing = tmp_path / "missing"
    b = broker()
    bridge = [{"name": "b", "address": "127.0.0.1:1", "cafile": str(missing / "ca"),
               "topic": [{"pattern": "a/#"}]}]
    listener = [{**b.config["listener"][0], "password_file": str(missing / "pw"),
                 "certfile": str(missing / "c.crt")}]
    for cfg in (dict(b.config, listener=listener, bridge=bridge,
                     limits={"max_conections": 5, "max_qos": 7, "messages_rate": "x"}),
                dict(b.config, listener=listener, bridge=bridge)):
        path = tmp_path / "c.toml"
        path.write_text(toml_dumps(cfg))
        r = run_cli("config", "check", "-c", str(path))
        said = [ln.split("config error: ", 1)[1].replace(str(path), str(b.config_path))
                for ln in r.stderr.splitlines() if "config error: " in ln]
        assert r.returncode == 2 and len(said) >= 3, r.stderr
        assert any("listener[0].password_file" in p for p in said), said
        assert any("listener[0].certfile" in p for p in said), said
        line = reload_refused(b, cfg)
        assert all(p in line for p in said), (said, line)
        assert line.count(f"{b.config_path}: ") == len(said), (said, line)


def test_serve_says_every_problem_config_check_says(tmp_path):
    missing = tmp_path / "missing"
    cfg = {"data_dir": str(tmp_path / "data"), "limits": {"max_qos": 7},
           "listener": [{"host": "127.0.0.1", "port": 0, "password_file": str(missing / "pw")}]}
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps(cfg))
    said = {}
    for command in ("config check", "serve"):
        r = run_cli(*command.split(), "-c", str(path), timeout=30)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        said[command] = [ln for ln in r.stderr.splitlines() if "config error: " in ln]
    assert said["serve"] == said["config check"] and len(said["serve"]) == 2, said
