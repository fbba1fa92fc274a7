"""[[bridge]] tables: what they read as, and errors that name the table and the key."""

import itertools
import socket

import pytest

from edgebroker import config
from edgebroker.bridge_config import filters_overlap
from edgebroker.errors import ConfigError
from edgebroker.mqtt.topics import topic_matches

GOOD = ('[[bridge]]\nname = "up"\naddress = "127.0.0.1:1883"\n'
        'topic = [{pattern = "sensors/#", direction = "both", qos = 2, remote_prefix = "gw1/"}]\n')


def test_a_bridge_table(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(GOOD + '[[bridge]]\nname = "second"\naddress = "[::1]:8883"\n'
                           'protocol_version = 5\ncafile = "/etc/ca.pem"\nwindow = 10\n'
                           'topic = [{pattern = "a/+/b"}]\n')
    first, second = config.load(str(path)).bridge
    assert (first.name, first.address, first.window, first.checkpoint_interval) == \
        ("up", "127.0.0.1:1883", 100, 1.0)
    rule, = first.topic
    assert (rule.direction, rule.qos, rule.local_filter, rule.remote_filter) == \
        ("both", 2, "sensors/#", "gw1/sensors/#")
    # Mosquitto's default: HOSTNAME.NAME, so identical gateways do not share one session.
    assert first.remote_client_id == f"{socket.gethostname()}.up"
    assert (second.protocol_version, second.cafile, second.topic[0].direction) == \
        (5, "/etc/ca.pem", "out")


@pytest.mark.parametrize("text, message", [
    ('[bridge]\nname = "x"', "bridge: expected one or more [[bridge]] tables"),
    ('[[bridge]]\nname = "x"\ntopic = [{pattern = "a"}]', "bridge[0].address: required"),
    ('[[bridge]]\naddress = "h:1"\ntopic = [{pattern = "a"}]', "bridge[0].name: required"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"', "bridge[0].topic: required"),
    ('[[bridge]]\nname = "a b"\naddress = "h:1"\ntopic = [{pattern = "a"}]',
     "bridge[0].name: must be 1 to 64 of the letters"),
    ('[[bridge]]\nname = "x"\naddress = "host"\ntopic = [{pattern = "a"}]',
     "bridge[0].address: expected HOST:PORT"),
    ('[[bridge]]\nname = "x"\naddress = "h:0"\ntopic = [{pattern = "a"}]',
     "bridge[0].address: expected HOST:PORT"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a/#/b"}]',
     "bridge[0].topic[0].pattern: '#' must be a whole level and the last one"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a", direction = "up"}]',
     "bridge[0].topic[0].direction: must be one of 'out', 'in', 'both'"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a", qos = 3}]',
     "bridge[0].topic[0].qos: must be between 0 and 2"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{direction = "in"}]',
     "bridge[0].topic[0].pattern: required"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a", remote_prefix = "+/"}]',
     "bridge[0].topic[0].remote_prefix: must not contain the wildcards"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "#", local_prefix = "dev"}]',
     "bridge[0].topic[0].local_prefix: 'dev' before the pattern '#' makes the filter 'dev#', "
     "where '#' must be a whole level and the last one (end the prefix with '/')"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "+/t", remote_prefix = "s"}]',
     "bridge[0].topic[0].remote_prefix: 's' before the pattern '+/t' makes the filter 's+/t', "
     "where '+' must be a whole level"),
    # What MQTT forbids in its strings, named before the bridge ever runs.
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "s\\u0000/#"}]',
     "bridge[0].topic[0].pattern: must not contain U+0000 (MQTT forbids it in its strings)"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "s/#", '
     'remote_prefix = "r\\u0000/"}]',
     "bridge[0].topic[0].remote_prefix: must not contain U+0000"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "s/#", '
     'local_prefix = "l\\u0000/"}]',
     "bridge[0].topic[0].local_prefix: must not contain U+0000"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "%s"}]' % ("p" * 65536),
     "bridge[0].topic[0].pattern: is 65536 bytes of UTF-8, over MQTT's 65535, got 'ppp"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "%s/#", remote_prefix = '
     '"%s/"}]' % ("p" * 40000, "r" * 40000),
     "bridge[0].topic[0].remote_prefix: '" + "r" * 60 + "'... before the pattern '" + "p" * 60
     + "'... makes the filter '" + "r" * 60 + "'..., which is 80003 bytes of UTF-8, over "
     "MQTT's 65535"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nclient_id = "%s"'
     % ("c" * 65536), "bridge[0].client_id: bridge 'x': is 65536 bytes of UTF-8, over MQTT's "
                      "65535"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\n'
     'client_id = "a\\u0000b"', "bridge[0].client_id: bridge 'x': must not contain U+0000"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nusername = "%s"'
     % ("u" * 70000), "bridge[0].username: bridge 'x': is 70000 bytes of UTF-8, over MQTT's "
                      "65535"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nusername = "u"\n'
     'password = "%s"' % ("\u00e9" * 40000),
     "bridge[0].password: bridge 'x': is 80000 bytes of UTF-8, over MQTT's 65535"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = "a/# out"',
     "bridge[0].topic: expected topic rules: a list of tables"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a", qoss = 1}]',
     "bridge[0].topic[0].qoss: unknown setting; did you mean bridge[0].topic[0].qos?"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nwindow = 0',
     "bridge[0].window: must be between 1 and 65535"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nkeepalive = 0',
     "bridge[0].keepalive: must be 1 to 65535 seconds: 0 (no keepalive) is refused for a "
     "bridge, whose link would then stay half-open for ever"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nprotocol_version = 3',
     "bridge[0].protocol_version: must be one of 4, 5"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nprotocol_version = 5\n'
     'try_private = true', "bridge[0].try_private: only for protocol_version 4 (MQTT 3.1.1): on "
                           "MQTT 5.0 the remote subscriptions have No Local"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\ncertfile = "c.pem"',
     "bridge[0].certfile: needs cafile"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\npassword = "p"',
     "bridge[0].password: needs username"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nreconnect_min = 5\n'
     'reconnect_max = 2', "bridge[0].reconnect_max: must be at least reconnect_min (5)"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\n'
     '[[bridge]]\nname = "x"\naddress = "h:2"\ntopic = [{pattern = "b"}]',
     "bridge[1].name: 'x' is used by another bridge"),
    ('[[bridge]]\nname = "x"\naddress = "h:1"\ntopic = [{pattern = "a"}]\nwindw = 5',
     "bridge[0].windw: unknown setting; did you mean bridge[0].window?"),
])
def test_errors_name_the_table_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(str(path))
    assert str(info.value).startswith(str(path) + ": ")
    assert message in str(info.value)


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
def test_a_bridge_without_topic_rules_is_refused(tmp_path, command):
    """`topic = []` was accepted (the docs require a rule): a bridge forwarding nothing."""
    from conftest import run_cli
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n'
                    f'[[bridge]]\nname = "up"\naddress = "127.0.0.1:1"\ntopic = []\n')
    r = run_cli(*command, "-c", str(path))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"edgebroker: config error: {path}: bridge[0].topic: bridge 'up' has no "
                        f"topic rule (at least one is required)\n")


