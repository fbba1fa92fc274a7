"""Under systemd, with stderr connected to the journal, each line starts with its sd-daemon
priority (``<3>`` error ... ``<7>`` debug), so that ``journalctl -p warning`` finds the
warnings; journald strips the prefix. Without it every line was stored at "info"."""

import os
import signal
import subprocess

from conftest import REPO, LineCollector, broker_command


def serve(args, tmp_path, journal: bool) -> tuple[subprocess.Popen, LineCollector]:
    """``edgebroker serve ARGS`` with stderr on a pipe; ``JOURNAL_STREAM`` names that pipe
    when ``journal`` (as systemd names its stream), another pipe otherwise."""
    r, w = os.pipe()
    other_r, other_w = os.pipe()
    named = w if journal else other_w
    st = os.fstat(named)
    env = dict(os.environ, PYTHONUNBUFFERED="1", JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    proc = subprocess.Popen([*broker_command(), "serve", *args], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=w)
    for fd in (w, other_r, other_w):
        os.close(fd)
    return proc, LineCollector(os.fdopen(r, errors="replace"))


def run_until_ready_and_stop(tmp_path, journal: bool) -> list[str]:
    proc, lines = serve(["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")],
                        tmp_path, journal)
    try:
        assert lines.wait("ready", 20) is not None, lines.text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, lines.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    lines.join(5)
    return lines.lines


def test_lines_on_the_journal_carry_their_priority(tmp_path):
    lines = run_until_ready_and_stop(tmp_path, journal=True)
    assert any(line.startswith("<6>INFO listening on 127.0.0.1:") for line in lines), lines
    assert any(line.startswith("<6>INFO edgebroker ") and line.endswith(" ready")
               for line in lines), lines
    assert all(line[:3] in ("<6>", "<7>", "<4>", "<3>") for line in lines), lines


def test_lines_elsewhere_have_no_priority(tmp_path):
    """``JOURNAL_STREAM`` left in the environment of a broker whose stderr goes elsewhere
    (a shell started from a unit, say): the usual lines with their time."""
    lines = run_until_ready_and_stop(tmp_path, journal=False)
    assert lines and not any(line.startswith("<") for line in lines), lines
    assert any(" INFO listening on 127.0.0.1:" in line and line[:2] == "20"
               for line in lines), lines


def test_config_errors_on_the_journal_are_errors(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}"\nlog_level = "bogus"\n')
    for journal, prefix in ((True, "<3>"), (False, "")):
        proc, lines = serve(["-c", str(config)], tmp_path, journal)
        assert proc.wait(15) == 2
        lines.join(5)
        assert lines.lines
        assert all(line.startswith(f"{prefix}edgebroker: config error: {config}: log_level:")
                   for line in lines.lines), lines.lines
