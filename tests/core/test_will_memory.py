"""A 5.0 will's properties are kept encoded, as a PUBLISH's are: memory about their bytes on
the wire, for the connection's life and for a delayed will after it (kept decoded, a dict
with a tuple per User Property, they took ~14 times as much)."""

from __future__ import annotations

import psutil
import pytest

import mqttraw5 as R
from conftest import _open_clients

pytestmark = pytest.mark.timeout(120)

N = 20
EMPTY_USER_PROPERTY = b"\x26\x00\x00\x00\x00"      # User Property "" = ""
MANY = 78_000       # 390 KB: within the largest CONNECT before one is accepted (393,236 bytes)
WILL_DELAY_600 = b"\x18" + (600).to_bytes(4, "big")
EXPIRY_900 = b"\x02" + (900).to_bytes(4, "big")


def raw5(b, client_id, **kw) -> R.RawClient5:
    c = R.RawClient5(b.host, b.port)
    _open_clients.append(c)
    assert c.connect(client_id, timeout=15, **kw).reason == 0
    return c


def rss_mb(b) -> float:
    return psutil.Process(b.proc.pid).memory_info().rss / 2**20


def test_will_user_properties_cost_about_their_bytes_while_connected(broker, uid):
    """20 connections, each with a will of 78,000 empty User Properties (a 390 KB CONNECT):
    ~110 MB kept decoded, about 8 (their bytes) kept encoded. One is then published whole."""
    b = broker()
    watcher = raw5(b, f"{uid}-w")
    assert list(watcher.subscribe(f"{uid}/will", qos=1).codes) == [1]
    will = (f"{uid}/will", b"gone", 1, False, R.props_raw(EXPIRY_900
                                                          + EMPTY_USER_PROPERTY * MANY))
    before = rss_mb(b)
    clients = [raw5(b, f"{uid}-{i}", will=will) for i in range(N)]
    assert clients[-1].ping() == []
    grown = rss_mb(b) - before
    assert grown < N * 2, f"{grown:.1f} MB for {N} wills of {len(will[4]) >> 10} KB"
    clients[0].abort()
    p = watcher.wait_for(lambda p: p.type == R.PUBLISH, 15)
    assert p.payload == b"gone"
    assert p.properties[R.USER_PROPERTY] == [("", "")] * MANY
    assert 890 < p.properties[R.MESSAGE_EXPIRY] <= 900


def test_delayed_will_user_properties_cost_about_their_bytes_offline(broker, uid):
    """The same wills with a Will Delay Interval of 600 s, their clients gone: ~130 MB kept
    decoded for the 20 offline sessions, about 25 kept encoded (with the snapshot's copy)."""
    b = broker()
    will = (f"{uid}/will", b"", 1, False, R.props_raw(WILL_DELAY_600
                                                      + EMPTY_USER_PROPERTY * MANY))
    before = rss_mb(b)
    for i in range(N):
        c = raw5(b, f"{uid}-{i}", props={R.SESSION_EXPIRY: 600}, will=will)
        mark = b.mark()
        c.abort()
        assert b.wait_log(lambda ln: f"will of client '{uid}-{i}'" in ln
                          and "delayed 600 s" in ln, start=mark)
    grown = rss_mb(b) - before
    assert grown < N * 3, f"{grown:.1f} MB for {N} delayed wills of {len(will[4]) >> 10} KB"
