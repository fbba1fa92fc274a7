"""The uploader on a full disk, for real (a private tmpfs; see tests/diskfull.py): a full state
disk does not jam it (the uploaded mark moves, retention frees the room of what was uploaded,
the held publish is acknowledged), and a full upload directory is counted, said in the state
and logged once, in the broker and in ``upload run --once``."""

from __future__ import annotations

import os

from diskfull import in_private_mount_namespace, mount_tmpfs
from mqttraw import PUBACK, publish as publish_frame

from .test_uploader import landed_offsets, upload_config, uploaded, wait_until

MARK_WARNING = "cannot write the uploaded mark"


def test_a_full_state_disk_does_not_jam_the_uploader(broker, tmp_path, request):
    """The landing folder is missing (not mounted yet) while the state disk fills up; once it
    is there, every record acknowledged lands, though the mark's file has no room at first:
    the mark moves in memory, the uploaded segments go (whatever their age: retention_ms is
    7 days), the file is written once there is room, and the held publish is acknowledged."""
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "1536k")
    landing = tmp_path / "landing"
    b = broker(data_dir=str(small / "data"), log={"segment_bytes": 65536},
               upload=upload_config(landing, batch_bytes=16384, batch_max_age=1))
    pub = b.client("pub")
    acked = 0
    for i in range(3000):                  # 3 MB: more than the disk holds
        pub.send(publish_frame("t", os.urandom(1000), qos=1, packet_id=1 + i))
        try:
            pub.expect(PUBACK, timeout=3)
        except TimeoutError:
            break
        acked += 1
    assert 0 < acked < 3000, "the disk never filled up"
    assert b.wait_log(lambda line: "commit log cannot write" in line, timeout=5)
    landing.mkdir()
    b.admin("upload_resume")               # ends the back-off
    pub.expect(PUBACK, timeout=60)         # the held publish: written once room came back
    wait_until(lambda: uploaded(b) == acked + 1, timeout=60, what="everything uploaded")
    fig = b.stats()["upload"]
    assert fig["mark_unsaved"] >= 1
    assert sum(MARK_WARNING in line for line in b.logs) == fig["mark_unsaved"]
    assert b.wait_log(lambda line: "the uploaded mark" in line and "written again" in line)
    assert (small / "data" / "log" / "uploaded").read_text().strip().endswith(f"{acked + 1}}}")
    assert landed_offsets(landing) == list(range(acked + 1))
    b.stop()
