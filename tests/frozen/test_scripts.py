"""The build scripts (packaging/*.sh, the Makefile): every ``apt-get install`` runs after an
``apt-get update`` (a fresh Debian image has no package lists: install finds nothing); a binary
built without the C helper is refused and removed (make dist, packaging/arm64.sh)."""

import shutil
import subprocess

from conftest import REPO

SCRIPTS = sorted((REPO / "packaging").glob("*.sh")) + [REPO / "Makefile"]


def test_apt_get_install_follows_an_update():
    checked = 0
    for script in SCRIPTS:
        lines = [line.strip() for line in script.read_text().splitlines()]
        for number, line in enumerate(lines):
            if line.startswith("#") or "apt-get install" not in line:
                continue
            checked += 1
            # The update on the same line (before the install) or on one of the 3 lines before.
            before = line.split("apt-get install")[0]
            context = [before] + [x for x in lines[max(0, number - 3):number]
                                  if not x.startswith("#")]
            assert any("apt-get update" in x for x in context), \
                f"{script.relative_to(REPO)}:{number + 1}: apt-get install without apt-get update"
    assert checked >= 5


CHECK = REPO / "packaging" / "check-native.sh"


def fake_binary(path, backend: str):
    """An executable that answers --version as a binary built with (``c``) or without
    (``python``) the C helper does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    f'echo "edgebroker 0.1.0 (native backend: {backend}, CRC32C: table; '
                    'frozen binary)"\n')
    path.chmod(0o755)


def test_check_native_removes_a_binary_without_the_c_helper(tmp_path):
    slow, fast = tmp_path / "slow" / "edgebroker", tmp_path / "fast" / "edgebroker"
    fake_binary(slow, "python")
    fake_binary(fast, "c")
    r = subprocess.run([str(CHECK), str(slow)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and not slow.exists(), r.stderr
    assert "native backend: python" in r.stderr and "removed" in r.stderr, r.stderr
    r = subprocess.run([str(CHECK), str(fast)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and fast.exists(), r.stderr


def test_make_dist_refuses_the_same_binary_twice(tmp_path):
    """The Makefile's dist/edgebroker rule, run in a directory of its own with a stand-in
    PyInstaller that builds a binary without the C helper: the refused binary is removed, so
    the second ``make dist`` builds (and refuses) again instead of calling it up to date;
    once the build has the helper, make dist succeeds."""
    for name in ("edgebroker/__init__.py", "packaging/edgebroker.spec", "packaging/entry.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    shutil.copy(CHECK, tmp_path / "packaging" / CHECK.name)
    backend = tmp_path / "backend"
    pyinstaller = tmp_path / "fakebin" / "pyinstaller"
    pyinstaller.parent.mkdir()
    pyinstaller.write_text("#!/bin/sh\nmkdir -p dist\n"
                           f'printf \'#!/bin/sh\\necho "edgebroker 0.1.0 (native backend: '
                           f'%s, CRC32C: table)"\\n\' "$(cat {backend})" > dist/edgebroker\n'
                           "chmod 755 dist/edgebroker\n")
    pyinstaller.chmod(0o755)
    built = tmp_path / "dist" / "edgebroker"

    def make_dist():
        return subprocess.run(["make", "-f", str(REPO / "Makefile"), "dist", "BIN=fakebin",
                               "DEB_VERSION=0", "-o", ".venv/.installed",
                               "-o", ".venv/.installed-dist"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    backend.write_text("python")
    for attempt in (1, 2):
        r = make_dist()
        assert r.returncode != 0 and not built.exists(), (attempt, r.stdout + r.stderr)
        assert "does not run the C helper" in r.stderr, r.stderr
    backend.write_text("c")
    r = make_dist()
    assert r.returncode == 0 and built.exists(), r.stdout + r.stderr


def test_arm64_build_checks_the_native_backend():
    """packaging/arm64.sh checks its binary with the same script as make dist, before it copies
    it out of the arm64 root file system."""
    text = (REPO / "packaging" / "arm64.sh").read_text()
    check = text.find("packaging/check-native.sh dist/edgebroker")
    assert 0 < check < text.find('cp "$ROOT/src/dist/edgebroker"'), text
