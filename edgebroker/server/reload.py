"""What a reload (SIGHUP) cannot apply: the settings the running broker keeps until a restart.
``App.reload`` (server/app.py) applies the rest and logs one warning naming these."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from edgebroker.config import Config


def _listening(lc) -> tuple:
    """What a listener's socket was opened with: changed only by a restart."""
    return lc.address, lc.protocol, lc.websocket_path


def needs_restart(started: Config, new: Config) -> list[str]:
    """The keys of ``new`` that differ from the configuration the broker started with and take
    effect only after a restart (compared with the start, not the last reload: a second reload
    says it again)."""
    changed = []
    if [_listening(lc) for lc in new.listeners] != [_listening(lc) for lc in started.listeners]:
        changed.append("listeners (addresses, protocol, websocket_path)")
    if new.state_dir() != started.state_dir():
        changed.append("data_dir")
    for name, key in (("log", "[log]"), ("metrics", "[metrics]"), ("upload", "[upload]"),
                      ("bridge", "[[bridge]]")):
        if getattr(new, name) != getattr(started, name):
            changed.append(key)
    return changed
