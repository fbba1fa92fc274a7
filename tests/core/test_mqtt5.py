"""MQTT 5.0 against a real broker with a real 5.0 client (paho-mqtt 2.x, ``MQTTv5``):
CONNACK properties, properties forwarded, subscription options and identifiers, topic
aliases, reason codes, session expiry (across a restart), wills, mixed 3.1.1 and 5.0."""

from __future__ import annotations

import queue
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

pytestmark = pytest.mark.timeout(60)


def props(kind, **values) -> Properties:
    p = Properties(kind)
    for name, value in values.items():
        setattr(p, name, value)
    return p


class V5:
    """A paho 5.0 client with its network loop in a thread, and events to wait on."""

    def __init__(self, port: int, client_id: str = "", clean_start: bool = True,
                 properties: Properties | None = None, will=None, will_properties=None):
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv5, reconnect_on_failure=False)
        self.messages: queue.Queue = queue.Queue()
        self.acks: dict[int, object] = {}
        self.cond = threading.Condition()
        self.connected = threading.Event()
        self.gone = threading.Event()
        self.disconnect_reason = None
        self.c.on_connect = self._on_connect
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_subscribe = self._on_ack
        self.c.on_unsubscribe = self._on_ack
        self.c.on_disconnect = self._on_disconnect
        if will is not None:
            self.c.will_set(*will, properties=will_properties)
        self.c.connect("127.0.0.1", port, clean_start=clean_start, properties=properties)
        self.c.loop_start()
        assert self.connected.wait(10), "no CONNACK"

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.reason = reason_code
        self.session_present = flags.session_present
        self.connack = properties
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnect_reason = reason_code
        self.disconnect_properties = properties
        self.gone.set()

    def _on_ack(self, client, userdata, mid, reason_codes, properties):
        with self.cond:
            self.acks[mid] = [rc.value for rc in reason_codes]
            self.cond.notify_all()

    def _wait(self, mid):
        with self.cond:
            assert self.cond.wait_for(lambda: mid in self.acks, 10), "no SUBACK/UNSUBACK"
            return self.acks.pop(mid)

    def subscribe(self, topic, qos=0, no_local=False, rap=False, handling=0, sub_id=None):
        options = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap,
                                   retainHandling=handling)
        p = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id) if sub_id else None
        rc, mid = self.c.subscribe(topic, options=options, properties=p)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait(mid)

    def unsubscribe(self, *topics):
        rc, mid = self.c.unsubscribe(list(topics))
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait(mid)

    def publish(self, topic, payload=b"", qos=0, retain=False, properties=None):
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(10)
        assert info.is_published()
        return info

    def get(self, timeout=5.0):
        return self.messages.get(timeout=timeout)

    def none(self, wait=0.3) -> bool:
        try:
            self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def disconnect(self, reason=0, properties=None):
        from paho.mqtt.reasoncodes import ReasonCode
        self.c.disconnect(ReasonCode(PacketTypes.DISCONNECT, identifier=reason),
                          properties=properties)
        self.gone.wait(5)
        self.c.loop_stop()

    def close(self):
        try:
            self.c.loop_stop()
            self.c.socket() and self.c.socket().close()
        except Exception:
            pass


