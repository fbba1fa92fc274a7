"""`config check` on a file where a [[listener]] or [[bridge]] table has a wrong key: the
whole table was dropped, so the files its correct keys name were never read, the tables after
it were named by the wrong index, and with no listener left the default one (127.0.0.1:1883,
not in the file) was checked and reported in its place. Now such a table keeps its index and
has its files read, and only the listeners without errors are checked and reported."""

from __future__ import annotations

import json

from conftest import run_cli


def _check(tmp_path, text: str) -> tuple[int, dict, list[str]]:
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "state"}"\n' + text)
    r = run_cli("config", "check", "-c", str(path), "--format", "json")
    report = json.loads(r.stdout)
    r2 = run_cli("config", "check", "-c", str(path))
    assert r2.returncode == r.returncode and "Traceback" not in r2.stderr, r2.stderr
    return r.returncode, report, [p.split(": ", 1)[1] for p in report["problems"]]


def test_a_listener_with_a_wrong_key_has_its_files_read_and_no_default_in_its_place(tmp_path):
    code, report, problems = _check(tmp_path, 'allow_anonymous = false\n[[listener]]\n'
                                              'port = 99999\npassword_file = "/nonexistent/pw"\n'
                                              'certfile = "/nonexistent/cert"\n')
    assert code == 2
    assert problems == ["listener[0].port: must be between 0 and 65535, got 99999",
                        "listener[0].certfile: /nonexistent/cert: file not found",
                        "listener[0].password_file: /nonexistent/pw: file not found"], problems
    assert report["listeners"] == []


def test_the_tables_after_one_with_errors_keep_their_index(tmp_path):
    code, report, problems = _check(
        tmp_path, '[[listener]]\nport = "x"\nacl_file = "/nonexistent/acl0"\n'
                  '[[listener]]\nport = 18830\nacl_file = "/nonexistent/acl1"\n'
                  '[[listener]]\nport = 18830\n')
    assert code == 2
    assert problems == ["listener[0].port: expected an integer, got 'x'",
                        "listener[2]: 127.0.0.1:18830 is listed twice (as listener[1])",
                        "listener[0].acl_file: /nonexistent/acl0: file not found",
                        "listener[1].acl_file: /nonexistent/acl1: file not found"], problems
    assert report["listeners"] == ["127.0.0.1:18830", "127.0.0.1:18830"]


def test_listener_not_a_list_reports_no_listener(tmp_path):
    code, report, problems = _check(tmp_path, "listener = 5\n")
    assert code == 2 and problems == ["listener: expected one or more [[listener]] tables"]
    assert report["listeners"] == []


def test_a_bridge_with_a_wrong_key_has_its_tls_files_read(tmp_path):
    code, _, problems = _check(
        tmp_path, '[[bridge]]\nname = "a"\naddress = "127.0.0.1:1"\nkeepalive = "x"\n'
                  'cafile = "/nonexistent/ca"\ntopic = [{pattern = "a/#"}]\n'
                  '[[bridge]]\nname = "b"\naddress = "127.0.0.1:1"\n'
                  'cafile = "/nonexistent/cb"\ntopic = [{pattern = "b/#"}]\n')
    assert code == 2
    assert problems[0] == "bridge[0].keepalive: expected an integer, got 'x'", problems
    assert any(p.startswith("bridge[0] (a): cannot use its TLS files (cafile "
                            "'/nonexistent/ca'") for p in problems), problems
    assert any(p.startswith("bridge[1] (b): cannot use its TLS files (cafile "
                            "'/nonexistent/cb'") for p in problems), problems


def test_a_bridge_with_a_wrong_key_does_not_hide_the_rules_between_keys_of_any_bridge(tmp_path):
    # (ops5: a key error in any [[bridge]] table skipped the checks between keys and tables
    # of every bridge: fixing it showed new errors)
    code, _, problems = _check(
        tmp_path, '[[bridge]]\nname = "a"\naddress = "h:1"\nkeepalive = 0\npassword = "x"\n'
                  'topic = [{pattern = "a/#", qos = 5}]\n'
                  '[[bridge]]\nname = "b"\naddress = "h:1"\npassword = "x"\ntopic = []\n'
                  '[[bridge]]\nname = "b"\naddress = "h:1"\ntopic = [{pattern = "b"}]\n'
                  'reconnect_min = 5\nreconnect_max = 2\n')
    assert code == 2
    assert problems[:2] == ["bridge[0].keepalive: must be 1 to 65535 seconds: 0 (no keepalive) "
                            "is refused for a bridge, whose link would then stay half-open for "
                            "ever after a silent network failure, got 0",
                            "bridge[0].topic[0].qos: must be between 0 and 2, got 5"], problems
    assert problems[2:] == ["bridge[0].password: needs username",
                            "bridge[1].topic: bridge 'b' has no topic rule (at least one is "
                            "required)",
                            "bridge[1].password: needs username",
                            "bridge[2].reconnect_max: must be at least reconnect_min (5), got 2",
                            "bridge[2].name: 'b' is used by another bridge"], problems


def test_a_refused_key_is_not_also_reported_by_the_rules_that_read_it(tmp_path):
    # A refused value stands at its default in the table checked: the rules that read it
    # would report what the file does not say (no username, no pattern, one name twice).
    code, _, problems = _check(
        tmp_path, '[[bridge]]\nname = "a b"\naddress = "h:1"\nusername = 5\npassword = "x"\n'
                  'reconnect_min = -1\nreconnect_max = 0.5\n'
                  'topic = [{pattern = "a/#/b"}, 7, {pattern = "c", local_prefix = "x+"}]\n'
                  '[[bridge]]\nname = "c d"\naddress = "h:1"\ntopic = "x"\n')
    assert code == 2
    assert [p.partition(":")[0] for p in problems] == [
        "bridge[0].name", "bridge[0].username", "bridge[0].reconnect_min",
        "bridge[0].topic[0].pattern", "bridge[0].topic[1]", "bridge[0].topic[2].local_prefix",
        "bridge[1].name", "bridge[1].topic"], problems


def test_two_bridges_without_a_name_are_not_also_said_to_share_one(tmp_path):
    code, _, problems = _check(tmp_path, '[[bridge]]\naddress = "h:1"\ntopic = [{pattern = "a"}]\n'
                                         '[[bridge]]\naddress = "h:2"\ntopic = [{pattern = "b"}]\n')
    assert code == 2
    assert problems == ["bridge[0].name: required", "bridge[1].name: required"], problems
