"""The frozen binary's entry point: the same `edgebroker` command as the installed one."""

import os
import sys


def read_modules_from_own_executable() -> None:
    """Point PyInstaller's module archive at the file this process was started from.

    In one-file mode PyInstaller opens the executable by its path again for every module
    imported after the start (the broker imports some lazily: the TOML parser at each reload,
    hashlib and hmac at the first password check). Once the file at that path is replaced (an
    upgrade: dpkg or `install` renames a new file over it), those reads would take the new
    file's bytes at the old file's offsets and the import fail ("zlib.error"). A descriptor
    opened on it now keeps that file, and /proc/self/fd/N opens it again whatever its path
    names later (also under qemu-user, whose /proc/self/exe names the emulator). Done only
    when the archive reader is the one this was written for (PyInstaller 6:
    ``pyz_archive._filename``) and /proc is there; otherwise left as it is."""
    if not getattr(sys, "frozen", False):
        return
    importers = sys.modules.get("pyimod02_importers")
    archive = getattr(importers, "pyz_archive", None)
    path = getattr(archive, "_filename", None)
    if not isinstance(path, str) or path.startswith("/proc/self/fd/"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)          # (not inherited by child processes)
        kept = f"/proc/self/fd/{fd}"
        with open(kept, "rb"):
            pass
    except OSError:
        return
    archive._filename = kept


def remove_unpacked_files() -> None:
    """An orphan's end (the bootloader was killed: ``stop_with_parent``): the bootloader,
    which removes the files it unpacked (sys._MEIPASS) once its child ends, is gone."""
    where = getattr(sys, "_MEIPASS", None)
    if where and os.path.basename(where).startswith("_MEI"):
        import shutil
        shutil.rmtree(where, ignore_errors=True)


read_modules_from_own_executable()

import edgebroker  # noqa: E402  (after the archive is pointed)
from edgebroker.cli.main import main  # noqa: E402

# The process that started this one, the bootloader in the one-file binary: `serve` stops
# when it is gone (server/app.py), rather than serve on as an orphan.
edgebroker.stop_with_parent = os.getppid()
status = main()
if getattr(sys, "frozen", False) and os.getppid() != edgebroker.stop_with_parent:
    remove_unpacked_files()
sys.exit(status)
