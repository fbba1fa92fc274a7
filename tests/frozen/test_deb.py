"""The Debian package of ``make deb`` (packaging/deb.sh, docs/deploy.md): what it holds, what its
maintainer scripts are given, and lintian's verdict (no error, no warning that is not overridden
with its reason). ``make test-arm64`` names the arm64 package in EDGEBROKER_DEB (and its binary
in EDGEBROKER_BINARY). The package at work under systemd: tests/boot/ (make test-boot)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

import edgebroker
from conftest import REPO

SYSTEMD = REPO / "systemd"
ELF_MACHINES = {62: "amd64", 183: "arm64"}


def debian_version(version: str) -> str:
    """A PEP 440 version in Debian's spelling: pre-releases sort before the release."""
    version = re.sub(r"\.?(a|b|rc|dev)(\d)", r"~\1\2", version, count=1)
    return re.sub(r"\.post(\d)", r"+post\1", version)


@pytest.fixture(scope="module")
def deb(binary) -> Path:
    given = os.environ.get("EDGEBROKER_DEB")
    if given:
        path = Path(given).resolve()
        assert path.is_file(), f"EDGEBROKER_DEB={given}: no such file"
        return path
    r = subprocess.run(["make", "-s", "deb"], cwd=REPO, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"make deb failed:\n{r.stdout}\n{r.stderr}"
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    path = REPO / "dist" / f"edgebroker_{debian_version(edgebroker.__version__)}_{arch}.deb"
    assert path.is_file(), f"make deb made no {path}"
    return path


@pytest.fixture(scope="module")
def unpacked(deb, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=60)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(root / "DEBIAN")], check=True, timeout=60)
    return root


def control_fields(root: Path) -> dict[str, str]:
    fields = {}
    for line in (root / "DEBIAN" / "control").read_text().splitlines():
        if line and not line.startswith(" "):
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def unit_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_files_modes_and_owners(deb):
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    files = {}
    for line in listing.splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        if not mode.startswith("d"):
            files[path.removeprefix(".")] = (mode, owner)
    expected = {
        "/usr/bin/edgebroker": "-rwxr-xr-x",
        "/lib/systemd/system/edgebroker.service": "-rw-r--r--",
        "/etc/edgebroker/edgebroker.toml": "-rw-r--r--",
        "/usr/share/doc/edgebroker/copyright": "-rw-r--r--",
        "/usr/share/doc/edgebroker/changelog.gz": "-rw-r--r--",
        "/usr/share/man/man1/edgebroker.1.gz": "-rw-r--r--",
        "/usr/share/lintian/overrides/edgebroker": "-rw-r--r--",
    }
    # The socket unit goes in exactly when systemd/ has one.
    if (SYSTEMD / "edgebroker.socket").exists():
        expected["/lib/systemd/system/edgebroker.socket"] = "-rw-r--r--"
    assert {p: m for p, (m, _) in files.items()} == expected
    assert {owner for _, owner in files.values()} == {"root/root"}


def test_control_version_architecture_depends(unpacked, binary):
    fields = control_fields(unpacked)
    assert fields["Package"] == "edgebroker"
    assert fields["Version"] == debian_version(edgebroker.__version__)
    # The architecture is the binary's (ELF e_machine), and the binary is the one built.
    packaged = (unpacked / "usr/bin/edgebroker").read_bytes()
    assert packaged == binary.read_bytes()
    assert packaged[:4] == b"\x7fELF"
    assert fields["Architecture"] == ELF_MACHINES[int.from_bytes(packaged[18:20], "little")]
    depends = [d.strip() for d in fields["Depends"].split(",")]
    assert re.fullmatch(r"libc6 \(>= 2\.\d+\)", depends[0]), depends
    assert len(depends) == 1, depends   # (the unit's sh, rm and stat are essential packages)
    assert int(fields["Installed-Size"]) >= len(packaged) // 1024


def test_configuration_is_the_commented_default_and_a_conffile(unpacked):
    conffiles = (unpacked / "DEBIAN/conffiles").read_text().split()
    assert conffiles == ["/etc/edgebroker/edgebroker.toml"]
    packaged = (unpacked / "etc/edgebroker/edgebroker.toml").read_text()
    assert packaged == (SYSTEMD / "edgebroker.toml").read_text()
    assert packaged.startswith("# /etc/edgebroker/edgebroker.toml")


def test_units_run_the_packaged_binary_with_the_conffile(unpacked):
    """The repo's unit says /usr/local/bin (a manual install); the package's says /usr/bin and is
    otherwise the same, setting for setting."""
    for name in ("edgebroker.service", "edgebroker.socket"):
        if not (SYSTEMD / name).exists():
            continue
        packaged = (unpacked / "lib/systemd/system" / name).read_text()
        assert "/usr/local/bin" not in packaged
        assert packaged.startswith(f"# {name} of the Debian package edgebroker")
        assert unit_lines(packaged) == [
            ln.replace("/usr/local/bin/edgebroker", "/usr/bin/edgebroker")
            for ln in unit_lines((SYSTEMD / name).read_text())]
    service = (unpacked / "lib/systemd/system/edgebroker.service").read_text()
    assert "\nExecStart=/usr/bin/edgebroker serve -c /etc/edgebroker/edgebroker.toml\n" in service
    if (SYSTEMD / "edgebroker.socket").exists():
        # The rule an administrator changing listeners must know stays in the package's copy
        # (its header, the manual install's steps, is replaced).
        socket_unit = (unpacked / "lib/systemd/system/edgebroker.socket").read_text()
        for words in ("every listener needs a ListenStream= here", "systemctl edit "
                      "edgebroker.socket", "systemctl disable --now edgebroker.socket"):
            assert words in socket_unit, socket_unit


def test_maintainer_scripts(unpacked):
    units = "edgebroker.service"
    if (SYSTEMD / "edgebroker.socket").exists():
        units = "edgebroker.socket edgebroker.service"
    for name in ("postinst", "prerm", "postrm"):
        script = unpacked / "DEBIAN" / name
        assert os.access(script, os.X_OK), name
        text = script.read_text()
        assert "@UNITS@" not in text and units in text, name
        r = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, f"{name}: {r.stderr}"
    postrm = (unpacked / "DEBIAN/postrm").read_text()
    assert "rm -rf /var/lib/edgebroker /var/lib/private/edgebroker" in postrm
    assert "rm -rf /var/cache/edgebroker /var/cache/private/edgebroker" in postrm


def test_lintian_finds_no_error_or_warning(deb):
    """Warnings lintian would give and that stay (PyInstaller's bootloader: no PIE, no BIND_NOW)
    are overridden in the package with the reason (packaging/debian/lintian-overrides)."""
    r = subprocess.run(["lintian", "--allow-root", "--fail-on", "error,warning", str(deb)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    tags = [ln for ln in r.stdout.splitlines() if re.match(r"[EW]: ", ln)]
    assert r.returncode == 0 and tags == [], r.stdout + r.stderr
