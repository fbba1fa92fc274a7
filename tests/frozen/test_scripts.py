"""The build scripts (packaging/*.sh, the Makefile): every ``apt-get install`` runs after an
``apt-get update`` (a fresh Debian image has no package lists: install finds nothing)."""

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