@pytest.fixture
def v5():
    made = []

    def make(port, **kw):
        c = V5(port, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_connack_says_what_the_broker_offers(srv, v5):
    c = v5(srv.port)
    assert c.reason == 0
    got = c.connack
    assert got.TopicAliasMaximum == 10
    assert got.MaximumPacketSize == 1_048_576
    assert not hasattr(got, "SharedSubscriptionAvailable")   # 1, the default: available
    assert got.AssignedClientIdentifier.startswith("auto-")
    assert srv.wait_log(lambda line: "protocol 5, clean start 1, session expiry 0" in line)
    assert srv.client_row(got.AssignedClientIdentifier)["protocol"] == "5.0"


def test_properties_reach_a_5_0_subscriber_and_a_3_1_1_one_gets_the_message(srv, v5, paho, uid):
    sub = v5(srv.port, client_id=f"{uid}-s")
    assert sub.subscribe(f"{uid}/#", qos=1, sub_id=42) == [1]
    old = paho(srv.port, client_id=f"{uid}-old")
    assert old.subscribe(f"{uid}/#", 1) == [1]
    pub = v5(srv.port, client_id=f"{uid}-p")
    sent = props(PacketTypes.PUBLISH, UserProperty=[("b", "2"), ("a", "1"), ("b", "3")],
                 ContentType="application/json", ResponseTopic=f"{uid}/reply",
                 CorrelationData=b"\x00\x01req", PayloadFormatIndicator=1,
                 MessageExpiryInterval=120)
    pub.publish(f"{uid}/t", b'{"v": 1}', qos=1, properties=sent)
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == (f"{uid}/t", b'{"v": 1}', 1)
    p = m.properties
    assert p.UserProperty == [("b", "2"), ("a", "1"), ("b", "3")]   # in order, repeated
    assert p.ContentType == "application/json"
    assert p.ResponseTopic == f"{uid}/reply"
    assert p.CorrelationData == b"\x00\x01req"
    assert p.PayloadFormatIndicator == 1
    assert 118 <= p.MessageExpiryInterval <= 120                    # counted down
    assert p.SubscriptionIdentifier == [42]
    m3 = old.get()
    assert (m3.topic, m3.payload) == (f"{uid}/t", b'{"v": 1}')       # no properties in 3.1.1


def test_request_response_round_trip(srv, v5, uid):
    server = v5(srv.port, client_id=f"{uid}-server")
    server.subscribe(f"{uid}/req", qos=1)
    client = v5(srv.port, client_id=f"{uid}-client")
    client.subscribe(f"{uid}/resp/+", qos=1)
    client.publish(f"{uid}/req", b"2+2", qos=1, properties=props(
        PacketTypes.PUBLISH, ResponseTopic=f"{uid}/resp/1", CorrelationData=b"id-7"))
    req = server.get()
    server.publish(req.properties.ResponseTopic, b"4", qos=1, properties=props(
        PacketTypes.PUBLISH, CorrelationData=req.properties.CorrelationData))
    resp = client.get()
    assert (resp.topic, resp.payload, resp.properties.CorrelationData) == (
        f"{uid}/resp/1", b"4", b"id-7")


def test_overlapping_subscriptions_deliver_once_with_every_identifier(srv, v5, uid):
    sub = v5(srv.port, client_id=f"{uid}-s")
    sub.subscribe(f"{uid}/a/#", qos=0, sub_id=1)
    sub.subscribe(f"{uid}/+/b", qos=1, sub_id=2)
    pub = v5(srv.port)
    pub.publish(f"{uid}/a/b", b"x", qos=1)
    m = sub.get()
    assert m.qos == 1 and sorted(m.properties.SubscriptionIdentifier) == [1, 2]
    assert sub.none()


def test_no_local(srv, v5, uid):
    c = v5(srv.port, client_id=f"{uid}-c")
    c.subscribe(f"{uid}/t", qos=1, no_local=True)
    other = v5(srv.port, client_id=f"{uid}-o")
    c.publish(f"{uid}/t", b"mine", qos=1)
    other.publish(f"{uid}/t", b"theirs", qos=1)
    assert c.get().payload == b"theirs"
    assert c.none()


def test_retain_as_published_and_retain_handling(srv, v5, uid):
    pub = v5(srv.port)
    pub.publish(f"{uid}/r", b"kept", qos=1, retain=True)
    rap = v5(srv.port, client_id=f"{uid}-rap")
    rap.subscribe(f"{uid}/r", qos=1, rap=True, handling=2)     # 2: no retained message
    plain = v5(srv.port, client_id=f"{uid}-plain")
    plain.subscribe(f"{uid}/r", qos=1)                        # 0: the retained one, retain 1
    m = plain.get()
    assert (m.payload, m.retain) == (b"kept", True)
    assert rap.none()
    pub.publish(f"{uid}/r", b"live", qos=1, retain=True)
    assert (rap.get().payload, ) == (b"live", )
    live = plain.get()
    assert (live.payload, live.retain) == (b"live", False)    # live: retain 0 without RAP
    once = v5(srv.port, client_id=f"{uid}-once")
    once.subscribe(f"{uid}/r", qos=1, handling=1)              # 1: only for a new subscription
    assert once.get().payload == b"live"
    once.subscribe(f"{uid}/r", qos=1, handling=1)
    assert once.none()


def test_retain_as_published_keeps_the_flag_live(srv, v5, uid):
    rap = v5(srv.port, client_id=f"{uid}-rap")
    rap.subscribe(f"{uid}/r", qos=0, rap=True)
    v5(srv.port).publish(f"{uid}/r", b"x", qos=1, retain=True)
    assert rap.get().retain is True


def test_inbound_topic_alias(srv, v5, uid):
    sub = v5(srv.port)
    sub.subscribe(f"{uid}/long/topic/name", qos=1)
    pub = v5(srv.port)
    pub.publish(f"{uid}/long/topic/name", b"1", qos=1,
                properties=props(PacketTypes.PUBLISH, TopicAlias=3))
    pub.publish("", b"2", qos=1, properties=props(PacketTypes.PUBLISH, TopicAlias=3))
    assert [sub.get().payload, sub.get().payload] == [b"1", b"2"]
    assert pub.c.is_connected()


def test_topic_alias_above_the_maximum_gets_disconnect_0x94(srv, v5, uid):
    pub = v5(srv.port)
    pub.c.publish(f"{uid}/t", b"x", properties=props(PacketTypes.PUBLISH, TopicAlias=11))
    assert pub.gone.wait(5)
    assert pub.disconnect_reason.value == 0x94
    assert "above the Topic Alias Maximum (10)" in pub.disconnect_properties.ReasonString


def test_payload_format_invalid_gets_puback_0x99(srv, v5, uid):
    c = v5(srv.port)
    acks = []
    c.c.on_publish = lambda client, userdata, mid, rc, p: acks.append(rc.value)
    c.publish(f"{uid}/t", b"\xff\xfe", qos=1,
              properties=props(PacketTypes.PUBLISH, PayloadFormatIndicator=1))
    assert acks == [0x99]
    assert srv.stats()["dropped"]["payload_format"] >= 1


def test_unsubscribe_reason_codes(srv, v5, uid):
    c = v5(srv.port)
    c.subscribe(f"{uid}/a")
    c.subscribe(f"$share/g/{uid}/a", qos=1)
    assert c.unsubscribe(f"{uid}/a", f"{uid}/never", f"$share/g/{uid}/a",
                         f"$share/h/{uid}/a") == [0x00, 0x11, 0x00, 0x11]


def test_authentication_method_is_refused_with_0x8c(srv, uid):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5,
                    reconnect_on_failure=False)
    got = threading.Event()
    codes = []
    c.on_connect = lambda *a: (codes.append(a[3].value), got.set())
    c.connect("127.0.0.1", srv.port, properties=props(
        PacketTypes.CONNECT, AuthenticationMethod="SCRAM-SHA-1"))
    c.loop_start()
    try:
        assert got.wait(10)
        assert codes == [0x8C]
    finally:
        c.loop_stop()


