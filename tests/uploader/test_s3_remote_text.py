"""Text a store sends (a redirect's Location, an error's Code and Message) went as it was into
the uploader's last error: the broker's log, `inspect stats` and `upload status` wrote its
escape sequences to the terminal, at any length. Now such text is shown as it is only when
printable and short; else escaped (its repr) and cut."""

from __future__ import annotations

import re

import pytest

import mqttraw
from conftest import run_cli
from edgebroker.upload_config import UploadConfig
from edgebroker.uploader.configure import open_sink
from edgebroker.uploader.sinks import PermanentSinkError

from .s3odd import OddStore
from .test_s3_answers import first_put_answered
from .test_s3_link import s3_upload
from .test_uploader import uploaded, wait_until

# What a terminal acts on: C0 controls but tab, DEL, C1 controls, line/paragraph separators.
CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
WHERE = "http://x/\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED"


def test_a_redirect_location_with_escapes_is_shown_escaped(broker):
    store = OddStore(first_put_answered(307, [("Location", WHERE)]))
    try:
        b = broker(upload=s3_upload(store))
        c = b.client("pub")
        c.send(mqttraw.publish("t", b"m", qos=1, packet_id=1))
        c.expect(mqttraw.PUBACK, timeout=10)
        c.close()
        wait_until(lambda: uploaded(b) == 1, timeout=20, what="the batch uploaded")
        failed = [line for line in b.logs if "upload failed" in line]
        assert len(failed) == 1 and f"redirected to {WHERE!r}: not followed" in failed[0], failed
        assert not CONTROLS.search(failed[0])
        fig = b.stats()["upload"]
        assert fig["last_error"] and f"{WHERE!r}" in fig["last_error"], fig
        for command in (["upload", "status"], ["inspect", "stats"]):
            r = run_cli(*command, "--data-dir", b.config["data_dir"])
            assert r.returncode == 0, r.stderr
            assert repr(WHERE) in r.stdout and "\x1b" not in r.stdout, (command, r.stdout)
            # (an error in the past: said so, with the uploads since)
            assert re.search(r"last error \dm\d\ds ago \(uploads succeeded since\): ",
                             r.stdout), r.stdout
    finally:
        store.close()


@pytest.mark.parametrize("code, message, shown_code, shown_message", [
    (b"AccessDenied", b"Access Denied", "AccessDenied", "Access Denied"),   # as they are
    # (XML has no ESC: a C1 CSI, U+009B, starts an escape sequence as well)
    ("Bad\u009b2J".encode(), "cut \u009b31m".encode() + b"x" * 300, repr("Bad\u009b2J"),
     repr(("cut \u009b31m" + "x" * 300)[:200]) + "..."),
    (b"C" * 100, b"M\xe2\x80\xa8", repr("C" * 64) + "...", repr("M\u2028")),
], ids=["plain", "escapes-and-long", "long-code-line-separator"])
def test_an_error_answers_code_and_message_are_shown_escaped_and_cut(
        tmp_path, code, message, shown_code, shown_message):
    body = b"<Error><Code>%s</Code><Message>%s</Message></Error>" % (code, message)
    store = OddStore(first_put_answered(403, [], body))
    try:
        batch = tmp_path / "batch"
        batch.write_bytes(b"x" * 10)
        sink = open_sink(UploadConfig(url="s3://landing/p", endpoint_url=store.url,
                                      access_key_id="AK", secret_access_key="SK"))
        with pytest.raises(PermanentSinkError) as info:
            sink.put("k.ebb.zst", str(batch), 10, lambda n: None)
        sink.close()
        text = str(info.value)
        assert text.endswith(f"PUT p/k.ebb.zst: 403 {shown_code} ({shown_message})"), text
        assert not CONTROLS.search(text) and len(text) < 500, text
    finally:
        store.close()
