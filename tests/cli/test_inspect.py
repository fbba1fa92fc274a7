"""`edgebroker inspect` end to end: the real command in a subprocess, on logs written by the
commit log (in this process, which keeps writing while the command runs where that matters)."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from commitlog.logutil import append_n, flip_byte, open_log, parse_segment, segment_files
from conftest import as_nobody, sigint_ignored
from edgebroker.cli.inspect import human_bytes

# Each test runs on the C helper and on its pure-Python twin, as the commit log's own tests do.
pytestmark = pytest.mark.usefixtures("native_backend")

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


def inspect(*args, env=None, cwd=REPO, drop_env=()) -> subprocess.CompletedProcess:
    environ = dict(os.environ, **(env or {}))
    for name in drop_env:
        environ.pop(name, None)
    return subprocess.run([sys.executable, "-m", "edgebroker", "inspect", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env=environ)


@pytest.fixture
def data_dir(tmp_path):
    """A data dir whose log holds 200 records in several segments; offsets 0..199."""
    log = open_log(tmp_path / "data" / "log", segment_bytes=4096)
    append_n(log, 200, start_ts=T0, step_ms=1000)
    log.write_pending()
    log.mark_uploaded(log.segments()[1].base_offset)
    log.close()
    return tmp_path / "data"


def test_segments(data_dir):
    r = inspect("segments", "--data-dir", str(data_dir), "--format", "json")
    assert r.returncode == 0, r.stderr
    segs = json.loads(r.stdout)
    assert segs[0]["base_offset"] == 0 and segs[-1]["last_offset"] == 199
    assert sum(s["records"] for s in segs) == 200
    assert [s["uploaded"] for s in segs[:2]] == [True, False]
    assert segs[0]["first_timestamp_ms"] == T0
    assert segs[0]["bytes"] == os.path.getsize(segment_files(data_dir / "log")[0])
    text = inspect("segments", "--data-dir", str(data_dir)).stdout
    lines = text.splitlines()
    assert lines[0].split() == ["BASE", "LAST", "RECORDS", "BYTES", "FIRST", "TIME", "LAST", "TIME",
                                "UPLOADED", "STATE"]
    assert "2023-11-14T22:13:20.000Z" in lines[1] and lines[1].split()[-2:] == ["yes", "sealed"]
    assert lines[len(segs)].split()[-1] == "active"
    assert lines[-1].startswith(f"{len(segs)} segments, 200 records")


def test_segments_index_bytes_are_the_index_files_sizes(data_dir, broker):
    """(ops5: the active segment's index_bytes was 0, its index file grown 64 KiB ahead left
    out of "on disk with indexes".) A log at rest, and one a running broker has open."""
    b = broker()
    publisher = b.client("pub")
    publisher.publish("a/b", "x", qos=1)         # (acknowledged: in the log)
    publisher.close()
    for data in (data_dir, Path(b.config["data_dir"])):
        r = inspect("segments", "--data-dir", str(data), "--format", "json")
        assert r.returncode == 0, r.stderr
        segs = json.loads(r.stdout)
        sizes = [os.path.getsize(s["path"].removesuffix(".seg") + ".idx") for s in segs]
        assert [s["index_bytes"] for s in segs] == sizes and segs[-1]["active"], segs
        assert sizes[-1] > 0
        total = sum(s["bytes"] + s["index_bytes"] for s in segs)
        last = inspect("segments", "--data-dir", str(data)).stdout.splitlines()[-1]
        assert last.endswith(f"records, {human_bytes(total)} on disk with indexes"), last


def test_topics(data_dir):
    r = inspect("topics", "--data-dir", str(data_dir), "--format", "json")
    topics = {t["topic"]: t for t in json.loads(r.stdout)}
    assert sorted(topics) == sorted({f"site/{i % 3}/sensor/{i % 5}" for i in range(200)})
    t = topics["site/1/sensor/2"]
    members = [i for i in range(200) if i % 3 == 1 and i % 5 == 2]
    assert t["messages"] == len(members)
    assert t["last_timestamp_ms"] == T0 + members[-1] * 1000
    r = inspect("topics", "--data-dir", str(data_dir), "--filter", "site/2/#")
    assert r.returncode == 0
    assert [ln.split()[0] for ln in r.stdout.splitlines()[1:-1]] == [
        f"site/2/sensor/{k}" for k in range(5)]


def test_tail_last_from_since_topic(data_dir):
    d = str(data_dir)
    out = inspect("tail", "--data-dir", d, "-n", "3").stdout.splitlines()
    assert [ln.split()[0] for ln in out] == ["197", "198", "199"]
    assert out[0].split()[1] == "2023-11-14T22:16:37.000Z"
    out = inspect("tail", "--data-dir", d, "--from", "195", "--format", "json").stdout.splitlines()
    assert [json.loads(ln)["offset"] for ln in out] == [195, 196, 197, 198, 199]
    out = inspect("tail", "--data-dir", d, "--since", "2023-11-14T22:16:35Z").stdout.splitlines()
    assert [ln.split()[0] for ln in out] == ["195", "196", "197", "198", "199"]
    out = inspect("tail", "--data-dir", d, "--since", str(T0 + 198_000)).stdout.splitlines()
    assert [ln.split()[0] for ln in out] == ["198", "199"]
    out = inspect("tail", "--data-dir", d, "--topic", "site/0/sensor/+", "-n", "2").stdout.splitlines()
    want = [i for i in range(200) if i % 3 == 0][-2:]
    assert [int(ln.split()[0]) for ln in out] == want
    assert all(" site/0/sensor/" in ln for ln in out)


def test_tail_since_an_age(tmp_path):
    log = open_log(tmp_path / "data" / "log")
    now = int(time.time() * 1000)
    for age_min in (30, 20, 5, 1):
        log.append(now - age_min * 60_000, 0, False, b"c", b"t", b"%d" % age_min)
    log.write_pending()
    log.close()
    out = inspect("tail", "--data-dir", str(tmp_path / "data"), "--since", "10m").stdout.splitlines()
    assert [ln.split()[-1] for ln in out] == ["5", "1"]


def test_tail_payload_rendering(tmp_path):
    log = open_log(tmp_path / "data" / "log")
    log.append(T0, 1, True, b"dev", b"bin", b"\x00\xff\x10")
    log.append(T0, 0, False, b"dev", b"txt", "héllo\nworld".encode())
    log.append(T0, 0, False, b"dev", b"long", b"x" * 500)
    # controls a terminal acts on, which json.dumps leaves raw: DEL, C1 (CSI, NEL), U+2028
    log.append(T0, 0, False, b"dev", b"ctl", "e:\x1b[2J d:\x7f c:\x9b2J n:\x85 l:\u2028.".encode())
    log.write_pending()
    log.close()
    d = str(tmp_path / "data")
    out = inspect("tail", "--data-dir", d, "--max-payload", "20").stdout.splitlines()
    assert out[0].endswith("q1 r bin [dev] 0x00ff10")
    assert out[1].endswith("txt [dev] héllo\\nworld")
    assert out[2].endswith("x" * 20 + "... (500 bytes)")
    out = inspect("tail", "--data-dir", d, "-n", "1").stdout.splitlines()
    assert out[0].endswith(r"ctl [dev] e:\u001b[2J d:\u007f c:\u009b2J n:\u0085 l:\u2028.")
    js = [json.loads(ln) for ln in inspect("tail", "--data-dir", d, "--format", "json").stdout.splitlines()]
    assert js[0]["payload_base64"] == "AP8Q" and "payload" not in js[0] and js[0]["retain"] is True
    assert js[1]["payload"] == "héllo\nworld"
    assert js[3]["payload"] == "e:\x1b[2J d:\x7f c:\x9b2J n:\x85 l:\u2028."


def test_tail_max_payload_below_0_is_a_usage_error(data_dir):
    """--max-payload -1 cut the last character of every payload (text[:-1])."""
    r = inspect("tail", "--data-dir", str(data_dir), "--max-payload", "-1")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("usage: edgebroker inspect tail ")
    assert r.stderr.rstrip().endswith(
        "edgebroker inspect tail: error: argument --max-payload: -1: must be 0 or more")
    r = inspect("tail", "--data-dir", str(data_dir), "--max-payload", "0", "-n", "1")
    assert r.returncode == 0 and "..." not in r.stdout, r.stderr


def test_tail_shows_properties_decoded(tmp_path):
    """A record with MQTT 5.0 properties (format version 2): named as in the specification,
    in the order stored, in text and json; one without shows none; property bytes that do
    not decode (they are stored as the core gave them) are shown as an error, not a crash."""
    from edgebroker.mqtt import properties as p
    stored = p.encode_body({p.PAYLOAD_FORMAT: 1, p.MESSAGE_EXPIRY: 3600,
                            p.CONTENT_TYPE: "text/plain", p.RESPONSE_TOPIC: "reply/dev",
                            p.CORRELATION_DATA: b"\x00\x01",
                            p.USER_PROPERTY: [("unit", "C"), ("unit", "K")]})
    log = open_log(tmp_path / "data" / "log")
    log.append(T0, 1, False, b"dev", b"a/b", b"21.5", stored)
    log.append(T0, 0, False, b"dev", b"a/b", b"22.0")
    log.append(T0, 0, False, b"dev", b"a/b", b"23.0", b"\x7f\x00")
    log.write_pending()
    log.close()
    d = str(tmp_path / "data")
    r = inspect("tail", "--data-dir", d)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].endswith(
        "q1 a/b [dev] {Payload Format Indicator: 1, Message Expiry Interval: 3600, "
        "Content Type: text/plain, Response Topic: reply/dev, Correlation Data: 0x0001, "
        "User Property: unit=C, User Property: unit=K} 21.5")
    assert out[1].endswith("a/b [dev] 22.0")
    assert "{2 bytes of properties do not decode: " in out[2] and "0x7f" in out[2]
    assert out[2].endswith("} 23.0")
    js = [json.loads(ln) for ln in inspect("tail", "--data-dir", d, "--format", "json").stdout.splitlines()]
    assert js[0]["properties"] == {
        "Payload Format Indicator": 1, "Message Expiry Interval": 3600,
        "Content Type": "text/plain", "Response Topic": "reply/dev", "Correlation Data": "AAE=",
        "User Property": [["unit", "C"], ["unit", "K"]]}
    assert list(js[0]["properties"]) == ["Payload Format Indicator", "Message Expiry Interval",
                                         "Content Type", "Response Topic", "Correlation Data",
                                         "User Property"]
    assert "properties" not in js[1] and "properties_error" not in js[1]
    assert js[2]["properties_error"].startswith("2 bytes of properties do not decode: ")
    assert js[2]["payload"] == "23.0"


@contextmanager
def following(data_dir, sigint, *options):
    """``inspect tail --follow`` started with SIGINT set to ``sigint`` (SIG_DFL: Ctrl-C works;
    SIG_IGN: as a background job of a script, under nohup from one, or some CI runners), not
    whatever the test runner passed down; its stdout lines collect in ``proc.lines``."""
    proc = subprocess.Popen([sys.executable, "-m", "edgebroker", "inspect", "tail", "--data-dir",
                             str(data_dir), "--follow", "--format", "json",
                             *(options or ("-n", "2"))],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    proc.lines = []
    reader = threading.Thread(target=lambda: proc.lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)


def wait_lines(proc, n: int, deadline: float) -> None:
    while len(proc.lines) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(proc.lines) >= n, f"{len(proc.lines)} lines, expected {n}"


def test_tail_follow_while_a_writer_appends_and_rolls(tmp_path):
    log = open_log(tmp_path / "data" / "log", segment_bytes=4096)
    append_n(log, 5)
    log.write_pending()
    with closing(log), following(tmp_path / "data", signal.SIG_DFL) as proc:
        deadline = time.monotonic() + 20
        wait_lines(proc, 2, deadline)
        for _ in range(10):  # 150 more records, several rolls, while it follows
            append_n(log, 15)
            log.write_pending()
            time.sleep(0.1)
        wait_lines(proc, 152, deadline)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert [json.loads(ln)["offset"] for ln in proc.lines] == list(range(3, 155))


def test_tail_follow_stops_on_sigterm_where_sigint_is_ignored(tmp_path):
    """Started with SIGINT ignored, `tail --follow` could not be stopped but by SIGKILL;
    SIGTERM ends it cleanly (exit 0, every record printed)."""
    log = open_log(tmp_path / "data" / "log")
    append_n(log, 5)
    log.write_pending()
    with closing(log), following(tmp_path / "data", signal.SIG_IGN) as proc:
        deadline = time.monotonic() + 20
        wait_lines(proc, 2, deadline)
        assert sigint_ignored(proc.pid)
        proc.send_signal(signal.SIGINT)          # ignored: it goes on following
        append_n(log, 3)
        log.write_pending()
        wait_lines(proc, 5, deadline)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert [json.loads(ln)["offset"] for ln in proc.lines] == list(range(3, 8))
    assert proc.stderr.read() == ""


def test_tail_follow_from_past_the_head_starts_there(tmp_path):
    """`tail --from 10 --follow` on a log of 3 records printed 3..11 as they came: the start
    was forgotten once the first read found nothing."""
    log = open_log(tmp_path / "data" / "log")
    append_n(log, 3)
    log.write_pending()
    with closing(log), following(tmp_path / "data", signal.SIG_DFL, "--from", "10") as proc:
        deadline = time.monotonic() + 20
        while not reading_log(proc.pid, tmp_path / "data" / "log"):   # its first read done
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        append_n(log, 9)                         # offsets 3..11
        log.write_pending()
        wait_lines(proc, 2, time.monotonic() + 20)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert [json.loads(ln)["offset"] for ln in proc.lines] == [10, 11]


def reading_log(pid: int, log_dir: Path) -> bool:
    """The process has a file of ``log_dir`` open (the log is open: its first read is done
    or under way, before any output)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(log_dir)):
                return True
        except OSError:
            pass
    return False


