"""ACL files: parsing, every rule type, %c/%u patterns, subscription coverage, and the compiled
matcher against a brute-force evaluation of the rules."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgebroker.errors import ConfigError
from edgebroker.mqtt.topics import topic_matches
from edgebroker.security.acl import Acl

ACL_TEXT = """
# anonymous clients
topic read public/#
topic write public/anon-in

user alice
topic readwrite alice/#
topic deny alice/secret/#
topic read shared/+/status
topic write shared/alice
topic alice-default

user bob with spaces
topic read bob/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox
pattern deny devices/%c/locked
"""


@pytest.fixture(scope="module")
def acl():
    return Acl.parse(ACL_TEXT)


def can(acl, what, topic, client_id="c1", username=None):
    view = acl.view(client_id, username)
    return {"read": view.can_read, "write": view.can_write, "sub": view.can_subscribe}[what](topic)


@pytest.mark.parametrize("what, topic, client_id, username, expected", [
    # anonymous section: only for clients without a (verified) user name
    ("read", "public/news", "c1", None, True),
    ("write", "public/news", "c1", None, False),
    ("write", "public/anon-in", "c1", None, True),
    ("read", "public/news", "c1", "alice", False),      # alice's section does not include it
    ("read", "alice/x", "c1", None, False),
    # readwrite, deny wins, read-only, write-only, no access word = readwrite
    ("read", "alice/x", "c1", "alice", True),
    ("write", "alice/x/y", "c1", "alice", True),
    ("read", "alice", "c1", "alice", True),             # alice/# matches its parent
    ("read", "alice/secret/k", "c1", "alice", False),
    ("write", "alice/secret", "c1", "alice", False),
    ("read", "shared/room1/status", "c1", "alice", True),
    ("write", "shared/room1/status", "c1", "alice", False),
    ("read", "shared/room1/status/x", "c1", "alice", False),
    ("write", "shared/alice", "c1", "alice", True),
    ("read", "shared/alice", "c1", "alice", False),
    ("read", "alice-default", "c1", "alice", True),
    ("write", "alice-default", "c1", "alice", True),
    # another user's section does not apply; a user name with spaces works
    ("read", "alice/x", "c1", "bob", False),
    ("read", "bob/x", "c1", "bob with spaces", True),
    ("write", "bob/x", "c1", "bob with spaces", False),
    ("read", "bob/x", "c1", "unknown-user", False),
    # patterns: %c and %u, for every client, anonymous ones too (but %u needs a user)
    ("write", "devices/c1/temp", "c1", None, True),
    ("read", "devices/c1", "c1", "alice", True),
    ("write", "devices/c2/temp", "c1", "alice", False),
    ("write", "devices/c1/locked", "c1", "alice", False),  # pattern deny
    ("read", "users/alice/inbox", "c1", "alice", True),
    ("read", "users/bob/inbox", "c1", "alice", False),
    ("write", "users/alice/inbox", "c1", "alice", False),
    ("read", "users/None/inbox", "c1", None, False),
    # names that would smuggle wildcards or extra levels into a pattern never match
    ("write", "devices/a/b/t", "a/b", None, False),
    ("write", "devices/+/t", "+", None, False),
])
def test_rules(acl, what, topic, client_id, username, expected):
    assert can(acl, what, topic, client_id, username) is expected


@pytest.mark.parametrize("rules, topic_filter, expected", [
    ("topic read a/#", "a/#", True),
    ("topic read a/#", "a/+/b", True),
    ("topic read a/#", "a", True),
    ("topic read a/#", "a/b/c", True),
    ("topic read a/#", "#", False),
    ("topic read a/#", "+/b", False),
    ("topic read a/+", "a/b", True),
    ("topic read a/+", "a/+", True),
    ("topic read a/+", "a/#", False),
    ("topic read a/+", "a/b/c", False),
    ("topic read a/b", "a/+", False),
    ("topic read #", "#", True),
    ("topic read #", "+/+", True),
    ("topic read #", "$SYS/#", False),                 # MQTT-4.7.2-1
    ("topic read $SYS/#", "$SYS/broker/+", True),
    ("topic read +/x", "$SYS/x", False),
    ("topic read a/#\ntopic deny a/secret", "a/#", True),     # partial deny: granted, filtered later
    ("topic read a/#\ntopic deny a/secret", "a/secret", False),
    ("topic read a/#\ntopic deny a/+", "a/b", False),
    ("topic read a/#\ntopic deny a/#", "a/+/c", False),
    ("topic write a/#", "a/b", False),                 # write access does not allow subscribing
    ("pattern read d/%c/#", "d/c1/#", True),
    ("pattern read d/%c/#", "d/+/#", False),
    ("pattern read d/%c/#", "d/c2/x", False),
])
def test_subscription_coverage(rules, topic_filter, expected):
    acl = Acl.parse("user u\n" + rules)
    assert acl.view("c1", "u").can_subscribe(topic_filter) is expected


@pytest.mark.parametrize("text, words", [
    ("topic", "line 1: 'topic' needs a topic filter"),
    ("user", "line 1: 'user' needs a user name"),
    ("\n\ntopic read", "line 3: 'topic' needs a topic filter"),
    ("topic read a/#/b", "line 1: topic filter 'a/#/b'"),
    ("topic a+/b", "line 1: topic filter 'a+/b'"),
    ("pattern read d/x%c", "line 1: %c and %u must fill a whole level"),
    ("allow a/b", "line 1: unknown keyword 'allow'"),
    ("topic deny secret/\x01#", "line 1: control character '\\x01' in 'secret/\\x01#'"),
    ("user al\x7fice", "line 1: control character '\\x7f' in 'al\\x7fice'"),
])
def test_parse_errors(text, words):
    with pytest.raises(ValueError) as info:
        Acl.parse(text)
    assert words in str(info.value)


def test_load_errors_name_file_and_line(tmp_path):
    path = tmp_path / "acl"
    path.write_text("topic read a\nbogus\n")
    with pytest.raises(ConfigError, match=rf"acl_file: {path} line 2: unknown keyword 'bogus'"):
        Acl.load(str(path))
    path.write_text("topic read a\n")
    path.chmod(0o666)
    with pytest.raises(ConfigError, match="let other users change it"):
        Acl.load(str(path))
    path.chmod(0o644)
    assert Acl.load(str(path)).rules == 1
    with pytest.raises(ConfigError, match="file not found"):
        Acl.load(str(tmp_path / "missing"))


@pytest.mark.parametrize("brk", ["\u2028", "\u0085", "\v", "\x1c"])
def test_a_comment_holding_a_line_break_other_than_newline_stays_a_comment(brk):
    """str.splitlines also ends lines at U+2028, U+0085, \\v, \\x1c..\\x1e: a comment
    "# was:<U+2028>topic readwrite #" granted that rule to everyone (Mosquitto, and the
    password file, read it as one comment)."""
    acl = Acl.parse(f"topic read public/#\n# was:{brk}topic readwrite #\n")
    assert acl.rules == 1


def test_view_cache_follows_rebind():
    view = Acl.parse("topic read a").view("c", None)
    assert view.can_read("a") and "a" in view.reads
    view.rebind(Acl.parse("topic read b"))
    assert not view.can_read("a") and view.can_read("b")


def test_a_topic_level_that_is_a_placeholder_is_only_text():
    """A topic level "%c" or "%u" is not the client's id or user name: pattern rules do not
    match it for other clients, nor for anonymous ones."""
    acl = Acl.parse("pattern readwrite devices/%c/#\npattern read config/%u/#")
    assert acl.view("dev1", None).can_write("devices/dev1/x")
    assert not acl.view("attacker", None).can_write("devices/%c/x")
    assert not acl.view("attacker", None).can_subscribe("config/%u/#")
    assert not acl.view("attacker", "bob").can_read("config/%u/x")
    assert acl.view("%c", None).can_write("devices/%c/x")      # its own id, odd as it is


def test_names_starting_with_dollar_never_fill_a_pattern():
    """A client id or user name "$SYS" would make `%c/#` a rule for $SYS topics."""
    acl = Acl.parse("pattern readwrite %c/#\npattern read %u/#\npattern readwrite d/%c/#")
    assert acl.view("dev1", "u").can_read("dev1/x")
    assert not acl.view("$SYS", None).can_read("$SYS/broker/uptime")
    assert not acl.view("c", "$SYS").can_read("$SYS/broker/uptime")
    assert not acl.view("$x", None).can_write("d/$x/y")


def test_many_users_compile_into_separate_trees():
    """Rules of other users are never walked: 20,000 users, each with their own rules."""
    text = "\n".join(f"user u{i}\ntopic readwrite u{i}/#\ntopic deny u{i}/x" for i in range(20000))
    acl = Acl.parse(text)
    assert acl.rules == 40000 and len(acl.users) == 20000
    assert len(acl.users["u7"].children) == 1
    view = acl.view("c", "u7")
    assert view.can_write("u7/a") and not view.can_write("u7/x") and not view.can_write("u8/a")


# ---------------------------------------------------------------------------------------------
# The compiled matcher against a brute-force evaluation of every rule
# ---------------------------------------------------------------------------------------------

LEVELS = ["a", "b", "", "$s", "%c", "%u"]     # "%c" in a topic is just text
RULE_LEVELS = ["a", "b", "", "+", "%c", "%u"]
ACCESS = ["read", "write", "readwrite", "deny", ""]
BITS = {"read": 1, "write": 2, "readwrite": 3, "deny": 4, "": 3}

rule_filter = st.builds(
    lambda levels, hash_: "/".join(levels + (["#"] if hash_ else [])),
    st.lists(st.sampled_from(RULE_LEVELS), min_size=0, max_size=3), st.booleans(),
).filter(bool)
rule = st.tuples(st.sampled_from(["topic", "pattern"]), st.sampled_from([None, "u1", "u2"]),
                 st.sampled_from(ACCESS), rule_filter)
topic_name = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join)
names = st.sampled_from([None, "a", "b", "x/y", "+", "#", "", "$s", "%c"])


def _text(rules) -> str:
    anonymous = [r for r in rules if r[1] is None or r[0] == "pattern"]
    lines = [f"{kind} {access} {flt}".replace("  ", " ") for kind, _, access, flt in anonymous]
    for user in ("u1", "u2"):
        lines.append(f"user {user}")
        lines += [f"topic {access} {flt}".replace("  ", " ")
                  for kind, u, access, flt in rules if kind == "topic" and u == user]
    return "\n".join(lines)


def _safe(name):
    return name if name and name[0] != "$" and not any(ch in name for ch in "/+#") else None


def _reference(rules, topic, client_id, username) -> int:
    bits = 0
    for kind, user, access, flt in rules:
        levels = flt.split("/")
        if kind == "topic":
            if user != username:
                continue
        else:
            values = {"%c": _safe(client_id), "%u": _safe(username)}
            if any(values.get(level, "") is None for level in levels):
                continue
            levels = [values.get(level, level) for level in levels]
        if topic_matches("/".join(levels), topic):
            bits |= BITS[access]
    return bits


@settings(max_examples=400, deadline=None)
@given(st.lists(rule, max_size=8), topic_name, names, names)
def test_matcher_equals_brute_force(rules, topic, client_id, username):
    # Filters with %c/%u are literal text in "topic" lines, and are skipped for simplicity.
    rules = [r for r in rules if r[0] == "pattern" or "%" not in r[3]]
    acl = Acl.parse(_text(rules))
    view = acl.view(client_id, username)
    bits = _reference(rules, topic, client_id, username)
    assert view.can_read(topic) == bool(bits & 1 and not bits & 4)
    assert view.can_write(topic) == bool(bits & 2 and not bits & 4)
    # A topic name is a filter that covers exactly itself.
    assert view.can_subscribe(topic) == view.can_read(topic)


def test_words_may_be_separated_by_tabs():
    """``topic deny<TAB>secret/#`` was one rule on the topic "deny<TAB>secret/#", read-write,
    which no client can use: the deny was lost without a word."""
    acl = Acl.parse("user alice\ntopic\treadwrite\talice/#\ntopic deny\talice/secret\n")
    view = acl.view("c1", "alice")
    assert view.can_write("alice/open") and not view.can_write("alice/secret")


def test_a_name_or_topic_may_end_in_a_space_other_than_ascii():
    """Lines were trimmed of every Unicode space: the rules of ``user admin<U+00A0>`` went to
    the account ``admin`` (another user, given ``#``), and ``topic deny alice/x<U+00A0>`` no
    longer covered that topic. Only ASCII blanks are trimmed, as Mosquitto does; the password
    file keeps such names too."""
    acl = Acl.parse("user admin\u00a0\ntopic readwrite #\n"
                    "user alice\ntopic readwrite alice/#\ntopic deny alice/x\u00a0\n")
    assert not acl.view("c1", "admin").can_subscribe("alice/#")
    assert acl.view("c1", "admin\u00a0").can_subscribe("alice/#")
    assert not acl.view("c2", "alice").can_write("alice/x\u00a0")
    assert acl.view("c2", "alice").can_write("alice/x")
