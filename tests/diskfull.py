"""A real full disk for tests: a small tmpfs in a private mount namespace.

A test calls ``in_private_mount_namespace(request)``: outside the namespace it
re-runs itself under ``unshare --mount`` (plus ``--user --map-root-user`` when
not root) and checks that run; inside, it returns True and may mount a tmpfs,
which is private to that process tree (a broker started by the test included)
and disappears with it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

INSIDE = "EDGEBROKER_TEST_PRIVATE_MOUNT"
ROOT = Path(__file__).resolve().parents[1]


def in_private_mount_namespace(request) -> bool:
    """True when running inside the namespace; otherwise run this test there and check it."""
    if os.environ.get(INSIDE) == "1":
        return True
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) (util-linux) is needed for the disk-full tests"
    cmd = [unshare, "--mount"]
    if os.geteuid() != 0:
        cmd += ["--user", "--map-root-user"]
    cmd += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid]
    r = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **{INSIDE: "1"}),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"inner run failed:\n{r.stdout}\n{r.stderr}"
    assert " passed" in r.stdout, r.stdout
    return False


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"cannot mount a tmpfs at {path}: {r.stderr.strip()}"


def fill(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.write(os.urandom(size))


def fill_up(path: Path) -> None:
    """Take every free byte of the filesystem."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def small_disk(tmp_path: Path) -> tuple[Path, str]:
    """A 4 MiB tmpfs (call inside the namespace) and the state directory to use on it."""
    small = tmp_path / "small"
    mount_tmpfs(small, "4m")
    return small, str(small / "data")


def broker_on_a_small_disk(broker, tmp_path: Path, uid: str):
    """A broker whose state directory is on a 4 MiB tmpfs (call inside the namespace), a
    persistent QoS 2 subscriber of ``<uid>/t`` and a persistent publisher, the subscription in
    a snapshot: (broker, its state directory, the tmpfs, subscriber, publisher)."""
    from conftest import wait_for_snapshot
    small, data_dir = small_disk(tmp_path)
    b = broker(data_dir=data_dir)
    sub = b.client(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", qos=2)
    pub = b.client(f"{uid}-p", clean=False)
    wait_for_snapshot(data_dir, f"{uid}-s", pred=lambda s: s["subscriptions"])
    return b, data_dir, small, sub, pub
