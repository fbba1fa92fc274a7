"""The benchmark's log-disk ceiling (bench/ceiling.py, log_disk_ceiling): it writes what it
says, rolls and deletes its files like the log, and leaves nothing behind (no file, no
descriptor, no thread)."""

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ceiling  # noqa: E402


def _open_fds(under) -> set:
    """This process's descriptors open on files under ``under`` (other tests' sockets may
    close meanwhile, so the whole table is not compared)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)):
            found.add(target)
    return found


def test_log_disk_ceiling_rolls_deletes_and_cleans_up(tmp_path, monkeypatch):
    # Small files and retention, so that 300 records of 64 KiB (about 20 MB) roll 19 times
    # and delete 17 files on the way.
    monkeypatch.setattr(ceiling, "LOG_SEGMENT", 1 << 20)
    monkeypatch.setattr(ceiling, "LOG_RETENTION", 2 << 20)
    monkeypatch.setattr(ceiling, "LOG_FLUSH_S", 0.005)
    deleted = []
    present = []   # files in the run's directory at each deletion
    real_unlink = os.unlink

    def unlink(path, *a, **kw):
        deleted.append(path)
        present.append(len(os.listdir(os.path.dirname(path))))
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    threads = threading.active_count()

    out = ceiling.log_disk_ceiling(300, 65536, directory=str(tmp_path))

    assert set(out) == {"log disk, 64 KiB records MB/s", "log disk write CPU us/record"}
    assert out["log disk, 64 KiB records MB/s"] > 0
    assert out["log disk write CPU us/record"] > 0
    # Every file of the run was deleted, the oldest ones while it ran (retention), and its
    # directory went with them.
    assert len(deleted) >= 19
    assert max(present) <= 3   # 2 MiB of retention, plus the file just opened
    assert all(p.endswith(".seg") for p in deleted)
    assert list(tmp_path.iterdir()) == []
    assert _open_fds(tmp_path) == set()
    assert threading.active_count() == threads


def test_log_disk_ceiling_names_other_sizes(tmp_path):
    out = ceiling.log_disk_ceiling(20, 512, directory=str(tmp_path))
    assert "log disk, 512 B records MB/s" in out
    assert list(tmp_path.iterdir()) == []


def test_summary_gives_the_64k_ratio_to_the_log_disk():
    import report  # noqa: E402 (bench/, on the path above)
    gen = {"log disk, 64 KiB records MB/s": 1000.0, "log disk write CPU us/record": 30.0}
    records = [{"scenario": "large_64k", "broker": b, "round": r, "value": v, "loss_pct": 0.0,
                "broker_cpu_pct": 99.0, "broker_rss_mb": 28.0, "broker_cpu_s_per_100k": 9.0,
                "generator_ceiling": gen}
               for r, (b, v) in enumerate([("edgebroker", 640.0), ("mosquitto", 1300.0),
                                           ("edgebroker", 660.0), ("mosquitto", 1290.0)])]
    rows = {r["broker"]: r for r in report.summarize(records, ["large_64k"],
                                                     ["edgebroker", "mosquitto"])}
    assert rows["edgebroker"]["notes"].endswith("; 0.65× the log disk's 1,000 MB/s")
    assert "log disk" not in rows["mosquitto"]["notes"]
    # Without the ceiling (--no-ceiling, or it failed) there is nothing to compare with.
    for r in records:
        r["generator_ceiling"] = None
    rows = report.summarize(records, ["large_64k"], ["edgebroker", "mosquitto"])
    assert all("log disk" not in r["notes"] for r in rows)
