"""MQTT 3.1.1 packet-form rules enforced by the broker, checked over the wire with raw bytes.

Every rule here is a server-side MUST of the 3.1.1 specification (section numbers in the
docstrings). A violation must close the network connection; where the specification says a
CONNACK with a return code comes first, that is checked too.
"""

import struct

import pytest

import mqttraw as m
import mqttraw5 as R
from mqttraw import CONNACK, PINGRESP, PUBLISH, SUBACK, UNSUBACK


def assert_closed_without_accept(c, timeout=5.0):
    assert c.expect_closed(timeout), "server did not close the connection"
    accepted = [p for p in c.before_close if p.type == CONNACK and p.rc == 0]
    assert not accepted, f"server accepted the connection first: {c.before_close}"


def assert_closed(c, timeout=5.0):
    assert c.expect_closed(timeout), f"server did not close the connection (got {c.before_close})"


# ---------------------------------------------------------------------------------------------
# CONNECT (section 3.1)
# ---------------------------------------------------------------------------------------------

def test_connect_v311_accepted(srv, uid):
    c = srv.raw()
    ack = c.connect(uid)
    assert (ack.rc, ack.session_present, ack.ack_flags) == (0, False, 0)
    assert c.ping() == []


def test_connect_v31_mqisdp_accepted(srv, uid):
    c = srv.raw()
    ack = c.connect(uid[:23], proto_name=b"MQIsdp", level=3)
    assert ack.rc == 0
    assert c.ping() == []


def test_connect_v31_resumed_session_gets_no_session_present_flag(srv, uid):
    """MQTT 3.1 has no session present flag (the byte is reserved): 0 even when a session
    resumes, as Mosquitto sends; a 3.1.1 client resuming gets 1."""
    for level, name, flags in ((3, b"MQIsdp", 0), (4, b"MQTT", 1)):
        cid = f"{uid}-{level}"
        first = srv.raw()
        first.connect(cid, clean=False, proto_name=name, level=level)
        first.disconnect()
        again = srv.raw()
        ack = again.connect(cid, clean=False, proto_name=name, level=level)
        assert (ack.rc, ack.ack_flags) == (0, flags)
        again.disconnect()


@pytest.mark.parametrize("level", [0, 2, 6, 255])
def test_unsupported_protocol_level_gets_rc1_then_close(srv, uid, level):
    """3.1.2.2 [MQTT-3.1.2-2]: CONNACK return code 0x01 then disconnect."""
    c = srv.raw()
    c.send(m.connect(uid, level=level))
    assert c.expect_closed(5), "server did not close the connection"
    assert [(p.type, p.rc) for p in c.before_close] == [(CONNACK, 1)], c.before_close


@pytest.mark.parametrize("name", [b"MQTX", b"mqtt", b"MQT", b"", b"MQTTT"])
def test_invalid_protocol_name_closes_without_connack(srv, uid, name):
    """3.1.2.1 [MQTT-3.1.2-1]: MAY disconnect without CONNACK; Mosquitto does, and so must we."""
    c = srv.raw()
    c.send(m.connect(uid, proto_name=name))
    assert c.expect_closed(5)
    assert c.before_close == [], c.before_close


def test_connect_reserved_flag_bit_closes(srv, uid):
    """3.1.2.3 [MQTT-3.1.2-3]: the reserved connect flag must be 0."""
    c = srv.raw()
    c.send(m.connect(uid, flags_override=0x03))
    assert_closed_without_accept(c)


@pytest.mark.parametrize("hflags", [0x1, 0x2, 0x8])
def test_connect_fixed_header_flags_close(srv, uid, hflags):
    """2.2.2 [MQTT-2.2.2-2]: reserved fixed-header flags of CONNECT must be 0."""
    c = srv.raw()
    c.send(m.connect(uid, header_flags=hflags))
    assert_closed_without_accept(c)


@pytest.mark.parametrize("flags", [0x02 | 0x08, 0x02 | 0x10, 0x02 | 0x20], ids=["willqos1", "willqos2", "willretain"])
def test_will_qos_or_retain_without_will_flag_closes(srv, uid, flags):
    """3.1.2.5/3.1.2.6/3.1.2.7 [MQTT-3.1.2-11, -13, -15]."""
    c = srv.raw()
    c.send(m.connect(uid, flags_override=flags))
    assert_closed_without_accept(c)