def test_an_out_rule_on_sys_topics_is_warned_of(tmp_path, broker):
    """`{pattern = "$SYS/#", direction = "out"}` (Mosquitto users bridge the gateway's
    statistics out) forwarded nothing, silently: this broker's $SYS messages are not in the
    log the bridge reads. `config check` and the start say so; other rules are not named."""
    from conftest import run_cli
    rules = ('topic = [{pattern = "$SYS/#", direction = "out", remote_prefix = "gw/"},\n'
             '  {pattern = "broker/#", direction = "both", local_prefix = "$SYS/"},\n'
             '  {pattern = "$SYS/broker/uptime", direction = "in"},\n'
             '  {pattern = "#", direction = "out"}]\n')
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n'
                    f'[[bridge]]\nname = "up"\naddress = "127.0.0.1:1"\n{rules}')
    warning = ("bridge[0].topic[{}]: bridge 'up': the out rule's filter {} matches only $SYS "
               "topics, which this broker does not write to its log: the rule forwards nothing "
               "(docs/bridge.md)")
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["warning: " + warning.format(0, "'$SYS/#'"),
                                     "warning: " + warning.format(1, "'$SYS/broker/#'")]
    gw = broker(bridge=[{"name": "up", "address": "127.0.0.1:1", "topic": [
        {"pattern": "$SYS/#", "direction": "out"}, {"pattern": "a/#", "direction": "out"}]}])
    assert gw.wait_log(lambda ln: warning.format(0, "'$SYS/#'") in ln, 5)
    assert not any("topic[1]" in ln for ln in gw.logs)




@pytest.mark.parametrize("first, second, expected", [
    ("c/#", "c/x/#", True), ("c/x/#", "c/#", True), ("c/#", "d/#", False),
    ("c/+", "c/x", True), ("c/+", "c/x/y", False), ("c/+/y", "c/x/+", True),
    ("a", "a/#", True),               # the parent level "#" matches
    ("a", "a/+", False), ("a/b", "a/b", True), ("a/b", "a/c", False),
    ("#", "x", True), ("+", "+/#", True), ("a//b", "a/+/b", True), ("a//b", "a/b", False),
    ("#", "$SYS/x", False), ("+/x", "$SYS/x", False), ("$SYS/#", "$SYS/+", True),
    ("$SYS/#", "#", False), ("$SYS/x", "$SYS/x", True), ("a/$x", "a/+", True),
])
def test_filters_overlap_table(first, second, expected):
    assert filters_overlap(first, second) is expected
    assert filters_overlap(second, first) is expected


def test_filters_overlap_agrees_with_topic_matches():
    """Every pair of filters of up to 3 levels over a few literals: they overlap exactly when
    some topic name of up to 3 levels (over those literals and one other) matches both."""
    def levels(choices, n):
        return ["/".join(p) for k in range(1, n + 1)
                for p in itertools.product(choices, repeat=k)]

    filters = [f for f in levels(["a", "$x", "+", "#"], 3)
               if "#" not in f[:-1] and (f == "#" or "#" not in f or f.endswith("/#"))]
    topics = levels(["a", "$x", "z"], 3)
    matched = {f: {t for t in topics if topic_matches(f, t)} for f in filters}
    for first, second in itertools.product(filters, repeat=2):
        assert filters_overlap(first, second) is bool(matched[first] & matched[second]), \
            (first, second)


