"""First-byte checks on an MQTT port (server/sniff.py): what a connection's first bytes are,
and the reply an HTTP client gets."""

import pytest

from edgebroker.server.sniff import HTTP_REPLY, classify_first_bytes


@pytest.mark.parametrize("head, kind", [
    (b"\x10", "mqtt"), (b"\x12\x00", "mqtt"), (b"\x16\x03\x01", "tls"),
    (b"GET / HTTP/1.1", "http"), (b"POST /x", "http"), (b"OPTIONS ", "http"),
    (b"G", None), (b"OPTIO", None), (b"GEX", "not_mqtt"), (b"\xff\xfe", "not_mqtt"),
    (b"\xc0\x00", "not_mqtt"), (b"OPTIONSX", "not_mqtt"),
])
def test_classify_first_bytes(head, kind):
    assert classify_first_bytes(head) == kind


def test_http_reply_is_one_line_400():
    head, _, body = HTTP_REPLY.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert body.count(b"\n") == 1 and b"MQTT port" in body
    assert f"Content-Length: {len(body)}".encode() in head
