"""Password hashes and the password file (``username:hash`` per line, or
``username:hash:scram`` with the user's SCRAM-SHA-256 keys: ``security/scram.py``).

Two hash formats are understood, both with a per-user random salt:

``$scrypt$v=1$ln=14,r=8,p=1$SALT$HASH``
    edgebroker's own, written by ``edgebroker passwd``: ``hashlib.scrypt``
    with N = 2**ln, block size r and parallelism p; SALT (16 bytes) and HASH
    (32 bytes) in base64 without padding (the PHC string format). ``v`` is the
    format version: a later change of layout gets a new number, and files
    with older versions keep working.
``$7$ITERATIONS$SALT$HASH``
    Mosquitto's PBKDF2-SHA512 format (``mosquitto_passwd``), base64 with
    padding, so a Mosquitto password file can be used as it is. Fewer than
    ``PBKDF2_WEAK`` iterations (Mosquitto writes 101) is accepted with a
    warning naming the users to re-set.

Comparison is constant time (``hmac.compare_digest``). Plain-text passwords
are never accepted in a password file; ``edgebroker passwd -U`` converts a
file of plain ``user:password`` lines.

The third field, when present, holds the keys SCRAM-SHA-256 needs (a hash of
either format cannot give them): ``edgebroker passwd`` writes it. Mosquitto
reads a line's first two fields only, so a ``--hash pbkdf2`` file with it still
loads there; users without it log in with their password alone.
"""

from __future__ import annotations

import binascii
import os
import stat

from edgebroker.errors import ConfigError
from edgebroker.files import config_file_stat, owner_problem
TYPE_CHECKING = False
if TYPE_CHECKING:   # security.scram: imported by a file with SCRAM keys (load)
    from edgebroker.security import scram

SCRYPT_PREFIX = "$scrypt$"
PBKDF2_PREFIX = "$7$"
SCRYPT_VERSION = 1
# N = 2**14, r = 8: 16 MiB of memory and about 50 ms on a desktop core per check
# (a few hundred ms on a Raspberry Pi): slow for an attacker with a stolen file.
SCRYPT_LN = 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
PBKDF2_ITERATIONS = 210_000     # OWASP's figure for PBKDF2-HMAC-SHA512
PBKDF2_WEAK = 10_000
# Bounds on the parameters read from a file, so a damaged line cannot ask for
# gigabytes of memory or hours of work. One scrypt check needs 128 * r * 2**ln bytes (and
# 128 * r * p more, at most 64 KiB here): at most SCRYPT_MAX_MEMORY, which a gateway can
# spare per worker thread (the default, ln=14 r=8, takes 16 MiB; with r=8, ln=18 is the most).
SCRYPT_MAX_MEMORY = 256 << 20
_MAX_R = 32
_MAX_P = 16
_MAX_ITERATIONS = 10_000_000


class HashError(ValueError):
    """A stored hash is not in a format this module understands."""


# Base64 through binascii: the base64 module is a layer over it that the broker would keep
# imported (memory) for two functions.
def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _b64_nopad(data: bytes) -> str:
    return _b64(data).rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raise HashError("bad base64") from None


def hash_password(password: str | bytes, scheme: str = "scrypt") -> str:
    """A new salted hash of ``password`` in the given scheme (``scrypt`` or ``pbkdf2``)."""
    pw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
    if scheme == "scrypt":
        salt = os.urandom(SALT_BYTES)
        digest = _scrypt(pw, salt, SCRYPT_LN, SCRYPT_R, SCRYPT_P, HASH_BYTES)
        return (f"{SCRYPT_PREFIX}v={SCRYPT_VERSION}$ln={SCRYPT_LN},r={SCRYPT_R},p={SCRYPT_P}"
                f"${_b64_nopad(salt)}${_b64_nopad(digest)}")
    if scheme == "pbkdf2":
        import hashlib
        salt = os.urandom(12)
        digest = hashlib.pbkdf2_hmac("sha512", pw, salt, PBKDF2_ITERATIONS, 64)
        return f"{PBKDF2_PREFIX}{PBKDF2_ITERATIONS}${_b64(salt)}${_b64(digest)}"
    raise ValueError(f"unknown hash scheme {scheme!r}")


