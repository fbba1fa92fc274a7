"""Access control lists in Mosquitto's ``acl_file`` format, compiled into topic tries.

The file, line by line (``#`` starts a comment line)::

    topic read $SYS/#              # before any "user" line: anonymous clients
    user alice                     # the lines below, up to the next "user", are alice's
    topic readwrite alice/#
    topic deny alice/secret
    pattern write devices/%c/#     # every client; %c = its client id, %u = its user name
    pattern read status/%u

``topic`` and ``pattern`` take an optional access word — ``read``,
``write``, ``readwrite`` (the default) or ``deny`` — then a topic filter.
``%c`` and ``%u`` work in ``pattern`` lines only and must fill a whole level.
A client whose id or user name contains ``/``, ``+`` or ``#`` never matches a
pattern level that uses it (no wildcard injection through a name); an
anonymous client never matches ``%u``.

Decisions, for a client with an ACL file in force:

- PUBLISH to topic T is allowed when a ``write``/``readwrite`` rule that
  applies to the client matches T and no ``deny`` rule matches T.
- A message on topic T is delivered when a ``read``/``readwrite`` rule
  matches T and no ``deny`` rule matches T (checked at delivery, retained
  messages included).
- SUBSCRIBE to filter F is granted when a ``read``/``readwrite`` rule
  *covers* F (matches every topic F can match: ``a/#`` covers ``a/+/b``,
  ``a/+`` does not cover ``a/#``) and no ``deny`` rule covers F. A deny rule
  that covers only part of F leaves the subscription granted; the messages it
  covers are then not delivered.
- Anything else is refused: with an ACL file, no rule means no access.

Rules are compiled into one trie for the anonymous section, one per user and
one for the patterns. A check walks at most the tries that apply to the
client (its user's or the anonymous one, and the patterns), one level of the
topic at a time, following only the branches that can match (the literal
level, ``+``, ``#``, ``%c``, ``%u``): its cost grows with the topic's depth,
not with the number of rules. Topic matching follows MQTT-4.7.2-1: a rule
starting with a wildcard does not match a topic starting with ``$``.
"""

from __future__ import annotations

import stat

from edgebroker.errors import ConfigError, ProtocolError
from edgebroker.files import config_file_stat, owner_problem
from edgebroker.mqtt.topics import sys_topic_level, validate_topic_filter

READ = 1
WRITE = 2
DENY = 4
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}

CLIENT_ID = "%c"
USERNAME = "%u"
_PLACEHOLDERS = (CLIENT_ID, USERNAME)
# Decisions cached per client view; dropped wholesale beyond this many topics.
CACHE_LIMIT = 4096
# Trimmed from a line's ends and between its words: ASCII blanks only, as Mosquitto does, so a
# user name or topic filter may end in another space (U+00A0), as the password file's names.
_BLANKS = " \t\r\f\v"


