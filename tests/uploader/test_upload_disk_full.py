"""The uploader on a full disk, for real (a private tmpfs; see tests/diskfull.py): a full state
disk does not jam it (the uploaded mark moves in memory, and its file is written and the held
publish acknowledged once there is room), a full upload directory is counted, said in the state
and logged once, in the broker and in ``upload run --once``, and so is a full landing disk."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import run_cli
from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs
from mqttraw import PUBACK, publish as publish_frame

from .test_uploader import landed_offsets, publish, upload_config, uploaded, wait_until

MARK_WARNING = "cannot write the uploaded mark"


def test_a_full_state_disk_does_not_jam_the_uploader(broker, tmp_path, request):
    """The landing folder is missing (not mounted yet) while another program's file fills the
    state disk and a publish waits for room. Nothing is deleted early for the full disk (a
    session's unacknowledged messages may be in it); once there is room again the held
    publish is acknowledged and every record lands once, the mark's file written."""
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "1536k")
    landing = tmp_path / "landing"
    b = broker(data_dir=str(small / "data"), log={"segment_bytes": 65536},
               upload=upload_config(landing, batch_bytes=16384, batch_max_age=1))
    pub = b.client("pub")
    n = 200
    for i in range(n):
        pub.send(publish_frame("t", os.urandom(1000), qos=1, packet_id=1 + i))
        pub.expect(PUBACK, timeout=10)
    filler = small / "filler"
    fill_up(filler)                          # another program takes the rest of the disk
    held = False
    for i in range(n, n + 3000):             # what room is left (the reserves) still takes
        pub.send(publish_frame("t", os.urandom(1000), qos=1, packet_id=1 + i))
        try:
            pub.expect(PUBACK, timeout=3)
        except TimeoutError:
            held = True
            break
        n += 1
    assert held, "the disk never filled up"
    assert b.wait_log(lambda line: "commit log cannot write" in line, timeout=10)
    landing.mkdir()
    b.admin("upload_resume")               # ends the back-off
    wait_until(lambda: b.stats()["upload"]["retries"] >= 1, timeout=30, what="a round")
    assert not any("deleted segment" in line for line in b.logs)   # nothing deleted early
    filler.unlink()                          # room again
    pub.expect(PUBACK, timeout=60)         # the held publish: written once room came back
    wait_until(lambda: uploaded(b) == n + 1, timeout=60, what="everything uploaded")
    fig = b.stats()["upload"]
    assert sum(MARK_WARNING in line for line in b.logs) == fig["mark_unsaved"]
    assert (small / "data" / "log" / "uploaded").read_text().strip().endswith(f"{n + 1}}}")
    assert landed_offsets(landing) == list(range(n + 1))
    b.stop()


def test_a_full_upload_directory_is_counted_said_and_logged_once(broker, tmp_path, request):
    """<state dir>/upload on a full file system: each failed round is counted in
    ``local_errors``, the state is ``local_error``, the error names the batch file, one warning
    (no traceback); once there is room every record lands."""
    if not in_private_mount_namespace(request):
        return
    data = tmp_path / "data"
    mount_tmpfs(data / "upload", "64k")
    landing = tmp_path / "landing"
    landing.mkdir()
    b = broker(data_dir=str(data), upload=upload_config(landing, batch_max_age=1),
               metrics={"listen": "127.0.0.1:0"})
    publish(b, 0, 100, size=2000, make=lambda i, size: os.urandom(size))
    fig = wait_until(lambda: (lambda f: f if f["local_errors"] >= 3 else None)(
        b.stats()["upload"]), what="failed rounds counted")
    spool = str(data / "upload" / "batch.ebb.zst.tmp")
    assert fig["state"] == "local_error" and fig["uploaded_offset"] == 0
    assert fig["last_error"].startswith(f"uploader: cannot write {spool} (the batch of ")
    assert "No space left on device" in fig["last_error"]
    assert sum(spool in line and "WARNING" in line for line in b.logs) == 1
    assert not [line for line in b.logs if "Traceback" in line]
    from core.test_metrics import METRICS_RE, scrape
    host, port = METRICS_RE.search(b.wait_log(METRICS_RE)).groups()
    wait_until(lambda: scrape(f"http://{host}:{port}/metrics").get(
        ("edgebroker_upload_local_errors_total", None), 0) >= 3, what="the metric")
    remount = subprocess.run(["mount", "-o", "remount,size=10m", str(data / "upload")],
                             capture_output=True, text=True)
    assert remount.returncode == 0, remount.stderr
    b.admin("upload_resume")              # ends the back-off
    wait_until(lambda: uploaded(b) == 100, what="everything uploaded once there is room")
    assert b.wait_log(lambda line: "the uploader's rounds work again" in line)
    assert landed_offsets(landing) == list(range(100))
    b.stop()


