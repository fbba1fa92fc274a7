"""Configuration: types, checks, error messages, and docs that list every key."""

import pathlib

import pytest

from edgebroker import config
from edgebroker.errors import ConfigError

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "config.md"


def test_defaults_listen_on_loopback_only():
    c = config.load(None)
    assert [(lc.host, lc.port) for lc in c.listeners] == [("127.0.0.1", 1883)]
    assert c.limits.max_inflight_messages == 20 and c.limits.max_queued_messages == 0


def test_state_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    assert config.Config().state_dir() == str(tmp_path / "edgebroker-data")
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/edgebroker:/other")
    assert config.Config().state_dir() == "/var/lib/edgebroker"
    assert config.Config(data_dir="/d").state_dir() == "/d"


def test_full_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('log_level = "debug"\nsys_interval = 2\n'
                    '[[listener]]\nhost = "::1"\nport = 0\n'
                    '[[listener]]\nport = 1884\n'
                    '[limits]\nconnect_timeout = 1\nqueue_qos0_messages = true\n')
    c = config.load(str(path))
    assert c.log_level == "debug" and c.sys_interval == 2.0
    assert [lc.address for lc in c.listeners] == ["[::1]:0", "127.0.0.1:1884"]
    assert c.limits.connect_timeout == 1.0 and c.limits.queue_qos0_messages is True


@pytest.mark.parametrize("text, message", [
    ("colour = 1", "colour: unknown setting"),
    ("[limits]\nmax_inflight_messages = 'many'", "limits.max_inflight_messages: expected an integer"),
    ("[limits]\nmax_inflight_messages = 0", "limits.max_inflight_messages: must be between 1 and 65535"),
    ("[limits]\nmax_queued_messages = -1", "limits.max_queued_messages: must be at least 0"),
    ("[limits]\nmax_lag_age = -1", "limits.max_lag_age: must be at least 0"),
    ("[limits]\nqueue_qos0_messages = 1", "limits.queue_qos0_messages: expected a boolean"),
    ("[limits]\nconnect_timeout = true", "limits.connect_timeout: expected a number"),
    ("[limits]\nbogus = 1", "limits.bogus: unknown setting"),
    ("log_level = 'loud'", "log_level: must be one of"),
    ("busy_poll_us = 20000", "busy_poll_us: must be between 0 and 10000"),
    ("max_conections = 5", "max_conections: unknown setting; did you mean "
                           "limits.max_connections? (a setting of the [limits] table)"),
    ("[limits]\ncafile = 'x'", "limits.cafile: unknown setting; did you mean listener.cafile?"),
    ("refusal_log_interval = 1e-9", "refusal_log_interval: must be 0 (off) or at least 1"),
    ("refusal_log_interval = -1", "refusal_log_interval: must be 0 (off) or at least 1"),
    ("[[listener]]\nport = 70000", "listener[0].port: must be between 0 and 65535"),
    ("[[listener]]\nport = 1\n[[listener]]\nport = 1", "listener[1]: 127.0.0.1:1 is listed twice"),
    ("[listener]\nport = 1", "listener: expected one or more [[listener]] tables"),
    ("limits = 3", "limits: expected a table"),
    ("[[listener]]\nprotocol = 'ws'", "listener[0].protocol: must be one of 'mqtt', 'websockets'"),
    ("[[listener]]\nwebsocket_path = '/ws'", 'listener[0].websocket_path: only with protocol = "websockets"'),
    ("[[listener]]\nprotocol = 'websockets'\nwebsocket_path = 'mqtt'",
     'listener[0].websocket_path: must be a URL path such as "/mqtt"'),
    ("[[listener]]\nprotocol = 'websockets'\nwebsocket_path = '/a b'", "listener[0].websocket_path"),
    ("[[listener]]\nprotocol = 'websockets'\nwebsocket_path = '/mqtt?x=1'", "no ? or #"),
    ("a = ", "not valid TOML"),
])
def test_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(str(path))
    assert str(info.value).startswith(str(path) + ": ")
    assert message in str(info.value)


def test_websocket_listeners(tmp_path):
    """protocol = "websockets" on TCP, with TLS (wss) and on a Unix socket; path default /mqtt."""
    path = tmp_path / "c.toml"
    path.write_text('[[listener]]\nport = 1883\n'
                    '[[listener]]\nport = 8080\nprotocol = "websockets"\n'
                    '[[listener]]\nport = 8443\nprotocol = "websockets"\nwebsocket_path = "/ws/v1"\n'
                    'certfile = "/etc/s.crt"\n'
                    '[[listener]]\nunix_socket = "/run/mqtt-ws.sock"\nprotocol = "websockets"\n')
    plain, ws, wss, unix = config.load(str(path)).listeners
    assert (plain.protocol, plain.websocket_path) == ("mqtt", "/mqtt")
    assert (ws.protocol, ws.websocket_path, ws.tls) == ("websockets", "/mqtt", False)
    assert (wss.protocol, wss.websocket_path, wss.tls) == ("websockets", "/ws/v1", True)
    assert (unix.protocol, unix.address) == ("websockets", "unix:/run/mqtt-ws.sock")


