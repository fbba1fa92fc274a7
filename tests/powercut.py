"""A power cut for the tests: the shim tests/faults/powercut.c, loaded into a broker with
LD_PRELOAD, records what each fsync made durable under a directory; after the broker is
killed, ``rebuild`` makes the directory a power cut at that moment would leave (see the
shim's comment for the model)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import shims


def environment(directory: Path, shadow: Path) -> dict[str, str]:
    """The variables that load the shim into a process started now, watching ``directory``
    (which must exist, with every subdirectory the process will use: they count as durable)
    and recording into ``shadow`` (outside it)."""
    for part in ("files", "dirs", "tmp"):
        (shadow / part).mkdir(parents=True, exist_ok=True)
    lib = shims.build("powercut", shadow)
    return {"LD_PRELOAD": str(lib), "EB_POWER_DIR": str(directory.resolve()),
            "EB_POWER_SHADOW": str(shadow)}


def sync_all(directory: Path, shadow: Path) -> None:
    """Record every file and directory under ``directory`` as durable, as ``sync`` would make
    them (what an earlier run left, before a run under the shim)."""
    script = ("import os, sys\n"
              "for top, dirs, files in os.walk(sys.argv[1]):\n"
              "    for name in files + ['.']:\n"
              "        path = os.path.join(top, name)\n"
              "        if name == '.' or os.path.isfile(path) and not os.path.islink(path):\n"
              "            fd = os.open(path, os.O_RDONLY)\n"
              "            os.fsync(fd)\n"
              "            os.close(fd)\n")
    env = {**os.environ, **environment(directory, shadow)}
    subprocess.run([sys.executable, "-c", script, str(directory)], env=env, check=True)


def rebuild(directory: Path, shadow: Path, into: Path) -> dict[str, int]:
    """Make ``into`` hold what ``directory`` held after a power cut: the subdirectories it
    had (made before the shim watched it), and in each directory the names its last fsync
    listed, each with its file's content as of that file's last fsync (empty when never
    fsynced). The bytes of each file rebuilt, by relative path."""
    sizes = {}
    for sub in sorted(p for p in directory.rglob("*") if p.is_dir()):
        (into / sub.relative_to(directory)).mkdir(parents=True, exist_ok=True)
    into.mkdir(parents=True, exist_ok=True)
    for listing in (shadow / "dirs").iterdir():
        rel = Path("." if listing.name == "%" else listing.name.replace("%", "/"))
        for line in listing.read_text().splitlines():
            kind, key, name = line.split(" ", 2)
            target = into / rel / name
            if kind == "d":
                target.mkdir(parents=True, exist_ok=True)
            elif kind == "f":
                saved = shadow / "files" / key
                if saved.exists():
                    shutil.copyfile(saved, target)
                else:
                    target.write_bytes(b"")
                sizes[str(rel / name)] = target.stat().st_size
    return sizes
