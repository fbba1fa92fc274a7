"""What the remote sends meets the limits a client's PUBLISH meets: a topic with a control
character is dropped, counted (dropped, bridge_in) and logged once (a packet over the broker's
max_packet_size: test_bridge_oversized.py). On MQTT 5.0 the CONNECT tells
the remote the Maximum Packet Size and asks it to keep the session (Session Expiry
Interval)."""

from __future__ import annotations

import socket

import mqttraw as m
import mqttraw5 as m5

from .helpers import FakeRemote, bridge_table, figures, gateway_up, wait_figure

RULES = [{"pattern": "cmd/#", "direction": "in", "qos": 1}]
MAX_PACKET = 4096


def test_a_v5_connect_states_the_maximum_packet_size_and_the_session_expiry(broker):
    server = socket.create_server(("127.0.0.1", 0))
    try:
        broker(limits={"max_packet_size": MAX_PACKET},
               bridge=[bridge_table(server.getsockname()[1], RULES, protocol_version=5)])
        server.settimeout(10)
        conn, _ = server.accept()
        conn.settimeout(10)
        buf = bytearray()
        frames = []
        while not frames:
            data = conn.recv(65536)
            assert data, "closed before CONNECT"
            buf += data
            frames = m5.split_frames5(buf)
        connect = frames[0]
        assert connect.type == m.CONNECT and not connect.clean_start
        assert connect.properties[0x27] == MAX_PACKET            # Maximum Packet Size
        assert connect.properties[0x11] == 0xFFFFFFFF            # Session Expiry: never
        conn.close()
    finally:
        server.close()


def test_a_topic_with_a_control_character_is_dropped_and_counted(broker):
    remote = FakeRemote()
    try:
        gw, end, local = gateway_up(broker, remote, RULES, "cmd/#")
        for pid in (1, 2):
            end.send(m.publish("cmd/a\x01b", b"bad", qos=1, packet_id=pid))
            assert end.expect(m.PUBACK).packet_id == pid     # not wanted here: acknowledged
        end.send(m.publish("cmd/ok", b"good", qos=1, packet_id=3))
        assert end.expect(m.PUBACK).packet_id == 3
        assert local.recv_publish().payload == b"good"
        fig = figures(gw)
        assert (fig["received"], fig["received_dropped"]) == (1, 2)
        assert gw.stats()["dropped"]["bridge_in"] == 2
        lines = [ln for ln in gw.logs if "contains U+0001, a control character" in ln]
        assert len(lines) == 1 and "'cmd/a\\x01b'" in lines[0], lines
    finally:
        remote.close()


def test_a_topic_limit_refusing_a_remote_message_counts_as_that_limit_reached(broker):
    """As for a client's PUBLISH, a limit that refuses a message from the remote is counted
    under limit_hits (limits/<name>) besides the drop (bridge_in)."""
    remote = FakeRemote()
    try:
        gw = broker(limits={"max_topics_per_client": 2, "max_topic_levels": 4},
                    bridge=[bridge_table(remote.port, RULES)])
        end = remote.accept()
        wait_figure(gw, lambda f: f["state"] == "up")
        topics = ["cmd/1", "cmd/2", "cmd/3", "cmd/4", "cmd/a/b/c/d"]
        for pid, topic in enumerate(topics, 1):
            end.send(m.publish(topic, b"x", qos=1, packet_id=pid))
            assert end.expect(m.PUBACK).packet_id == pid
        stats = gw.stats()
        assert stats["dropped"]["bridge_in"] == 3
        assert stats["limit_hits"]["max_topics_per_client"] == 2      # cmd/3, cmd/4
        assert stats["limit_hits"]["max_topic_levels"] == 1           # five levels
    finally:
        remote.close()