def test_tail_cut_short_exits_130(tmp_path):
    """`tail` without --follow stopped by SIGTERM part way (here: writing to a full pipe)
    exited 0, as if the dump were whole."""
    log = open_log(tmp_path / "data" / "log")
    append_n(log, 5000)
    log.write_pending()
    log.close()
    proc = subprocess.Popen([sys.executable, "-m", "edgebroker", "inspect", "tail", "--data-dir",
                             str(tmp_path / "data"), "-n", "5000"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline()            # started; the pipe then fills, unread
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert out.count(b"\n") < 4999
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_state_directory_the_user_cannot_enter_is_said_so(tmp_path):
    """Run as a user who cannot enter the state directory, segments/tail/topics/verify said
    "no commit log at ... (use --data-dir)"."""
    log = open_log(tmp_path / "data" / "log")
    append_n(log, 1)
    log.write_pending()
    log.close()
    os.chmod(tmp_path, 0o700)
    for command in ("segments", "tail", "topics", "verify"):
        r = subprocess.run([*as_nobody(), sys.executable, "-m", "edgebroker", "inspect", command,
                            "--data-dir", str(tmp_path / "data")], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr.strip().splitlines()[-1]) == (
            1, f"edgebroker: cannot read the commit log at {tmp_path / 'data' / 'log'}: "
               f"Permission denied"), (command, r.stderr)


def test_verify_ok_and_progress_on_a_terminal(data_dir):
    r = inspect("verify", "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "200 records" in r.stdout and r.stdout.rstrip().endswith(": OK")
    assert "verifying [" not in r.stderr  # not a terminal: no progress bar
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "edgebroker", "inspect", "verify", "--data-dir",
                            str(data_dir)], cwd=REPO, stdout=subprocess.PIPE, stderr=slave,
                           timeout=60)
        os.close(slave)
        tty_output = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            tty_output += chunk
    finally:
        os.close(master)
    assert p.returncode == 0
    assert b"verifying [" in tty_output and b"100.0%" in tty_output


def test_verify_reports_damage_and_exits_1(data_dir):
    seg = segment_files(data_dir / "log")[1]
    victim = parse_segment(seg)[4]
    flip_byte(seg, victim["payload_position"] - 2)
    r = inspect("verify", "--data-dir", str(data_dir))
    assert r.returncode == 1
    damage = [ln for ln in r.stdout.splitlines() if ln.startswith("DAMAGE")]
    assert len(damage) == 1
    assert str(seg) in damage[0] and f"offset {victim['offset']}" in damage[0]
    assert "DAMAGED: 1 region(s) cannot be read" in r.stdout
    js = json.loads(inspect("verify", "--data-dir", str(data_dir), "--format", "json").stdout)
    assert js["ok"] is False and js["damage"][0]["offset"] == victim["offset"]
    assert js["records"] == 199


def test_verify_notes_an_incomplete_tail_and_index_problems_without_failing(data_dir):
    segs = segment_files(data_dir / "log")
    with open(segs[-1], "ab") as fh:
        fh.write(b"\x00" * 40)
    idx = segs[0].with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:-16])
    r = inspect("verify", "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stdout
    assert any(ln.startswith("note") and "incomplete tail" in ln for ln in r.stdout.splitlines())
    assert any(ln.startswith("index") and str(idx) in ln for ln in r.stdout.splitlines())
    # verify changed nothing
    assert idx.stat().st_size % 16 == 0 and segs[-1].read_bytes().endswith(b"\x00" * 40)


@pytest.mark.parametrize("case", ["stray", "middle", "last"])
def test_verify_counts_a_damaged_header_as_damage_but_in_the_last_segment(data_dir, case):
    """The open warns "segment header damaged" and verify printed OK, exit 0: for a stray
    zero-filled segment before the others (no readable record: left out of the list, the
    broker removes it at start) and for a segment with a flipped bit in its header (warned
    about at every start). Both are damage now (exit 1); a damaged header of the last
    segment, what a power cut after a roll leaves and the broker writes again at its next
    start, is a note, as a torn tail there."""
    segs = segment_files(data_dir / "log")
    if case == "stray":
        for path in (segs[0], segs[0].with_suffix(".idx")):
            path.unlink()               # retention deleted the first segment
        victim = segs[0]
        victim.write_bytes(bytes(4096))
    else:
        victim = segs[1] if case == "middle" else segs[-1]
        flip_byte(victim, 0)
    r = inspect("verify", "--data-dir", str(data_dir))
    lines = [ln for ln in r.stdout.splitlines() if str(victim) in ln]
    js = json.loads(inspect("verify", "--data-dir", str(data_dir), "--format", "json").stdout)
    if case == "last":
        assert r.returncode == 0 and r.stdout.endswith(": OK\n"), r.stdout
        assert len(lines) == 1 and lines[0].startswith("note") and "checksum" in lines[0]
        assert js["ok"] is True and js["header_notes"][0]["path"] == str(victim)
        return
    assert r.returncode == 1, r.stdout
    assert len(lines) == 1 and lines[0].startswith("DAMAGE"), r.stdout
    assert js["ok"] is False
    if case == "stray":
        assert "no readable record (offsets 0 to " in lines[0]
        assert "DAMAGED: 1 segment(s) with no readable record" in r.stdout
        assert js["unreadable"] == [{"path": str(victim), "from_offset": 0,
                                     "to_offset": int(segs[1].name[:20]) - 1}]
    else:
        assert "checksum" in lines[0] and "DAMAGED: 1 segment header(s) damaged" in r.stdout
        assert js["header_problems"][0]["path"] == str(victim)


def test_verify_while_a_writer_appends(tmp_path):
    log = open_log(tmp_path / "data" / "log", segment_bytes=8192)
    append_n(log, 200)
    log.write_pending()
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            append_n(log, 20)
            log.write_pending()
            time.sleep(0.005)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(3):
            r = inspect("verify", "--data-dir", str(tmp_path / "data"))
            assert r.returncode == 0, r.stdout + r.stderr
            assert "DAMAGE" not in r.stdout
    finally:
        stop.set()
        t.join()
        log.close()


def test_data_dir_defaults_like_serve(data_dir, tmp_path):
    r = inspect("segments", "--format", "json", env={"STATE_DIRECTORY": str(data_dir)})
    assert r.returncode == 0 and sum(s["records"] for s in json.loads(r.stdout)) == 200
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'data_dir = "{data_dir}"\n')
    r = inspect("segments", "-c", str(cfg), "--format", "json")
    assert r.returncode == 0, r.stderr
    (tmp_path / "edgebroker-data").symlink_to(data_dir)
    r = inspect("segments", "--format", "json", cwd=tmp_path, drop_env=["STATE_DIRECTORY"])
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) > 1


@pytest.mark.parametrize("args, code, message", [
    (["segments", "--data-dir", "/nonexistent/x"], 1, "no commit log at /nonexistent/x/log"),
    # usage errors found after parsing: exit 2, as argparse's
    (["tail", "--topic", "a/#/b"], 2, "--topic 'a/#/b'"),
    (["tail", "--since", "yesterday"], 2, "--since 'yesterday': expected ISO 8601"),
    (["tail", "-n", "-1"], 2, "--lines -1: must be 0 or more"),
    # it printed the whole log from offset 0, not the last 5
    (["tail", "--from", "-5"], 2, "--from -5: must be 0 or more (the last N records: -n N)"),
    (["topics", "--filter", "a+"], 2, "--filter 'a+'"),
])
def test_errors_are_one_clear_line(data_dir, args, code, message):
    if "--data-dir" not in args:
        args = args + ["--data-dir", str(data_dir)]
    r = inspect(*args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