def test_session_expiry_keeps_the_session_across_a_restart(broker, v5, uid):
    b = broker()
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    c = v5(b.port, client_id=f"{uid}-s", clean_start=True, properties=expiry)
    c.subscribe(f"{uid}/t", qos=1)
    c.disconnect()
    v5(b.port).publish(f"{uid}/t", b"while away", qos=1)
    b.stop()
    b2 = broker(data_dir=str(b.workdir / "data"))
    back = v5(b2.port, client_id=f"{uid}-s", clean_start=False, properties=expiry)
    assert back.session_present
    assert back.get().payload == b"while away"


def test_session_expiry_0_ends_the_session_with_the_connection(srv, v5, uid):
    c = v5(srv.port, client_id=f"{uid}-s")
    c.subscribe(f"{uid}/t", qos=1)
    c.disconnect()
    again = v5(srv.port, client_id=f"{uid}-s", clean_start=False)
    assert not again.session_present


def test_disconnect_setting_expiry_after_0_is_a_protocol_error(srv, v5, uid):
    c = v5(srv.port, client_id=f"{uid}-s")
    mark = srv.mark()
    c.c.disconnect(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=60))
    assert srv.wait_log(lambda line: "MQTT-3.14.2-2" in line, start=mark)


def test_disconnect_with_will_publishes_it(srv, v5, paho, uid):
    watcher = paho(srv.port, client_id=f"{uid}-w")
    watcher.subscribe(f"{uid}/will", 1)
    c = v5(srv.port, client_id=f"{uid}-c", will=(f"{uid}/will", b"bye", 1),
           will_properties=props(PacketTypes.WILLMESSAGE, ContentType="text/plain"))
    c.disconnect(reason=0x04)
    assert watcher.get().payload == b"bye"
    quiet = v5(srv.port, client_id=f"{uid}-q", will=(f"{uid}/will", b"no", 1))
    quiet.disconnect()
    with pytest.raises(TimeoutError):
        watcher.get(timeout=0.5)


@pytest.mark.parametrize("reason", [0x80, 0x83, 0x93])
def test_disconnect_with_an_error_code_keeps_the_will(srv, v5, paho, uid, reason):
    """MQTT-3.1.2-8, 3.14.4: only 0x00 (Normal disconnection) deletes the will."""
    watcher = paho(srv.port, client_id=f"{uid}-w")
    watcher.subscribe(f"{uid}/will", 1)
    c = v5(srv.port, client_id=f"{uid}-c", will=(f"{uid}/will", b"bye", 1))
    c.disconnect(reason=reason)
    assert watcher.get().payload == b"bye"


def test_will_properties_are_forwarded(srv, v5, uid):
    watcher = v5(srv.port)
    watcher.subscribe(f"{uid}/will", qos=1)
    c = v5(srv.port, client_id=f"{uid}-c", will=(f"{uid}/will", b"bye", 1),
           will_properties=props(PacketTypes.WILLMESSAGE, ContentType="text/plain",
                                 UserProperty=[("why", "test")]))
    c.disconnect(reason=0x04)
    m = watcher.get()
    assert m.properties.ContentType == "text/plain"
    assert m.properties.UserProperty == [("why", "test")]


def test_session_taken_over_gets_disconnect_0x8e(srv, v5, uid):
    first = v5(srv.port, client_id=f"{uid}-c")
    v5(srv.port, client_id=f"{uid}-c")
    assert first.gone.wait(5)
    assert first.disconnect_reason.value == 0x8E
