"""Numbers in the configuration file: `config check` and `serve` refuse nan, inf and integers
that do not fit in 64 bits for every key, and the [log] settings beyond their upper bounds,
with one line per key naming the file and the key (no traceback)."""

import pytest

from conftest import run_cli

from edgebroker import config

INT64_MAX = (1 << 63) - 1
RANGE = "(integers must fit in 64 bits: -9223372036854775808 to 9223372036854775807)"
ERROR = "edgebroker: config error: "


def problems(r) -> list[str]:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith(ERROR) for line in lines), r.stderr
    return [line[len(ERROR):] for line in lines]


def every_key_set_to(tmp_path, value_of) -> tuple[str, list[str]]:
    """A file setting each key whose default ``value_of`` maps to a value (not None); the keys."""
    tables: dict[str, list[str]] = {}
    keys = []
    for key, default, _ in config.describe():
        value = value_of(default)
        prefix, _, name = key.rpartition(".")
        if value is None or prefix == "bridge.topic":
            continue
        tables.setdefault(prefix, []).append(f"{name} = {value}")
        keys.append(key)
    text = [f'data_dir = "{tmp_path / "data"}"', *tables.pop("")]
    text += ["[[listener]]", *tables.pop("listener")]
    text += ["[[bridge]]", 'name = "up"', 'address = "127.0.0.1:1"',
             'topic = [{pattern = "a/#"}]', *tables.pop("bridge")]
    for section, lines in tables.items():
        text += [f"[{section}]", *lines]
    path = tmp_path / "numbers.toml"
    path.write_text("\n".join(text) + "\n")
    return str(path), keys


def assert_every_key_refused(tmp_path, of_kind, value: str, problem: str) -> list[str]:
    """``config check`` on a file setting every key whose default is ``of_kind`` to ``value``
    exits 2 with ``problem`` for each; the keys."""
    path, keys = every_key_set_to(tmp_path, lambda d: value if of_kind(d) else None)
    r = run_cli("config", "check", "-c", path)
    assert r.returncode == 2
    found = problems(r)
    for key in keys:
        want = f"{path}: {_index(key)}: {problem}"
        assert want in found, f"{want!r} not in {found}"
    return keys


def _index(key: str) -> str:
    """The name a problem gives ``key``: the tables of arrays are numbered."""
    for table in ("listener", "bridge"):
        if key.startswith(table + "."):
            return f"{table}[0]{key[len(table):]}"
    return key


@pytest.mark.parametrize("word", ["nan", "inf", "-inf"])
def test_every_float_key_refuses_a_value_that_is_not_finite(tmp_path, word):
    """nan passed every "at least" check (nan < 1 is false): topic_expiry = nan put a nan
    deadline in the timer heap and no timer fired again; messages_rate = inf closed every
    client with an OverflowError. Every float key, in every table, refuses them."""
    keys = assert_every_key_refused(tmp_path, lambda d: type(d) is float, word,
                                    f"expected a finite number, got {word}")
    assert "limits.topic_expiry" in keys and "bridge.reconnect_max" in keys