def test_run_once_on_a_full_upload_directory_says_which_file_in_one_line(broker, tmp_path,
                                                                       request):
    """``upload run --once`` whose batch file finds no room: exit status 1 and one
    ``edgebroker: ...`` line naming the file, no traceback; nothing is marked uploaded."""
    if not in_private_mount_namespace(request):
        return
    data = tmp_path / "data"
    b = broker(data_dir=str(data), log={"segment_bytes": 65536})    # no uploading
    publish(b, 0, 400, size=300, make=lambda i, size: os.urandom(size))
    b.stop()
    landing = tmp_path / "landing"
    landing.mkdir()
    config = tmp_path / "upload.toml"
    config.write_text(f'data_dir = "{data}"\n[log]\nsegment_bytes = 65536\n[upload]\n'
                      f'url = "file://{landing}"\ngateway_id = "gw-test"\n')
    mount_tmpfs(data / "upload", "16k")
    r = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
    spool = data / "upload" / "batch.ebb.zst.tmp"
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"edgebroker: uploader: cannot write {spool} (the batch of "), last
    assert "No space left on device" in last
    assert not (data / "log" / "uploaded").exists()


def test_run_once_with_an_upload_directory_it_cannot_make_says_so_in_one_line(broker,
                                                                              tmp_path):
    data = tmp_path / "data"
    b = broker(data_dir=str(data), log={"segment_bytes": 4096})    # no uploading
    publish(b, 0, 100)
    b.stop()
    (data / "upload").write_text("not a folder")
    config = tmp_path / "upload.toml"
    config.write_text(f'data_dir = "{data}"\n[log]\nsegment_bytes = 4096\n[upload]\n'
                      f'url = "file://{tmp_path}"\ngateway_id = "gw-test"\n')
    r = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == \
        f"edgebroker: upload run: {data / 'upload'}: File exists", r.stderr


def test_run_once_whose_uploaded_mark_finds_no_room_says_so_in_one_line(broker, tmp_path,
                                                                        request):
    """``upload run --once`` on a full state disk whose upload directory has room (its own
    file system): the batches land, but ``log/uploaded`` cannot be written, no reserve helps
    (it is on the other file system). It tries once more at the end, then exits 1 with one
    line naming the mark's file, rather than 0 with a mark held only in memory."""
    if not in_private_mount_namespace(request):
        return
    first = tmp_path / "first"
    b = broker(data_dir=str(first), log={"segment_bytes": 65536})    # no uploading
    publish(b, 0, 400, size=300, make=lambda i, size: os.urandom(size))
    b.stop()
    small = tmp_path / "small"
    mount_tmpfs(small, "1m")
    data = small / "data"
    shutil.copytree(first, data)
    mount_tmpfs(data / "upload", "4m")
    fill_up(small / "filler")                # the state disk is full; the upload folder is not
    landing = tmp_path / "landing"
    landing.mkdir()
    config = tmp_path / "upload.toml"
    config.write_text(f'data_dir = "{data}"\n[log]\nsegment_bytes = 65536\n[upload]\n'
                      f'url = "file://{landing}"\ngateway_id = "gw-test"\n')
    r = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
    mark = data / "log" / "uploaded"
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"edgebroker: uploader: cannot write {mark}: "), last
    assert "no room on its disk" in last, last
    assert landed_offsets(landing), "the batches landed all the same"
    assert not mark.exists()
    landed_first = landed_offsets(landing)
    (small / "filler").unlink()               # room again: the next run writes the mark
    r = run_cli("upload", "run", "--once", "-c", str(config), timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert mark.read_text().strip() == f'{{"uploaded_offset": {landed_first[-1] + 1}}}'
    assert landed_offsets(landing) == landed_first == list(range(len(landed_first)))


def test_a_full_landing_disk_is_logged_once_and_counted_at_each_retry(broker, tmp_path,
                                                                      request):
    """The `dir` sink's landing folder on a full file system: every retry fails the same way
    and is counted in ``retries``, but the error names the object's final path (not the
    temporary name, new at each try), so it is logged once; once there is room it lands."""
    if not in_private_mount_namespace(request):
        return
    landing = tmp_path / "landing"
    mount_tmpfs(landing, "256k")
    b = broker(data_dir=str(tmp_path / "data"),
               upload=upload_config(landing, batch_bytes=4096, batch_max_age=1))
    publish(b, 0, 20)
    wait_until(lambda: uploaded(b) == 20, what="the first batches")
    filler = landing / "filler"
    fill_up(filler)                          # the date folder exists; no room for an object
    publish(b, 20, 20)
    wait_until(lambda: b.admin("upload_resume") is not None          # ends each back-off
               and b.stats()["upload"]["retries"] >= 4, what="retries")
    fig = b.stats()["upload"]
    assert fig["uploaded_offset"] == 20 and not fig["alarm"]
    assert fig["last_error"].endswith(": No space left on device"), fig["last_error"]
    assert ".tmp" not in fig["last_error"], fig["last_error"]     # the object's own name
    assert f"cannot write {landing}/gateway=" in fig["last_error"], fig["last_error"]
    assert sum("upload failed" in line for line in b.logs) == 1, \
        [line for line in b.logs if "upload failed" in line]
    filler.unlink()
    b.admin("upload_resume")
    wait_until(lambda: uploaded(b) == 40, what="everything uploaded once there is room")
    assert landed_offsets(landing) == list(range(40))
    b.stop()
