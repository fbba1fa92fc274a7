"""`edgebroker passwd` on the files it meets: one starting with a UTF-8 byte order mark, one
edited by two commands at once, and passwords that are not UTF-8."""

from conftest import run_cli

from edgebroker.security.passwords import PasswordFile

BOM = "\ufeff"


def users_of(path) -> list[str]:
    return [line.split(":")[0] for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_byte_order_mark_is_skipped_as_the_broker_skips_it(tmp_path):
    """The broker skips a BOM (docs/security.md); passwd read it as part of the first user's
    name: changing that user's password added a second line for it ("added"), and the broker
    then refused the file (user listed twice); -D said there was no such user."""
    path = tmp_path / "bom.pw"
    assert run_cli("passwd", "-b", "--no-scram", str(path), "alice", "old").returncode == 0
    assert run_cli("passwd", "-b", "--no-scram", str(path), "bob", "b").returncode == 0
    path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    r = run_cli("passwd", "-b", str(path), "alice", "new")
    assert r.returncode == 0 and r.stdout == f"{path}: user 'alice' changed\n", r.stdout
    assert users_of(path) == ["alice", "bob"]
    assert set(PasswordFile.load(str(path)).entries) == {"alice", "bob"}
    path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    r = run_cli("passwd", "-D", str(path), "alice")
    assert r.returncode == 0 and r.stdout == f"{path}: user 'alice' deleted\n", r.stderr
    assert users_of(path) == ["bob"]