def test_will_qos_3_closes(srv, uid):
    """3.1.2.6 [MQTT-3.1.2-14]."""
    c = srv.raw()
    c.send(m.connect(uid, will=(f"{uid}/will", b"x", 3)))
    assert_closed_without_accept(c)


def test_password_without_username_closes(srv, uid):
    """3.1.2.9 [MQTT-3.1.2-22]: password flag set with user name flag 0."""
    c = srv.raw()
    body = m.mqtt_str(b"MQTT") + bytes([4, 0x02 | 0x40]) + struct.pack("!H", 60) + m.mqtt_str(uid) + m.mqtt_str(b"pw")
    c.send(m.packet(m.CONNECT, 0, body))
    assert_closed_without_accept(c)


def test_username_and_password_accepted_without_auth(srv, uid):
    c = srv.raw()
    assert c.connect(uid, username="user", password=b"\x00\xffbinary").rc == 0
    assert c.ping() == []


BAD_UTF8 = [b"\xff\xfe", b"a\xed\xa0\x80b", b"\xc0\xaf", b"\xe2\x82", b"a\x00b"]
BAD_UTF8_IDS = ["ff", "surrogate", "overlong", "truncated", "nul"]


@pytest.mark.parametrize("cid", BAD_UTF8, ids=BAD_UTF8_IDS)
def test_client_id_bad_utf8_or_nul_closes(srv, cid):
    """1.5.3 [MQTT-1.5.3-1, -2]: ill-formed UTF-8 or U+0000 -> close."""
    c = srv.raw()
    c.send(m.connect(cid))
    assert_closed_without_accept(c)


@pytest.mark.parametrize("name", BAD_UTF8, ids=BAD_UTF8_IDS)
def test_username_bad_utf8_or_nul_closes(srv, uid, name):
    c = srv.raw()
    c.send(m.connect(uid, username=name))
    assert_closed_without_accept(c)


@pytest.mark.parametrize("topic", [b"a/\xff", b"a\x00b", b"a/+", b"#", b""], ids=["badutf8", "nul", "plus", "hash", "empty"])
def test_bad_will_topic_closes(srv, uid, topic):
    """3.1.3.3: the will topic is a topic name (UTF-8, no wildcards, not empty)."""
    c = srv.raw()
    c.send(m.connect(uid, will=(topic, b"x", 0)))
    assert_closed_without_accept(c)


@pytest.mark.parametrize("topic", [b"a/+", b"#", b"", b"a" * 5000 + b"/+"],
                         ids=["plus", "hash", "empty", "long"])
def test_a_bad_will_topic_gets_connack_0x90_on_5_0(srv, uid, topic):
    """5.0 has a code for it (Table 3-1: 0x90 Topic Name invalid, "The Will Topic Name is not
    malformed, but is not accepted"); it came as 0x80 Unspecified error, logged as a "topic
    name". A long one is shown by its first 200 characters (it was logged whole)."""
    mark = srv.mark()
    c = R.RawClient5(srv.host, srv.port)
    c.send(R.connect5(uid, will=(topic, b"x", 0)))
    ack = c.expect(R.CONNACK)
    assert ack.reason == 0x90, ack
    assert c.expect_closed()
    line = srv.wait_log(lambda ln: "protocol violation" in ln, start=mark)
    assert line and "will topic" in line and len(line) < 1000, line
    c.close()


@pytest.mark.parametrize("limit", [20, 4])
def test_the_connack_refusing_a_bad_connect_keeps_to_its_maximum_packet_size(srv, uid, limit):
    """MQTT-3.1.2-24: the refusing CONNACK of a CONNECT that broke the protocol (here its will
    topic) was sent with its Reason String whatever the client's Maximum Packet Size (69 bytes
    to a client of 8). The Reason String is left out; when even that does not fit (a 5.0
    CONNACK is 5 bytes), the connection closes without one."""
    mark = srv.mark()
    c = R.RawClient5(srv.host, srv.port)
    c.send(R.connect5(uid, will=(b"a/+", b"x", 0), props={R.MAXIMUM_PACKET_SIZE: limit}))
    assert c.expect_closed()
    line = srv.wait_log(lambda ln: "protocol violation: will topic" in ln, start=mark)
    if limit >= 5:
        [ack] = c.before_close
        assert ack.type == R.CONNACK and ack.reason == 0x90 and not ack.properties, ack
        assert 1 + 1 + len(ack.body) <= limit
        assert line and line.endswith("; CONNACK 0x90 and closing"), line
    else:
        assert c.before_close == []
        assert line and line.endswith("; closed: a CONNACK 0x90 would be larger than its "
                                      "Maximum Packet Size (4)"), line
    c.close()