def test_overlapping_in_rules_on_5_are_warned_of(tmp_path, broker):
    """Two `in` rules whose remote filters overlap: on MQTT 5.0 the remote sends a message
    both match once per rule, and each copy is published (docs/bridge.md). `config check` and
    the start name the two rules; the same filter twice, `out` rules, disjoint filters and
    3.1.1 bridges are not named."""
    from conftest import run_cli
    rules = [{"pattern": "c/#", "direction": "in"}, {"pattern": "c/#", "direction": "in"},
             {"pattern": "x/#", "direction": "out"}, {"pattern": "d/#", "direction": "in"},
             {"pattern": "c/+/x", "direction": "both"}]

    def table(name, version):
        port = 1 if version == 5 else 2     # (two bridges to one remote: another warning)
        return (f'[[bridge]]\nname = "{name}"\naddress = "127.0.0.1:{port}"\n'
                f'protocol_version = {version}\ntopic = [' + ", ".join(
                    "{" + ", ".join(f'{k} = "{v}"' for k, v in r.items()) + "}"
                    for r in rules) + "]\n")
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n'
                    + table("up", 5) + table("old", 4))
    warning = ("bridge[0].topic[{}] and topic[4]: bridge 'up' (MQTT 5.0): the in rules' remote "
               "filters 'c/#' and 'c/+/x' overlap: the remote sends a message both match once "
               "per rule, and each copy is published here (duplicates, under the first rule's "
               "topic); rules that do not overlap avoid it (docs/bridge.md)")
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["warning: " + warning.format(0),
                                     "warning: " + warning.format(1)]
    gw = broker(bridge=[{"name": "up", "address": "127.0.0.1:1", "protocol_version": 5,
                         "topic": rules}])
    assert gw.wait_log(lambda ln: warning.format(1) in ln, 5)


def test_bridges_that_can_pass_a_message_round_are_warned_of(tmp_path, broker):
    """Two bridges to one remote whose rules cover the same topics both ways loop on any
    protocol_version (No Local and the bridge marker work per session), and two 3.1.1
    bridges with try_private = false and such rules loop through the remotes' echoes (bridge12):
    `config check` and the start say so; bridges with the marker to two remotes, or whose
    topics do not meet, are not named."""
    from conftest import run_cli

    def table(name, port, pattern="t/#", direction="both", **keys):
        more = "".join(f"{k} = {str(v).lower()}\n" for k, v in keys.items())
        return (f'[[bridge]]\nname = "{name}"\naddress = "Remote.example:{port}"\n{more}'
                f'topic = [{{pattern = "{pattern}", direction = "{direction}"}}]\n')
    def relay(name, port, x, y):
        """x/# one way and y/# the other, at a remote that never sends back what the bridge
        publishes there (no in rule takes it): no echo, no loop."""
        return (f'[[bridge]]\nname = "{name}"\naddress = "Remote.example:{port}"\n'
                f'try_private = false\ntopic = [{{pattern = "x/#", direction = "{x}"}}, '
                f'{{pattern = "y/#", direction = "{y}"}}]\n')
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n'
                    + table("a", 1) + table("b", 2)                        # marker: fine
                    + table("same", 1, protocol_version=5)                 # a's remote
                    + table("p", 3, try_private=False) + table("q", 4, try_private=False)
                    + table("r", 5, pattern="u/#", try_private=False)      # other topics
                    + relay("s", 6, "out", "in") + relay("t", 7, "in", "out"))  # no echo
    same = ("bridge[0] and bridge[2]: bridges 'a' and 'same' both connect to Remote.example:1: "
            "what one publishes there comes in through the other (No Local and the bridge "
            "marker work per session), and where their rules cover the same topics both ways "
            "a message goes round for ever, whatever the protocol_version; use one bridge per "
            "remote (docs/bridge.md, Loops)")
    private = ("bridge[3] and bridge[4]: bridges 'p' and 'q' are MQTT 3.1.1 bridges with "
               "try_private = false whose rules cover the same topics both ways: each remote "
               "sends its bridge back what that bridge published there, the other bridge "
               "forwards it, and a message goes round for ever; keep try_private = true (a "
               "Mosquitto or edgebroker remote) or use protocol_version = 5 (docs/bridge.md, "
               "Loops)")
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["warning: " + same, "warning: " + private]
    rules = [{"pattern": "t/#", "direction": "both"}]
    gw = broker(bridge=[{"name": "a", "address": "127.0.0.1:1", "topic": rules},
                        {"name": "b", "address": "127.0.0.1:1", "topic": rules}])
    assert gw.wait_log(lambda ln: "bridges 'a' and 'b' both connect to 127.0.0.1:1" in ln, 5)