def _maxmem(ln: int, r: int, p: int) -> int:
    """The ``maxmem`` given to hashlib.scrypt: what OpenSSL allocates, and 1 MiB to spare."""
    return 128 * r * ((1 << ln) + p + 2) + (1 << 20)


def _scrypt(pw: bytes, salt: bytes, ln: int, r: int, p: int, dklen: int) -> bytes:
    import hashlib
    return hashlib.scrypt(pw, salt=salt, n=1 << ln, r=r, p=p, maxmem=_maxmem(ln, r, p),
                          dklen=dklen)


_INT_MAX = (1 << 31) - 1
_UINT32_MAX = (1 << 32) - 1
_UINT64_MAX = (1 << 64) - 1


def scrypt_refusal(ln: int, r: int, p: int, dklen: int) -> str | None:
    """Why hashlib.scrypt would refuse these parameters (so every check of the hash would
    fail, the right password's too), or None. The conditions CPython's hashlib and OpenSSL's
    scrypt check before they compute anything, as arithmetic: no trial run at load."""
    if not 1 <= ln <= 63:                           # N >= 2, a power of 2, in a uint64
        return "ln must be 1 to 63"
    n = 1 << ln
    if not (1 <= r <= _UINT32_MAX and 1 <= p <= _UINT32_MAX):
        return "r and p must be 1 to 2**32 - 1"
    if not 1 <= dklen <= _INT_MAX:
        return f"the hash is {dklen} bytes; hashlib.scrypt makes 1 to {_INT_MAX}"
    if p * r > (1 << 30) - 1:
        return f"p * r is {p * r}; scrypt allows at most 2**30 - 1"
    if 16 * r <= 63 and n >= 1 << (16 * r):
        return (f"scrypt needs N = 2**ln below 2**(16 * r): with r={r}, ln must be at most "
                f"{16 * r - 1}")
    blen = 128 * r * p
    if blen > _INT_MAX:
        return f"128 * r * p is {blen} bytes; scrypt allows at most {_INT_MAX}"
    if n + 2 > (_UINT64_MAX // 128) // r:
        return "128 * r * (2**ln + 2) does not fit in 64 bits"
    vlen = 128 * r * (n + 2)
    maxmem = _maxmem(ln, r, p)
    if maxmem > _INT_MAX:
        return (f"it needs {_mib(blen + vlen)} of memory; hashlib.scrypt can be allowed "
                f"at most {_mib(_INT_MAX)}")
    if blen + vlen > maxmem:        # cannot happen with _maxmem; kept as OpenSSL checks it
        return f"it needs {_mib(blen + vlen)} of memory, more than {_mib(maxmem)}"
    return None


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _number(text: str) -> int | None:
    """``text`` read as a number written in the digits 0-9, None if it is not one. Past 18
    digits (int() refuses more than 4300) it is 10**18, beyond every range it is checked
    against."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18


def _most_common(values):
    """The value met most often (the first met of those tied), None when there is none."""
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None


def parse_hash(stored: str) -> tuple:
    """Check a stored hash's format; returns a tuple the verifier uses. Raises HashError."""
    if stored.startswith(SCRYPT_PREFIX):
        parts = stored.split("$")
        # ['', 'scrypt', 'v=1', 'ln=14,r=8,p=1', SALT, HASH]
        if len(parts) != 6 or parts[2] != f"v={SCRYPT_VERSION}":
            raise HashError("scrypt hash: expected $scrypt$v=1$ln=N,r=N,p=N$SALT$HASH")
        params = {}
        for item in parts[3].split(","):
            key, _, value = item.partition("=")
            number = _number(value)
            if number is None:
                raise HashError(f"scrypt hash: bad parameter {item!r}")
            params[key] = number
        if set(params) != {"ln", "r", "p"}:
            raise HashError("scrypt hash: parameters must be ln, r and p")
        ln, r, p = params["ln"], params["r"], params["p"]
        if not (1 <= ln <= 63 and 1 <= r <= _MAX_R and 1 <= p <= _MAX_P):
            raise HashError(f"scrypt hash: parameters out of range (ln 1 to 63, r 1 to {_MAX_R}, "
                            f"p 1 to {_MAX_P})")
        memory = 128 * r << ln
        if memory > SCRYPT_MAX_MEMORY:
            raise HashError(f"scrypt hash: ln={ln}, r={r} needs {_mib(memory)} of memory per "
                            f"check, more than the {_mib(SCRYPT_MAX_MEMORY)} allowed "
                            f"(128 * r * 2**ln; the default ln={SCRYPT_LN}, r={SCRYPT_R} "
                            f"needs {_mib(128 * SCRYPT_R << SCRYPT_LN)})")
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
        if not salt or len(digest) < 16:
            raise HashError("scrypt hash: salt or hash too short")
        refusal = scrypt_refusal(ln, r, p, len(digest))
        if refusal:
            raise HashError(f"scrypt hash: ln={ln}, r={r}, p={p} cannot be checked ({refusal}): "
                            f"no password, the right one included, would match")
        return ("scrypt", ln, r, p, salt, digest)
    if stored.startswith(PBKDF2_PREFIX):
        parts = stored.split("$")
        # ['', '7', ITERATIONS, SALT, HASH]
        iterations = _number(parts[2]) if len(parts) == 5 else None
        if iterations is None:
            raise HashError("PBKDF2 hash: expected $7$ITERATIONS$SALT$HASH")
        if not 1 <= iterations <= _MAX_ITERATIONS:
            raise HashError("PBKDF2 hash: iterations out of range")
        salt, digest = _unb64(parts[3]), _unb64(parts[4])
        if not salt or len(digest) < 16:
            raise HashError("PBKDF2 hash: salt or hash too short")
        return ("pbkdf2", iterations, salt, digest)
    if stored.startswith("$"):
        raise HashError("unknown hash format")
    raise HashError("not a hash (a plain-text password?)")


def verify_password(stored: str | tuple, password: bytes | str) -> bool:
    """True if ``password`` matches ``stored`` (a hash string or ``parse_hash`` result)."""
    # hashlib and hmac are imported where used: they load OpenSSL (about 4 MiB of memory),
    # which a broker without a password file does without (docs/deploy.md, idle RSS).
    import hashlib
    import hmac
    parsed = parse_hash(stored) if isinstance(stored, str) else stored
    pw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
    if parsed[0] == "scrypt":
        _, ln, r, p, salt, digest = parsed
        computed = _scrypt(pw, salt, ln, r, p, len(digest))
    else:
        _, iterations, salt, digest = parsed
        computed = hashlib.pbkdf2_hmac("sha512", pw, salt, iterations, len(digest))
    return hmac.compare_digest(computed, digest)


_dummy: tuple | None = None


def dummy_hash() -> tuple:
    """A parsed hash to check unknown users against, so they cost as much as known ones: the
    default scrypt parameters with a random salt and digest (that no password matches).
    Making it computes no hash: it is made on the loop thread (``PasswordFile.dummy``)."""
    global _dummy
    if _dummy is None:
        _dummy = ("scrypt", SCRYPT_LN, SCRYPT_R, SCRYPT_P, os.urandom(SALT_BYTES),
                  os.urandom(HASH_BYTES))
    return _dummy


def is_weak(parsed: tuple) -> bool:
    return parsed[0] == "pbkdf2" and parsed[1] < PBKDF2_WEAK


# --------------------------------------------------------------------------- the file

def _breaks_lines(ch: str) -> bool:
    """Whether ``ch`` is a control character (Unicode category Cc: U+0000..U+001F,
    U+007F..U+009F) or a line or paragraph separator (Zl, Zp: U+2028, U+2029). These include
    every character str.splitlines ends a line at, so another tool, or an editor, that reads
    the file by lines cannot cut a user's line in two."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F or code == 0x2028 or code == 0x2029


def check_username(username: str) -> str | None:
    """Why ``username`` cannot be stored in a password file, or None."""
    if not username:
        return "the user name is empty"
    if ":" in username:
        return "a user name cannot contain ':'"
    bad = next((ch for ch in username if 0xD800 <= ord(ch) <= 0xDFFF), None)
    if bad is not None:     # a command line's byte that is not UTF-8 (surrogateescape)
        code = ord(bad)
        return ("the user name is not UTF-8 text, which MQTT clients send (it has "
                + (f"the byte 0x{code - 0xDC00:02X})" if 0xDC80 <= code <= 0xDCFF
                   else f"U+{code:04X})"))
    bad = next((ch for ch in username if _breaks_lines(ch)), None)
    if bad is not None:
        return (f"a user name cannot contain control characters or line separators "
                f"(it has U+{ord(bad):04X})")
    if username.lstrip().startswith("#"):
        return "a user name cannot start with '#' (the line would be a comment)"
    return None


def lines_of(text: str) -> list[str]:
    """The lines of a password file: split at "\n" only (a "\r" before it is dropped), not
    at every line break str.splitlines knows (U+2028 and others, which user names cannot
    hold, but comments can)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def check_permissions(path: str, key: str) -> None:
    """Refuse a password file others can read or write, or its group can write, or owned by
    a user other than root and the broker's, who could change it."""
    st = config_file_stat(path, key)
    mode = st.st_mode
    if mode & 0o027:
        raise ConfigError(
            f"{key}: {path}: permissions {stat.filemode(mode)} let other users "
            f"{'change' if mode & 0o022 else 'read'} it; "
            f"run: chmod 600 {path} (or 640 for a group the broker runs in)")
    owner = owner_problem(path, st.st_uid)
    if owner:
        raise ConfigError(f"{key}: {path}: {owner}")


class PasswordFile:
    """The parsed ``password_file``: user name -> parsed hash, and SCRAM keys."""

    def __init__(self, path: str, entries: dict[str, tuple], raw: dict[str, str],
                 scram_keys: dict[str, tuple[str, scram.Keys]] | None = None):
        self.path = path
        self.entries = entries
        self.raw = raw                          # user -> hash string (the cache key)
        self.scram = scram_keys or {}           # user -> (stored field, its Keys)
        self.weak = sorted(u for u, h in entries.items() if is_weak(h))
        self._dummy: tuple | None = None
        self._scram_iterations: int | None = None

    def __len__(self):
        return len(self.entries)

    def lookup(self, username: str) -> tuple[str, tuple] | None:
        """(hash string, parsed hash) of ``username``, or None."""
        parsed = self.entries.get(username)
        if parsed is None:
            return None
        return self.raw[username], parsed

    def dummy(self) -> tuple:
        """A parsed hash to check unknown users against: the scheme and parameters most of
        the file's users have, a random salt and digest. An unknown user then costs what a
        known one does, whichever hash the file uses (so the time of a refusal does not
        tell which user names exist)."""
        if self._dummy is None:
            shape = _most_common(parsed[:-2] for parsed in self.entries.values())
            if shape is not None:       # the scheme and its parameters; then salt, digest
                sample = next(p for p in self.entries.values() if p[:-2] == shape)
                self._dummy = shape + (os.urandom(len(sample[-2])),
                                       os.urandom(len(sample[-1])))
            else:
                self._dummy = dummy_hash()
        return self._dummy

    def scram_iterations(self) -> int:
        """The SCRAM iteration count most of the file's users have (the default without
        any): what a user without keys is told (``scram.Exchange``)."""
        if self._scram_iterations is None:
            from edgebroker.security.scram import DEFAULT_ITERATIONS
            most = _most_common(keys.iterations for _, keys in self.scram.values())
            self._scram_iterations = DEFAULT_ITERATIONS if most is None else most
        return self._scram_iterations

    def scram_keys(self, username: str) -> scram.Keys | str:
        """``username``'s SCRAM keys, or why there are none (``scram.Lookup``)."""
        found = self.scram.get(username)
        if found is not None:
            return found[1]
        if username in self.entries:
            return ("no SCRAM keys for this user (added before edgebroker passwd wrote them: "
                    "set its password again with edgebroker passwd; its password login works)")
        return "unknown user"

    @classmethod
    def load(cls, path: str, key: str = "password_file") -> "PasswordFile":
        check_permissions(path, key)
        try:
            with open(path, encoding="utf-8-sig") as fh:
                text = fh.read()
        except OSError as exc:
            raise ConfigError(f"{key}: {path}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{key}: {path}: not UTF-8 text") from None
        entries: dict[str, tuple] = {}
        raw: dict[str, str] = {}
        keys: dict[str, tuple[str, scram.Keys]] = {}
        problems: list[str] = []
        plain_line = 0      # the first plain-text line's number (the hint goes with it)
        hint = (f"plain-text passwords are not accepted: run 'edgebroker passwd -U {path}' "
                f"to hash them")
        for number, line in enumerate(lines_of(text), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            bad = _add_line(line, entries, raw, keys)
            if bad is None:
                continue
            problem, plain = bad
            if plain and not plain_line:
                plain_line = number
                problem += f"; {hint}"
            problems.append(f"{key}: {path} line {number}: {problem}")
        if problems:
            shown = shown_problems(problems, f"{key}: {path}")
            if plain_line and not any(hint in p for p in shown):     # (cut off: said after)
                shown.append(f"{key}: {path} line {plain_line} (the first plain-text line): "
                             f"{hint}")
            raise ConfigError(*shown)
        return cls(path, entries, raw, keys)


# A password or ACL file with more bad lines than this reports these and how many more.
PROBLEM_LINES = 20


def shown_problems(problems: list[str], where: str) -> list[str]:
    """Every bad line of a file (``where``: its key and path), up to PROBLEM_LINES of them,
    then how many more (config check, start and reload report them all at once)."""
    if len(problems) <= PROBLEM_LINES:
        return problems
    return problems[:PROBLEM_LINES] + [f"{where}: {len(problems) - PROBLEM_LINES} more bad "
                                       f"lines (the first {PROBLEM_LINES} are above)"]


def _add_line(line: str, entries: dict, raw: dict, keys: dict) -> tuple[str, bool] | None:
    """Add the user of one password file line to ``entries``, ``raw`` and ``keys``; what is
    wrong with the line and whether it looks like a plain-text password, or None."""
    username, sep, stored = line.partition(":")
    if not sep:
        return "expected username:hash", False
    problem = check_username(username)
    if problem:
        return problem, False
    if username in entries:
        return f"user {username!r} is listed twice", False
    stored, sep, field = stored.partition(":")
    stored = stored.strip()
    try:
        parsed = parse_hash(stored)
    except HashError as exc:
        return f"user {username!r}: {exc}", not stored.startswith("$")
    if sep:
        from edgebroker.security import scram
        field = field.strip()
        try:
            keys[username] = (field, scram.parse_keys(field))
        except scram.FormatError as exc:
            return f"user {username!r}: {exc} (the third field holds the SCRAM keys)", False
    entries[username] = parsed
    raw[username] = stored
    return None


def write_atomic(path: str, lines: list[str]) -> None:
    """Replace ``path`` with ``lines``: temporary file in the same directory, fsync, rename
    over, fsync the directory. Keeps the old owner and group when allowed, and the old mode
    less group-write and every bit for others (``old & 0o640``: a 0640 file for the broker's
    group stays 0640); a new file is 0600. Group read is kept only when the group is kept: a
    file that could not be given its old group gets no group bits. A symbolic link is
    followed: the file it points to is replaced (next to it), the link stays."""
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    import tempfile   # here: the broker never writes a password file (idle memory)

    fd, tmp = tempfile.mkstemp(prefix=".passwd-", dir=directory)   # created with mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))
            fh.flush()
            mode = 0o600
            if old is not None:
                try:
                    os.fchown(fh.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass
                mode = stat.S_IMODE(old.st_mode) & 0o640
                if os.fstat(fh.fileno()).st_gid != old.st_gid:
                    mode &= 0o600
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