def test_a_connect_whose_properties_cannot_be_read_gets_the_smallest_connack(srv, uid):
    """Its Maximum Packet Size is not known then (here Receive Maximum 0 breaks the section):
    the CONNACK goes without its Reason String, which a small limit could not take."""
    c = R.RawClient5(srv.host, srv.port)
    c.send(R.connect5(uid, props={R.MAXIMUM_PACKET_SIZE: 20, R.RECEIVE_MAXIMUM: 0}))
    assert c.expect_closed()
    [ack] = c.before_close
    assert ack.type == R.CONNACK and ack.reason >= 0x80 and not ack.properties, ack
    c.close()


# Control characters and non-characters (1.5.3: "SHOULD NOT"; a receiver MAY close, and
# Mosquitto does): (UTF-8 bytes, the code point the log line names).
DISCOURAGED = [(b"\x01", "U+0001"), (b"a\x1fb", "U+001F"), (b"\x7f", "U+007F"),
               (b"\xc2\x85", "U+0085"), (b"\xef\xb7\x90", "U+FDD0"), (b"\xef\xbf\xbf", "U+FFFF"),
               (b"\xf4\x8f\xbf\xbf", "U+10FFFF")]
DISCOURAGED_IDS = [name for _, name in DISCOURAGED]


def _closed_naming(srv, c, mark, code, accept=True):
    (assert_closed if accept else assert_closed_without_accept)(c)
    line = srv.wait_log(lambda ln: "protocol violation" in ln and code in ln, start=mark)
    assert line and "[MQTT-1.5.3]" in line, line


@pytest.mark.parametrize("text, code", DISCOURAGED, ids=DISCOURAGED_IDS)
@pytest.mark.parametrize("where", ["client id", "user name", "will topic"])
def test_connect_string_with_control_or_non_character_closes(srv, uid, text, code, where):
    mark = srv.mark()
    c = srv.raw()
    if where == "client id":
        c.send(m.connect(uid.encode() + text))
    elif where == "user name":
        c.send(m.connect(uid, username=b"u" + text))
    else:
        c.send(m.connect(uid, will=(f"{uid}/".encode() + text, b"x", 0)))
    _closed_naming(srv, c, mark, code, accept=False)


@pytest.mark.parametrize("text, code", DISCOURAGED, ids=DISCOURAGED_IDS)
@pytest.mark.parametrize("qos", [0, 1])
def test_publish_topic_with_control_or_non_character_closes(srv, uid, text, code, qos):
    mark = srv.mark()
    c = srv.client(uid)
    c.send(m.publish(f"{uid}/".encode() + text, b"x", qos=qos, packet_id=1 if qos else None))
    _closed_naming(srv, c, mark, code)


@pytest.mark.parametrize("text, code", DISCOURAGED, ids=DISCOURAGED_IDS)
def test_subscribe_filter_with_control_or_non_character_closes(srv, uid, text, code):
    mark = srv.mark()
    c = srv.client(uid)
    c.send(m.subscribe(1, [(f"{uid}/".encode() + text, 0)]))
    _closed_naming(srv, c, mark, code)


def test_other_unicode_in_topics_is_kept(srv, uid):
    """A byte order mark is kept, not stripped (MQTT-1.5.3-3); emoji and accents pass."""
    t = f"{uid}/\ufeffé/😀"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(t)
    srv.client(f"{uid}-p").publish(t, b"x", qos=1)
    assert sub.recv_publish().topic == t