class LinesError(ValueError):
    """The bad lines of an ACL: ``problems``, one 'line N: ...' each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _no_control(number: int, value: str) -> None:
    """A user name or topic filter with a control character (a tab inside it: ``topic
    deny<TAB>secret/#`` read as a rule on a topic no client can use) is refused."""
    control = next((ch for ch in value if ch < " " or ch == "\x7f"), None)
    if control is not None:
        raise ValueError(f"line {number}: control character {control!r} in {value!r} (no user "
                         f"name or topic holds one; words are separated by spaces or tabs)")


def _first_word(text: str) -> tuple[str, str]:
    """``text``'s first word (up to a space or tab) and the rest, blanks around it trimmed."""
    for i, ch in enumerate(text):
        if ch in " \t":
            return text[:i], text[i:].strip(_BLANKS)
    return text, ""


class _Node:
    __slots__ = ("children", "bits")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.bits = 0           # access of the rules whose filter ends at this node


def _add(root: _Node, levels: list[str], bits: int) -> None:
    node = root
    for level in levels:
        child = node.children.get(level)
        if child is None:
            child = node.children[level] = _Node()
        node = child
    node.bits |= bits


def _collect(node: _Node, levels: list[str], i: int, dollar: bool, cid, user,
             patterns: bool = False) -> int:
    """OR of the access bits of every rule below ``node`` that covers ``levels[i:]``.

    ``levels`` is a topic name or a topic filter: a rule covers it when the rule
    matches every topic the filter can match (for a topic name: simply matches).
    ``patterns``: ``node`` is in the pattern rules, whose ``%c`` and ``%u`` levels stand for
    ``cid`` and ``user`` only (a topic level that is ``%c`` itself does not match them).
    """
    children = node.children
    if not children:
        return 0 if i < len(levels) else node.bits
    wild = not (dollar and i == 0)
    bits = 0
    if wild:
        rest = children.get("#")    # covers this level and everything below it
        if rest is not None:
            bits = rest.bits
    if i == len(levels):
        return bits | node.bits
    level = levels[i]
    if level == "#":
        return bits                 # only a '#' rule covers a '#' filter level
    if wild:
        plus = children.get("+")
        if plus is not None:
            bits |= _collect(plus, levels, i + 1, dollar, cid, user, patterns)
    if level == "+":
        return bits                 # a literal or %c/%u rule level covers one value only
    child = children.get(level) if not patterns or level not in _PLACEHOLDERS else None
    if child is not None:
        bits |= _collect(child, levels, i + 1, dollar, cid, user, patterns)
    if cid is not None and level == cid:
        child = children.get(CLIENT_ID)
        if child is not None:
            bits |= _collect(child, levels, i + 1, dollar, cid, user, patterns)
    if user is not None and level == user:
        child = children.get(USERNAME)
        if child is not None:
            bits |= _collect(child, levels, i + 1, dollar, cid, user, patterns)
    return bits


def _allowed(bits: int, want: int) -> bool:
    return bool(bits & want) and not bits & DENY


def _safe_name(name: str | None) -> str | None:
    """A client id or user name usable in a pattern level, or None: not one with a topic
    separator or wildcard, nor one starting with ``$`` (as the first level it would reach
    ``$SYS`` topics, which wildcards never do)."""
    if not name or name[0] == "$" or "/" in name or "+" in name or "#" in name:
        return None
    return name


# A client's own figures go under $SYS/broker/clients/<its id escaped as one level>/: in a
# topic or filter under it, %c and %u stand for the escaped client id and user name.
_SYS_CLIENTS = ["$SYS", "broker", "clients"]


def _sys_level(name: str | None) -> str | None:
    """``name`` as a pattern level under $SYS/broker/clients/: escaped as the broker writes a
    client id there (``sys_topic_level``: ids with '/', '+' or '#' fill one level, and
    'a%2Fb' is not 'a/b'); None as ``_safe_name``."""
    if not name or name[0] == "$":
        return None
    return sys_topic_level(name)


class Acl:
    """A compiled ACL file."""

    def __init__(self, path: str = ""):
        self.path = path
        self.anonymous = _Node()
        self.users: dict[str, _Node] = {}
        self.patterns = _Node()
        self.has_patterns = False
        self.rules = 0

    # ----- reading ------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str, key: str = "acl_file") -> "Acl":
        st = config_file_stat(path, key)    # (a FIFO would block the read, /dev/zero fill memory)
        mode = st.st_mode
        try:
            with open(path, encoding="utf-8-sig") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise ConfigError(f"{key}: {path}: file not found") from None
        except OSError as exc:
            raise ConfigError(f"{key}: {path}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{key}: {path}: not UTF-8 text") from None
        if mode & 0o022:
            raise ConfigError(f"{key}: {path}: permissions {stat.filemode(mode)} let other users "
                              f"change it; run: chmod go-w {path}")
        owner = owner_problem(path, st.st_uid)
        if owner:
            raise ConfigError(f"{key}: {path}: {owner}")
        try:
            return cls.parse(text, path)
        except LinesError as exc:
            from edgebroker.security.passwords import shown_problems
            raise ConfigError(*shown_problems([f"{key}: {path} {p}" for p in exc.problems],
                                              f"{key}: {path}")) from None

    @classmethod
    def parse(cls, text: str, path: str = "") -> "Acl":
        """Compile ACL text; bad lines raise LinesError (a ValueError: 'line N: ...' for
        each). Lines end at "\n"
        only, as the password file's and Mosquitto's do: a comment holding U+2028 (or another
        of the breaks str.splitlines knows) stays one comment, not a rule after it."""
        from edgebroker.security.passwords import lines_of
        acl = cls(path)
        section = acl.anonymous
        problems = []
        for number, raw in enumerate(lines_of(text), 1):
            line = raw.strip(_BLANKS)
            if line and not line.startswith("#"):
                try:
                    section = acl._rule(section, number, line)
                except ValueError as exc:
                    problems.append(str(exc))
        if problems:
            raise LinesError(problems)
        return acl

    def _rule(self, section: "_Node", number: int, line: str) -> "_Node":
        """Add the rule of line ``number`` (a user line starts a section); the section the
        next lines go to. A bad line raises ValueError('line N: ...')."""
        keyword, rest = _first_word(line)
        if keyword == "user":
            if not rest:
                raise ValueError(f"line {number}: 'user' needs a user name")
            _no_control(number, rest)
            section = self.users.get(rest)
            if section is None:
                section = self.users[rest] = _Node()
        elif keyword in ("topic", "pattern"):
            access, topic_filter = _first_word(rest)
            if access in _ACCESS:
                bits = _ACCESS[access]
            else:
                bits, topic_filter = READ | WRITE, rest
            if not topic_filter:
                raise ValueError(f"line {number}: '{keyword}' needs a topic filter")
            _no_control(number, topic_filter)
            try:
                validate_topic_filter(topic_filter)
            except ProtocolError as exc:
                raise ValueError(f"line {number}: {exc}") from None
            levels = topic_filter.split("/")
            if keyword == "pattern":
                for level in levels:
                    if ("%c" in level or "%u" in level) and level not in (CLIENT_ID, USERNAME):
                        raise ValueError(f"line {number}: %c and %u must fill a whole level "
                                         f"(as in devices/%c/#), got {topic_filter!r}")
                _add(self.patterns, levels, bits)
                self.has_patterns = True
            else:
                _add(section, levels, bits)
            self.rules += 1
        else:
            raise ValueError(f"line {number}: unknown keyword {keyword!r} "
                             "(expected topic, pattern or user)")
        return section

    # ----- checks -------------------------------------------------------------------------

    def access(self, levels: list[str], client_id: str | None, username: str | None) -> int:
        """Access bits (READ, WRITE, DENY) the rules give this client on a topic or filter."""
        dollar = levels[0][:1] == "$"
        tree = self.anonymous if username is None else self.users.get(username)
        bits = _collect(tree, levels, 0, dollar, None, None) if tree is not None else 0
        if self.has_patterns:
            name = _sys_level if dollar and levels[1:3] == _SYS_CLIENTS[1:] and \
                levels[0] == "$SYS" else _safe_name
            bits |= _collect(self.patterns, levels, 0, dollar, name(client_id), name(username),
                             True)
        return bits

    def view(self, client_id: str, username: str | None, listener: str = "") -> "AclView":
        return AclView(self, client_id, username, listener)


class AclView:
    """One client's view of the ACL, with its read and write decisions cached per topic.
    ``listener``: the address of the listener it came in on (a reload rebinds the view to
    that listener's ACL)."""

    __slots__ = ("acl", "client_id", "username", "listener", "reads", "writes")

    def __init__(self, acl: Acl, client_id: str, username: str | None, listener: str = ""):
        self.acl = acl
        self.client_id = client_id
        self.username = username
        self.listener = listener
        self.reads: dict[str, bool] = {}
        self.writes: dict[str, bool] = {}

    def rebind(self, acl: Acl) -> None:
        """The ACL file was re-read: use the new rules, forget cached decisions."""
        self.acl = acl
        self.reads.clear()
        self.writes.clear()

    def check_read(self, topic: str) -> bool:
        ok = _allowed(self.acl.access(topic.split("/"), self.client_id, self.username), READ)
        reads = self.reads
        if len(reads) >= CACHE_LIMIT:
            reads.clear()
        reads[topic] = ok
        return ok

    def can_read(self, topic: str) -> bool:
        ok = self.reads.get(topic)
        return self.check_read(topic) if ok is None else ok

    def can_write(self, topic: str) -> bool:
        writes = self.writes
        ok = writes.get(topic)
        if ok is None:
            ok = _allowed(self.acl.access(topic.split("/"), self.client_id, self.username), WRITE)
            if len(writes) >= CACHE_LIMIT:
                writes.clear()
            writes[topic] = ok
        return ok

    def can_subscribe(self, topic_filter: str) -> bool:
        return _allowed(self.acl.access(topic_filter.split("/"), self.client_id, self.username),
                        READ)