def test_every_integer_key_refuses_one_that_does_not_fit_in_64_bits(tmp_path):
    """[log] segment_ms = 2^63 was accepted, then every QoS 1 PUBLISH failed with an
    OverflowError in the C helper; [limits] max_connections = 2^64 too."""
    keys = assert_every_key_refused(tmp_path, lambda d: type(d) is int, str(1 << 63),
                                    f"out of range, got {1 << 63} {RANGE}")
    assert "log.segment_ms" in keys and "limits.max_connections" in keys


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
@pytest.mark.parametrize("text, problem", [
    ("[limits]\nconnect_timeout = " + "1" * 400,
     f"limits.connect_timeout: out of range, got 11111111... (400 digits) {RANGE}"),
    ("sys_interval = " + "9" * 320, f"sys_interval: out of range, got 99999999... (320 digits) "
                                    f"{RANGE}"),
    ("[limits]\ntopic_expiry = nan", "limits.topic_expiry: expected a finite number, got nan"),
    ("[limits]\nmessages_rate = inf", "limits.messages_rate: expected a finite number, got inf"),
    ("[log]\nsegment_ms = 9223372036854775807",
     "log.segment_ms: must be between 1000 and 31536000000, got 9223372036854775807"),
    ("[log]\nretention_ms = 3153600000001",
     "log.retention_ms: must be between 1000 and 3153600000000, got 3153600000001"),
    ("[log]\nretention_bytes = 1125899906842625",
     "log.retention_bytes: must be between 4096 and 1125899906842624, got 1125899906842625"),
    ("[limits]\nmax_connections = " + "1" * 5000, "not valid TOML: an integer of more than 4300 "
                                                  "digits"),
    # An idle broker published a $SYS report on every loop pass (a core at 100 %).
    ("sys_interval = 0.000001", "sys_interval: must be 0 (off) or at least 0.1, got 1e-06"),
    # 1/rate overflowed to inf: a throttled client was "not read for nan s".
    ("[limits]\ncontrol_rate = 1e-310\ncontrol_burst = 1",
     "limits.control_rate: must be 0 (no limit) or at least 0.001, got 1e-310"),
    ("[limits]\nmessages_rate = 0.0009",
     "limits.messages_rate: must be 0 (no limit) or at least 0.001, got 0.0009"),
    ("[limits]\nbytes_rate = 1e-5",
     "limits.bytes_rate: must be 0 (no limit) or at least 0.001, got 1e-05"),
    ("[limits]\nmax_connection_rate = 1e-300",
     "limits.max_connection_rate: must be 0 (no limit) or at least 0.001, got 1e-300"),
])
def test_config_check_and_serve_refuse_the_number_naming_the_key(tmp_path, command, text,
                                                                  problem):
    """A 400-digit connect_timeout was an OverflowError traceback in both; nan and inf were
    accepted and broke the running broker (serve would run here until the timeout)."""
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n{text}\n'
                    f'[[listener]]\nhost = "127.0.0.1"\nport = 0\n')
    r = run_cli(*command, "-c", str(path))
    assert r.returncode == 2
    assert problems(r) == [f"{path}: {problem}"]
    assert "listening on" not in r.stderr


def test_the_largest_values_in_range_are_accepted(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[limits]\nmax_lag_bytes = {INT64_MAX}\n'
                    f'memory_limit = {INT64_MAX}\ntopic_expiry = 1e300\n'
                    f'[log]\nsegment_ms = 31536000000\nretention_ms = 3153600000000\n'
                    f'retention_bytes = 1125899906842624\n')
    r = run_cli("config", "check", "-c", str(path))
    assert (r.returncode, r.stderr) == (0, "")


def test_the_smallest_rate_throttles_for_a_finite_time(broker):
    """control_rate at its smallest (one packet per 1000 s) with a burst of 1: a PINGREQ,
    answered, takes the one token and the client is not read for 1000 s, a number (it was
    nan with control_rate 1e-310)."""
    b = broker(sys_interval=1, limits={"control_rate": 0.001, "control_burst": 1})
    c = b.client("slow")
    mark = b.mark()
    assert c.ping() == []
    line = b.wait_log("over its control packet rate", timeout=10, start=mark)
    assert line and "(control_rate 0.001/s); not reading from it for 1000.000 s" in line, line


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
def test_a_secret_of_the_wrong_type_is_not_shown(tmp_path, command):
    """A bridge password or S3 secret written as a number (a PIN without quotes) went to the
    terminal, and to the broker's log at a reload, in 'expected a string, got 918273645'."""
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n'
                    f'[[listener]]\nhost = "127.0.0.1"\nport = 0\n'
                    f'[upload]\nurl = "s3://landing/p"\naccess_key_id = "AK"\n'
                    f'secret_access_key = 5647382910\n'
                    f'[[bridge]]\nname = "c"\naddress = "127.0.0.1:1883"\nusername = "u"\n'
                    f'password = 918273645\n'
                    f'topic = [{{pattern = "a/#", direction = "out", qos = 1}}]\n')
    r = run_cli(*command, "-c", str(path))
    assert r.returncode == 2
    assert "918273645" not in r.stderr and "5647382910" not in r.stderr
    secret = "expected a string, got int (the value is not shown: a secret)"
    assert {f"{path}: bridge[0].password: {secret}",
            f"{path}: upload.secret_access_key: {secret}"} <= set(problems(r))