def test_connect_truncated_string_closes(srv, uid):
    """A string length running past the end of the packet is malformed."""
    c = srv.raw()
    body = m.mqtt_str(b"MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + struct.pack("!H", 50) + b"short"
    c.send(m.packet(m.CONNECT, 0, body))
    assert_closed_without_accept(c)


def test_connect_missing_client_id_closes(srv):
    c = srv.raw()
    body = m.mqtt_str(b"MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60)
    c.send(m.packet(m.CONNECT, 0, body))
    assert_closed_without_accept(c)


def test_connect_trailing_bytes_closes(srv, uid):
    """Bytes after the last payload field the flags announce make the CONNECT malformed."""
    base = m.connect(uid)
    assert base[1] < 128
    c = srv.raw()
    c.send(m.packet(m.CONNECT, 0, base[2:] + b"xyz"))
    assert_closed_without_accept(c)


def test_client_id_longer_than_limit_gets_rc2(broker):
    b = broker(limits={"max_client_id_length": 23})  # the smallest the spec allows
    ok = b.raw()
    assert ok.connect("a" * 23).rc == 0
    c = b.raw()
    c.send(m.connect("a" * 24))
    assert c.expect_closed(5)
    assert [(p.type, p.rc) for p in c.before_close] == [(CONNACK, 2)]


def test_zero_length_client_id_clean_session_accepted_and_unique(srv):
    """3.1.3.1 [MQTT-3.1.3-6]: the server assigns a unique id; two such clients coexist."""
    a = srv.raw()
    assert a.connect("", clean=True).rc == 0
    b = srv.raw()
    assert b.connect("", clean=True).rc == 0
    assert a.ping() == [] and b.ping() == []


def test_zero_length_client_id_without_clean_session_gets_rc2(srv):
    """3.1.3.1 [MQTT-3.1.3-8]: CONNACK 0x02 then close."""
    c = srv.raw()
    c.send(m.connect("", clean=False))
    assert c.expect_closed(5)
    assert [(p.type, p.rc) for p in c.before_close] == [(CONNACK, 2)]


def test_zero_length_client_id_refused_when_disabled(broker):
    b = broker(allow_zero_length_clientid=False)
    c = b.raw()
    c.send(m.connect("", clean=True))
    assert c.expect_closed(5)
    assert [(p.type, p.rc) for p in c.before_close] == [(CONNACK, 2)]


@pytest.mark.parametrize("first", [
    m.pingreq(), m.publish("a/b", b"x"), m.subscribe(1, [("a", 0)]), m.disconnect(), m.puback(1),
], ids=["pingreq", "publish", "subscribe", "disconnect", "puback"])
def test_first_packet_not_connect_closes(srv, first):
    """3.1 [MQTT-3.1.0-1]."""
    c = srv.raw()
    c.send(first)
    assert c.expect_closed(5)
    assert c.before_close == []


def test_second_connect_closes(srv, uid):
    """3.1 [MQTT-3.1.0-2]."""
    c = srv.client(uid)
    c.send(m.connect(uid))
    assert_closed(c)
    assert not any(p.type == CONNACK for p in c.before_close)


@pytest.mark.parametrize("pkt", [m.connack(False, 0), m.suback(1, [0]), m.unsuback(1), m.pingresp()],
                         ids=["connack", "suback", "unsuback", "pingresp"])
def test_server_only_packets_from_client_close(srv, uid, pkt):
    c = srv.client(uid)
    c.send(pkt)
    assert_closed(c)


@pytest.mark.parametrize("first_byte", [0x00, 0xF0], ids=["type0", "type15"])
def test_reserved_packet_types_close(srv, uid, first_byte):
    """2.2.1: packet types 0 and 15 are reserved."""
    c = srv.client(uid)
    c.send(m.frame(first_byte, b"\x00"))
    assert_closed(c)


@pytest.mark.parametrize("pkt", [
    m.puback(1, flags=1), m.pubrec(1, flags=2), m.pubrel(1, flags=0), m.pubrel(1, flags=3),
    m.pubcomp(1, flags=8), m.subscribe(1, [("a", 0)], flags=0), m.subscribe(1, [("a", 0)], flags=3),
    m.unsubscribe(1, ["a"], flags=0), m.pingreq(flags=1), m.disconnect(flags=2),
], ids=["puback", "pubrec", "pubrel0", "pubrel3", "pubcomp", "subscribe0", "subscribe3",
        "unsubscribe0", "pingreq", "disconnect"])
def test_reserved_fixed_header_flags_close(srv, uid, pkt):
    """2.2.2 [MQTT-2.2.2-1, -2]: wrong flag bits -> close."""
    c = srv.client(uid)
    c.send(pkt)
    assert_closed(c)


# ---------------------------------------------------------------------------------------------
# PUBLISH (section 3.3)
# ---------------------------------------------------------------------------------------------

def test_publish_qos3_closes(srv, uid):
    """3.3.1.2 [MQTT-3.3.1-4]."""
    c = srv.client(uid)
    c.send(m.publish(f"{uid}/t", b"x", flags=0b0110, packet_id=1))
    assert_closed(c)


def test_publish_dup_with_qos0_closes(srv, uid):
    """3.3.1.1 [MQTT-3.3.1-2]: DUP must be 0 for QoS 0."""
    c = srv.client(uid)
    c.send(m.publish(f"{uid}/t", b"x", qos=0, dup=True))
    assert_closed(c)


@pytest.mark.parametrize("qos", [1, 2])
def test_publish_packet_id_zero_closes(srv, uid, qos):
    """2.3.1 [MQTT-2.3.1-1]: QoS > 0 needs a non-zero packet identifier."""
    c = srv.client(uid)
    c.send(m.publish(f"{uid}/t", b"x", qos=qos, packet_id=0))
    assert_closed(c)


@pytest.mark.parametrize("topic", ["a/+", "+", "a/#", "#", "a/+/b", "+/"], ids=lambda t: t.replace("/", "_"))
def test_publish_topic_with_wildcard_closes(srv, uid, topic):
    """3.3.2.1 [MQTT-3.3.2-2]."""
    c = srv.client(uid)
    c.send(m.publish(topic, b"x"))
    assert_closed(c)


@pytest.mark.parametrize("topic", [b"", b"a\x00b", b"a/\xff", b"a\xed\xa0\x80"], ids=["empty", "nul", "ff", "surrogate"])
def test_publish_bad_topic_closes(srv, uid, topic):
    """4.7.3 [MQTT-4.7.3-1], 1.5.3 [MQTT-1.5.3-1, -2]."""
    c = srv.client(uid)
    c.send(m.publish(topic, b"x"))
    assert_closed(c)


def test_publish_topic_length_past_end_closes(srv, uid):
    c = srv.client(uid)
    c.send(m.packet(PUBLISH, 0, struct.pack("!H", 40) + b"a/b"))
    assert_closed(c)


def test_publish_qos1_missing_packet_id_closes(srv, uid):
    c = srv.client(uid)
    c.send(m.packet(PUBLISH, 0x02, m.mqtt_str("a") + b"\x01"))
    assert_closed(c)


def test_publish_utf8_topic_roundtrip(srv, uid):
    topic = f"{uid}/ä/€/𝄞/ space"
    c = srv.client(uid)
    c.subscribe(topic)
    c.publish(topic, b"\x00\xff binary")
    p = c.recv_publish()
    assert (p.topic, p.payload) == (topic, b"\x00\xff binary")


# ---------------------------------------------------------------------------------------------
# SUBSCRIBE / UNSUBSCRIBE (sections 3.8, 3.10, 4.7)
# ---------------------------------------------------------------------------------------------

def test_subscribe_packet_id_zero_closes(srv, uid):
    c = srv.client(uid)
    c.send(m.subscribe(0, [(f"{uid}/a", 0)]))
    assert_closed(c)


def test_unsubscribe_packet_id_zero_closes(srv, uid):
    c = srv.client(uid)
    c.send(m.unsubscribe(0, [f"{uid}/a"]))
    assert_closed(c)


def test_empty_subscribe_closes(srv, uid):
    """3.8.3 [MQTT-3.8.3-3]: at least one topic filter."""
    c = srv.client(uid)
    c.send(m.subscribe(1, []))
    assert_closed(c)


def test_empty_unsubscribe_closes(srv, uid):
    """3.10.3 [MQTT-3.10.3-2]."""
    c = srv.client(uid)
    c.send(m.unsubscribe(1, []))
    assert_closed(c)


@pytest.mark.parametrize("qbyte", [3, 0x04, 0x80, 0xFF])
def test_subscribe_bad_requested_qos_closes(srv, uid, qbyte):
    """3.8.3.1 [MQTT-3-8.3-4]: QoS 3 or non-zero reserved bits -> close."""
    c = srv.client(uid)
    c.send(m.subscribe(1, [(f"{uid}/a", qbyte)]))
    assert_closed(c)
    assert not any(p.type == SUBACK for p in c.before_close), c.before_close


def test_subscribe_truncated_filter_closes(srv, uid):
    """A filter without its requested-QoS byte is malformed."""
    c = srv.client(uid)
    c.send(m.packet(m.SUBSCRIBE, 2, struct.pack("!H", 1) + m.mqtt_str("a/b")))
    assert_closed(c)


BAD_FILTERS = ["a/#/b", "a#", "a/b#", "#/a", "a+", "+a/b", "a/+b", "", "a/\x00", b"a/\xff"]


@pytest.mark.parametrize("flt", BAD_FILTERS, ids=lambda f: repr(f))
def test_malformed_topic_filter_closes(srv, uid, flt):
    """4.7.1 [MQTT-4.7.1-2, -3], 4.7.3 [MQTT-4.7.3-1]: a malformed filter is a protocol error."""
    c = srv.client(uid)
    c.send(m.subscribe(1, [(flt, 0)]))
    assert_closed(c)
    granted = [p for p in c.before_close if p.type == SUBACK and any(code != 0x80 for code in p.codes)]
    assert not granted, f"malformed filter {flt!r} was granted: {c.before_close}"


@pytest.mark.parametrize("flt", ["a/#/b", "a+", ""], ids=lambda f: repr(f))
def test_malformed_filter_in_unsubscribe_closes(srv, uid, flt):
    c = srv.client(uid)
    c.send(m.unsubscribe(1, [flt]))
    assert_closed(c)


def test_valid_unusual_filters_granted(srv, uid):
    filters = ["+", "#", "/", "//", "+/+", f"{uid}/+/#", "/#", "+/#", f"{uid}//+", "$SYS/#", "$x/+"]
    c = srv.client(uid)
    ack = c.subscribe(*[(f, q % 3) for q, f in enumerate(filters)])
    assert ack.codes == [q % 3 for q in range(len(filters))]


def test_subscribe_multiple_filters_suback_in_order(srv, uid):
    c = srv.client(uid)
    ack = c.subscribe((f"{uid}/a", 2), (f"{uid}/b", 0), (f"{uid}/c", 1))
    assert ack.codes == [2, 0, 1]


def test_unsubscribe_unknown_filter_still_acked(srv, uid):
    """3.10.4 [MQTT-3.10.4-5]: UNSUBACK even if nothing was deleted."""
    c = srv.client(uid)
    ack = c.unsubscribe(f"{uid}/never")
    assert ack.type == UNSUBACK


# ---------------------------------------------------------------------------------------------
# Framing (section 2.2.3) and size limits
# ---------------------------------------------------------------------------------------------

def test_remaining_length_over_four_bytes_closes(srv, uid):
    c = srv.client(uid)
    c.send(m.frame(0x30, b"\xff\xff\xff\xff\x7f"))
    assert_closed(c)


def test_remaining_length_over_four_bytes_before_connect_closes(srv):
    c = srv.raw()
    c.send(m.frame(0x10, b"\x80\x80\x80\x80\x01"))
    assert c.expect_closed(5)
    assert c.before_close == []


@pytest.mark.parametrize("pkt", [
    m.packet(m.PUBACK, 0, b"\x00\x01\x00"), m.packet(m.PUBACK, 0, b"\x00"),
    m.packet(m.PINGREQ, 0, b"\x00"), m.packet(m.DISCONNECT, 0, b"\x00"),
    m.packet(m.PUBREL, 2, b"\x00\x01\x00"),
], ids=["puback3", "puback1", "pingreq1", "disconnect1", "pubrel3"])
def test_wrong_fixed_length_packets_close(srv, uid, pkt):
    c = srv.client(uid)
    c.send(pkt)
    assert_closed(c)


def test_packet_over_max_packet_size_closes(broker, uid):
    b = broker(limits={"max_packet_size": 1024})
    c = b.client(uid)
    c.subscribe(f"{uid}/t")
    c.publish(f"{uid}/t", b"y" * 900)
    assert len(c.recv_publish().payload) == 900
    c.send(m.publish(f"{uid}/t", b"x" * 2000))
    assert_closed(c)


def test_oversized_connect_closes(broker):
    b = broker(limits={"max_packet_size": 256})
    c = b.raw()
    c.send(m.connect("x" * 1000))
    assert_closed_without_accept(c)


def test_oversized_packet_refused_from_header_alone(broker, uid):
    """The limit is applied to the announced remaining length, before the body arrives."""
    b = broker(limits={"max_packet_size": 1024})
    c = b.client(uid)
    c.send(m.frame(0x30, m.varint(10_000_000)) + m.mqtt_str("t"))
    assert_closed(c)


def test_connect_sent_byte_by_byte(srv, uid):
    c = srv.raw()
    c.send_slowly(m.connect(uid, keepalive=30))
    assert c.expect(CONNACK).rc == 0


def test_many_packets_in_one_write(srv, uid):
    t = f"{uid}/t"
    c = srv.raw()
    c.send(m.connect(uid) + m.subscribe(1, [(t, 1)]) + m.publish(t, b"one", qos=1, packet_id=2)
           + m.publish(t, b"two") + m.pingreq())
    got = [c.recv_packet() for _ in range(6)]
    kinds = [p.type for p in got]
    assert kinds[:2] == [CONNACK, SUBACK], got
    assert sorted(kinds[2:]) == sorted([m.PUBACK, PUBLISH, PUBLISH, PINGRESP]), got
    assert [p.payload for p in got if p.type == PUBLISH] == [b"one", b"two"]
    assert [p.packet_id for p in got if p.type == m.PUBACK] == [2]


def test_publish_split_inside_remaining_length(srv, uid):
    t = f"{uid}/t"
    c = srv.client(uid)
    c.subscribe(t)
    data = m.publish(t, b"z" * 300)
    assert data[1] & 0x80  # two-byte remaining length
    c.send(data[:2])
    assert not c.expect_closed(0.3), "server closed on a partial remaining length"
    c.send(data[2:50])
    assert not c.expect_closed(0.3), "server closed on a partial packet"
    c.send(data[50:])
    p = c.recv_publish()
    assert p.payload == b"z" * 300


def test_four_byte_remaining_length_delivered(broker, uid):
    b = broker(limits={"max_packet_size": 3_000_000})
    t = f"{uid}/big"
    sub = b.client(uid + "s")
    sub.subscribe(t, qos=1)
    pub = b.client(uid + "p")
    payload = bytes(range(256)) * 8200  # 2,099,200 bytes -> remaining length needs 4 bytes
    data = m.publish(t, payload, qos=1, packet_id=9)
    assert data[1] & 0x80 and data[2] & 0x80 and data[3] & 0x80
    pub.send(data)
    pub.wait_for(lambda p: p.type == m.PUBACK and p.packet_id == 9, timeout=20)
    p = sub.recv_publish(timeout=20)
    assert p.payload == payload


def test_disconnect_closes_connection(srv, uid):
    c = srv.client(uid)
    c.send(m.disconnect())
    assert c.expect_closed(5)
    assert c.before_close == []


def test_violation_is_logged_with_client_id_and_address(srv, uid):
    cid = f"{uid}-violator"
    c = srv.client(cid)
    mark = srv.mark()
    port = c.local_port
    c.send(m.publish(f"{uid}/t", b"x", flags=0b0110, packet_id=1))
    assert_closed(c)
    line = srv.wait_log(lambda ln: cid in ln, timeout=5, start=mark)
    assert line is not None, f"no log line naming {cid}:\n" + "\n".join(srv.logs[mark:])
    lines = [ln for ln in srv.logs[mark:] if cid in ln]
    assert any("127.0.0.1" in ln and str(port) in ln and "MQTT-3.3.1-4" in ln for ln in lines), \
        f"no violation log line with the peer address 127.0.0.1:{port} and rule MQTT-3.3.1-4: {lines}"


def test_server_survives_garbage_and_keeps_serving(srv, uid):
    for junk in (b"\xff" * 64, b"\x10\xff\xff\xff\x7f"):
        c = srv.raw()
        c.send(junk)
        assert c.expect_closed(5)
    c = srv.raw()
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert c.read_until_closed(5).startswith(b"HTTP/1.1 400 ")  # docs/protocol.md
    ok = srv.client(uid)
    assert ok.ping() == []


def test_assigned_client_id_uses_auto_id_prefix(broker):
    b = broker(auto_id_prefix="zzprefix-")
    mark = b.mark()
    c = b.raw()
    assert c.connect("", clean=True).rc == 0
    assert b.wait_log(lambda ln: "zzprefix-" in ln, timeout=5, start=mark), \
        "assigned client id with the configured prefix not seen in the log"


def test_thousand_publishes_in_one_write(srv, uid):
    """The frame splitter handles many frames per read, and frames cut at any point."""
    t = f"{uid}/t"
    sub = srv.client(f"{uid}-s")
    sub.subscribe(t)
    pub = srv.client(f"{uid}-p")
    blob = b"".join(m.publish(t, str(i)) for i in range(1000))
    pub.send(blob)
    assert [int(sub.recv_publish().payload) for _ in range(1000)] == list(range(1000))


def test_zero_length_client_id_from_mqtt31_gets_rc2(srv):
    """MQTT 3.1 requires a client id of 1 to 23 characters: an empty one is identifier rejected."""
    c = srv.raw()
    c.send(m.connect("", clean=True, proto_name=b"MQIsdp", level=3))
    assert c.expect_closed(5)
    assert [(p.type, p.rc) for p in c.before_close] == [(CONNACK, 2)]


def test_whole_session_byte_by_byte(srv, uid):
    t = f"{uid}/t"
    c = srv.raw()
    c.send_slowly(m.connect(uid) + m.subscribe(1, [(t, 2)]) + m.publish(t, b"slow", qos=2, packet_id=2)
                  + m.pingreq())
    assert c.expect(CONNACK).rc == 0
    assert c.expect(SUBACK).codes == [2]
    got = [c.recv_packet() for _ in range(3)]
    assert sorted(p.type for p in got) == sorted([m.PUBREC, PUBLISH, PINGRESP]), got
    delivered = next(p for p in got if p.type == PUBLISH)
    assert (delivered.payload, delivered.qos) == (b"slow", 2)


# ---------------------------------------------------------------------------------------------
# Packets of one pass: a SUBSCRIBE or UNSUBSCRIBE after a PUBLISH, read together
# ---------------------------------------------------------------------------------------------

def _one_write(c, *frames) -> list:
    """Send the frames in one write (the broker reads them in one pass); what came back, up
    to the answer to a PINGREQ sent with them."""
    c.send(b"".join(frames) + m.pingreq())
    got = []
    while (p := c.recv_packet()).type != PINGRESP:
        got.append(p)
    return got


def test_a_publish_is_matched_against_the_subscriptions_as_they_were_when_it_arrived(srv, uid):
    """MQTT-3.3.5-1 and MQTT-3.3.1-8: the broker routes QoS 1/2 messages once their records
    are written, at the end of a pass; an UNSUBSCRIBE or SUBSCRIBE later in the same pass
    must not change which subscriptions take a message that came before it."""
    c = srv.client(uid)
    assert c.subscribe(f"{uid}/t", qos=1).codes == [1]
    got = _one_write(c, m.publish(f"{uid}/t", b"while subscribed", qos=1, packet_id=2),
                     m.unsubscribe(3, [f"{uid}/t"]))
    assert [(p.type, p.payload if p.type == PUBLISH else p.packet_id) for p in got] == [
        (m.PUBACK, 2), (PUBLISH, b"while subscribed"), (UNSUBACK, 3)]
    c.send(m.puback(got[1].packet_id))
    got = _one_write(c, m.publish(f"{uid}/u", b"before the subscription", qos=1, packet_id=4),
                     m.subscribe(5, [(f"{uid}/u", 1)]))
    assert [p.type for p in got] == [m.PUBACK, SUBACK]
    # A retained message, then a subscription to its topic: sent as retained (RETAIN 1).
    got = _one_write(c, m.publish(f"{uid}/r", b"state", qos=1, retain=True, packet_id=6),
                     m.subscribe(7, [(f"{uid}/r", 1)]))
    assert [(p.type, p.retain if p.type == PUBLISH else None) for p in got] == [
        (m.PUBACK, None), (SUBACK, None), (PUBLISH, True)]
    c.send(m.puback(got[2].packet_id) + m.publish(f"{uid}/r", b"", retain=True))