def test_missing_file():
    with pytest.raises(ConfigError, match="file not found"):
        config.load("/nonexistent/edgebroker.toml")


def test_a_byte_order_mark_is_skipped(tmp_path):
    """Windows editors start a UTF-8 file with EF BB BF: it gave "not valid TOML: Invalid
    statement (at line 1, column 1)", where nothing shows."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbflog_level = \"debug\"\n")
    assert config.load(str(path)).log_level == "debug"
    path.write_bytes(b"\xef\xbb\xbflog_level = \"debug\"\n# \xff\n")   # the byte counted in the file
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 25\)"):
        config.load(str(path))


@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:1883", "127.0.0.1", 1883), ("[::1]:0", "::1", 0), (":1884", "0.0.0.0", 1884),
])
def test_parse_address(text, host, port):
    lc = config.parse_address(text)
    assert (lc.host, lc.port) == (host, port)


@pytest.mark.parametrize("text", ["localhost", "h:x", "h:70000", ""])
def test_parse_address_errors(text):
    with pytest.raises(ConfigError, match="--listen"):
        config.parse_address(text)


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("0:0:0:0:0:0:0:1", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.2", False),
    ("128.0.0.1", False), ("::2", False), ("::ffff:127.0.0.1", False), ("gateway.lan", False),
    ("127.1", False), ("", False),
])
def test_listener_is_local_on_loopback_addresses_only(host, local):
    """Which listeners need allow_anonymous set explicitly when they have no authentication."""
    assert config.ListenerConfig(host=host).is_local() is local


# The docs/config.md section that lists the keys with each prefix.
DOC_SECTIONS = {"": "## Top level", "listener.": "## `[[listener]]`", "limits.": "## `[limits]`",
                "log.": "## `[log]`", "metrics.": "## `[metrics]`",
                "upload.": "## `[upload]`", "bridge.": "## `[[bridge]]`",
                "bridge.topic.": "## `[[bridge]]` topic rules"}


def _doc_section(docs: str, heading: str) -> str:
    start = docs.index(heading + "\n")
    end = docs.find("\n## ", start + len(heading))
    return docs[start:end if end != -1 else len(docs)]


def test_docs_list_every_key_with_its_default():
    docs = DOCS.read_text()
    for key, default, _ in config.describe():
        prefix, _, name = key.rpartition(".")
        section = _doc_section(docs, DOC_SECTIONS[prefix + "." if prefix else ""])
        rows = [line for line in section.splitlines() if line.startswith(f"| `{name}` |")]
        assert rows, f"docs/config.md does not list {key} in its section"
        if default is None:
            assert "| unset |" in rows[0], f"docs/config.md: {key} should show 'unset' as default"
            continue
        if isinstance(default, bool):
            shown = "true" if default else "false"
        elif isinstance(default, float) and default.is_integer():
            shown = int(default)
        elif isinstance(default, str):
            shown = f'"{default}"'
        else:
            shown = default
        assert f"`{shown}`" in rows[0], f"docs/config.md shows a wrong default for {key}"


@pytest.mark.parametrize("prefix, problem", [
    ("gw\0", "cannot contain U+0000 (MQTT-1.5.4-2)"),
    ("gw\x1b-", "cannot contain U+001B, a control character (MQTT-1.5.4)"),
    ("gw\x85", "cannot contain U+0085, a control character (MQTT-1.5.4)"),
    ("gw\ufdd0", "cannot contain U+FDD0, a non-character (MQTT-1.5.4)"),
    ("gw\uffff", "cannot contain U+FFFF, a non-character (MQTT-1.5.4)"),
])
def test_auto_id_prefix_is_text_a_client_id_can_hold(tmp_path, prefix, problem):
    """auto_id_prefix was not checked: with U+0000 config check said OK, and a client with an
    empty id was assigned an id holding it (MQTT-1.5.4-2), which the broker refuses when the
    client comes back with it."""
    from conftest import run_cli, toml_dumps
    path = tmp_path / "c.toml"
    path.write_text(toml_dumps({"data_dir": str(tmp_path / "d"), "auto_id_prefix": prefix}))
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"edgebroker: config error: {path}: auto_id_prefix: {problem}, "
                               f"got "), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert config.from_dict({"auto_id_prefix": "gw-é-\U0001fffd"}).auto_id_prefix == \
        "gw-é-\U0001fffd"
