"""Commands run as root on a state directory another user owns (the service's user: the
systemd unit's ``DynamicUser=`` or ``User=``).

A file root creates or rewrites there (a segment's index, the upload mark, the intent file)
would be root's, 0640: the broker, started again as the service's user, could not open the
log ("Permission denied"). ``upload run --once`` hands what it wrote over to the directory's
owner (``handed_over``); ``serve``, which writes there for as long as it runs, refuses
(``refuse_foreign``). Other users than root cannot create files of another user, and cannot
write into a directory that is not theirs to write: nothing to do for them.

Why not switch to the owner's uid instead: under ``DynamicUser=yes`` the state directory is
``/var/lib/private/edgebroker``, and ``/var/lib/private`` is root's, mode 0700, so its owner
reaches it only inside the service; and the one-file binary unpacked its libraries into a
directory of root's, mode 0700, which the owner could not read its later imports from.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager

from edgebroker.errors import EdgebrokerError


def foreign_owner(state_dir: str) -> tuple[int, int] | None:
    """(uid, gid) of ``state_dir`` when this process runs as root and the directory belongs to
    another user; else None (also when it does not exist yet: root creates it, root's)."""
    if os.geteuid() != 0:
        return None
    try:
        st = os.stat(state_dir)
    except OSError:
        return None
    return (st.st_uid, st.st_gid) if st.st_uid != 0 else None


def refuse_foreign(state_dir: str, command: str) -> None:
    """EdgebrokerError when root would write into another user's ``state_dir``."""
    owner = foreign_owner(state_dir)
    if owner is None:
        return
    uid, gid = owner
    raise EdgebrokerError(
        f"the state directory {state_dir} belongs to uid {uid}, not root: `{command}` run as "
        f"root would leave files there that uid {uid} (the service's user) cannot open. Run "
        f"it as that user (`setpriv --reuid={uid} --regid={gid} --clear-groups edgebroker "
        f"...`, or the systemd unit), or give the directory to root first (`chown -R root:root "
        f"{state_dir}`)")


def foreign_warning(state_dir: str) -> str | None:
    """`config check` run as root: what `serve` run so would refuse (``refuse_foreign``), as a
    warning: the unit runs `serve` as the directory's owner, and that user's reload check, or
    root's with the unit's STATE_DIRECTORY (docs/deploy.md), is of a directory that is fine."""
    owner = foreign_owner(state_dir)
    if owner is None:
        return None
    uid, gid = owner
    return (f"the state directory {state_dir} belongs to uid {uid}, not root: `edgebroker "
            f"serve` run as root (by hand) refuses it; the systemd unit, or `setpriv "
            f"--reuid={uid} --regid={gid} --clear-groups edgebroker serve ...`, runs it as "
            f"that user")


def hand_over(state_dir: str, owner: tuple[int, int]) -> int:
    """Every file and directory under ``state_dir`` that is root's becomes ``owner``'s.
    Only directories and regular files with one link, changed through a descriptor opened
    without following links: the directory is the other user's to change meanwhile, and a
    hard link or symbolic link planted there must not hand one of root's files elsewhere to
    that user. Returns how many changed; EdgebrokerError naming the first that could not be
    changed."""
    uid, gid = owner
    changed = 0
    failed: list[str] = []
    for top, dirs, files in os.walk(state_dir):
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                changed += _give(path, uid, gid)
            except FileNotFoundError:
                continue
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror}")
    if failed:
        raise EdgebrokerError(
            f"cannot give {len(failed)} root-owned files in {state_dir} to uid {uid} (the "
            f"directory's owner, who could not open them): {failed[0]}; `chown -R {uid}:{gid} "
            f"{state_dir}` before the broker starts")
    return changed


def _give(path: str, uid: int, gid: int) -> int:
    """1 when ``path``, root's, a directory or a regular file of one link, became uid's."""
    first = os.lstat(path)
    if first.st_uid != 0 or not (stat.S_ISDIR(first.st_mode) or stat.S_ISREG(first.st_mode)):
        return 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or not (stat.S_ISDIR(st.st_mode)
                                  or stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
            return 0
        os.fchown(fd, uid, gid)
        return 1
    finally:
        os.close(fd)


@contextmanager
def handed_over(state_dir: str):
    """Run as root on another user's ``state_dir``: before (what an interrupted run left) and
    after the block, whatever root has there becomes that user's."""
    owner = foreign_owner(state_dir)
    if owner is None:
        yield
        return
    hand_over(state_dir, owner)
    try:
        yield
    finally:
        hand_over(state_dir, owner)
