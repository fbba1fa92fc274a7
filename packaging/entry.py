"""The frozen binary's entry point: the same `edgebroker` command as the installed one."""

import os
import sys

OWN_EXECUTABLE = "/proc/self/exe"


def read_modules_from_own_executable() -> None:
    """Point PyInstaller's module archive at the running process's own executable.

    In one-file mode PyInstaller opens the executable by its path again for every module
    imported after the start (the broker imports some lazily: the TOML parser at each reload,
    hashlib and hmac at the first password check). Once the file at that path is replaced (an
    upgrade: dpkg or `install` renames a new file over it), those reads would take the new
    file's bytes at the old file's offsets and the import fail ("zlib.error"). /proc/self/exe
    stays the file this process was started from. Done only when the archive reader is the one
    this was written for (PyInstaller 6: ``pyz_archive._filename``) and /proc/self/exe is that
    same file (not under qemu-user, where it names the emulator); otherwise left as it is."""
    if not getattr(sys, "frozen", False):
        return
    importers = sys.modules.get("pyimod02_importers")
    archive = getattr(importers, "pyz_archive", None)
    path = getattr(archive, "_filename", None)
    if not isinstance(path, str) or path == OWN_EXECUTABLE:
        return
    try:
        own, named = os.stat(OWN_EXECUTABLE), os.stat(path)
        with open(OWN_EXECUTABLE, "rb"):
            pass
    except OSError:
        return
    if (own.st_dev, own.st_ino) == (named.st_dev, named.st_ino):
        archive._filename = OWN_EXECUTABLE


read_modules_from_own_executable()

from edgebroker.cli.main import main  # noqa: E402  (after the archive is pointed)

sys.exit(main())
