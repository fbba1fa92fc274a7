"""`edgebroker pub` and `edgebroker sub` as processes, against edgebroker and a real Mosquitto:
messages at QoS 0/1/2 (-m, -l, -f, -n, -r), -v/-N/-R/-C/-W/-E, refusals and their exit
codes (mosquitto's), TLS (--cafile) and -L URLs (mqtt://, ws://, wss://), and mosquitto_sub /
mosquitto_pub on the other end."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from certs import encrypted_copy, make_pki
from conftest import REPO, Proc, _start, _teardown, broker_command
from secfiles import write_passwords

TCP, TLS, WS, WSS, AUTH = range(5)
# The hint of a plain TCP link the server closed before its CONNACK (client/transport.py)
NO_CONNACK = ("(before the CONNACK: the server did not take the CONNECT; a TLS port (use "
              "mqtts://)? not an MQTT server? a CONNECT it found malformed?)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def csrv(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("cli")
    tls = {"certfile": str(pki.server.cert), "keyfile": str(pki.server.key)}
    pw = write_passwords(d / "pw", {"alice": "secret"})
    anonymous = {"allow_anonymous": True, "password_file": ""}
    b = _start(d, {"password_file": str(pw), "listener": [
        {"host": "127.0.0.1", "port": 0, **anonymous},
        {"host": "127.0.0.1", "port": 0, **tls, **anonymous},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", **anonymous},
        {"host": "127.0.0.1", "port": 0, "protocol": "websockets", **tls, **anonymous},
        {"host": "127.0.0.1", "port": 0},
    ]})
    yield b
    _teardown([b])


def port(b, i=TCP):
    return b.listeners[i][1]


def eb(*args, stdin: bytes | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([*broker_command(), *args], cwd=REPO, input=stdin,
                          capture_output=True, timeout=timeout)


def eb_sub(*args) -> Proc:
    """A running `edgebroker sub` whose output lines are collected."""
    return Proc(["stdbuf", "-oL", *broker_command(), "sub", *args])


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pub_to_sub_on_edgebroker(csrv, uid, qos):
    sub = eb_sub("-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/#", "-q", str(qos),
                 "-v", "-C", "3", "-i", f"{uid}-s", "-d")
    sub.wait_line("received SUBACK")
    r = eb("pub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/a", "-m", "one",
           "-q", str(qos))
    assert r.returncode == 0, r.stderr
    r = eb("pub", "-p", str(port(csrv)), "-h", "127.0.0.1", "-t", f"{uid}/b", "-l",
           "-q", str(qos), stdin=b"two\n\nthree\n")
    assert r.returncode == 0, r.stderr
    assert sub.wait() == 0
    printed = [ln for ln in sub.lines if not ln.startswith("Client ")]
    assert printed == [f"{uid}/a one", f"{uid}/b two", f"{uid}/b three"]


def test_retained_file_and_null_message(csrv, uid, tmp_path):
    body = bytes(range(256)) * 40
    (tmp_path / "body").write_bytes(body)
    r = eb("pub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/r", "-f",
           str(tmp_path / "body"), "-r", "-q", "1")
    assert r.returncode == 0, r.stderr
    r = eb("sub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/r", "-C", "1",
           "-N", "-W", "10")
    assert (r.returncode, r.stdout) == (0, body)
    # -R skips the retained message: nothing until -W
    r = eb("sub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/r", "-R",
           "-W", "0.5")
    assert (r.returncode, r.stdout, r.stderr) == (27, b"", b"Timed out\n")
    assert eb("pub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/r", "-n",
              "-r").returncode == 0
    r = eb("sub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", f"{uid}/r", "-W", "0.5")
    assert (r.returncode, r.stdout) == (27, b"")     # the retained message is cleared


def test_refusals_exit_with_the_connack_code(csrv, uid):
    args = ["-h", "127.0.0.1", "-p", str(port(csrv, AUTH)), "-t", f"{uid}/x", "-m", "m"]
    r = eb("pub", *args, "-u", "alice", "-P", "wrong")
    assert r.returncode == 4, r.stderr
    assert b"Connection Refused: bad user name or password" in r.stderr
    r = eb("pub", *args, "-V", "5")
    assert r.returncode == 0x87 and b"Not authorized" in r.stderr
    assert eb("pub", *args, "-u", "alice", "-P", "secret").returncode == 0
    r = eb("pub", "-h", "127.0.0.1", "-p", "1", "-t", "x", "-m", "m")
    assert r.returncode == 1 and b"Error: connect to 127.0.0.1:1: Connection refused" in r.stderr
    r = eb("pub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-t", "x/#", "-m", "m")
    assert r.returncode == 1 and b"wildcard" in r.stderr
    r = eb("sub", "-p", str(port(csrv)), "-c", "-t", "x")
    assert r.returncode == 2 and b"-c needs a client id" in r.stderr


def test_a_password_without_a_user_name_is_a_usage_error_over_3_1_and_3_1_1(csrv, uid):
    """-P without -u over 3.1/3.1.1 (MQTT-3.1.2-22: the server would close without a
    CONNACK): exit 2 with one line, and no connection is made (as mosquitto_pub refuses it
    before connecting). Over 5.0 a password alone is allowed and goes out."""
    words = ("CONNECT: password given without a user name: MQTT 3.1/3.1.1 do not allow it "
             "(MQTT-3.1.2-22; 5.0 does)")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        lport = listening.getsockname()[1]
        for tool, version in [("pub", "311"), ("pub", "31"), ("sub", "311"), ("sub", "31")]:
            extra = ["-m", "x"] if tool == "pub" else []
            r = eb(tool, "-h", "127.0.0.1", "-p", str(lport), "-V", version, "-P", "secret",
                   "-t", f"{uid}/pw", *extra, timeout=15)
            assert (r.returncode, r.stdout) == (2, b""), r.stderr
            assert r.stderr.decode() == f"edgebroker {tool}: {words}\n"
        listening.setblocking(False)
        with pytest.raises(BlockingIOError):
            listening.accept()                  # nobody connected
    r = eb("pub", "-h", "127.0.0.1", "-p", str(port(csrv)), "-V", "5", "-P", "secret",
           "-t", f"{uid}/pw", "-m", "x", "-q", "1")
    assert (r.returncode, r.stderr) == (0, b"")


def test_a_close_before_the_connack_names_the_usual_causes():
    """A server that reads the CONNECT and closes without a word (as a broker does with a
    CONNECT it finds malformed): the line does not blame TLS alone, it names the usual
    causes (a refusal, bad credentials included, would come as a CONNACK)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(10)

        def read_connect_and_close():
            peer, _ = listening.accept()
            with peer:
                peer.settimeout(10)
                assert peer.recv(1024)[0] == 0x10       # CONNECT

        t = threading.Thread(target=read_connect_and_close)
        t.start()
        r = eb("pub", "-h", "127.0.0.1", "-p", str(listening.getsockname()[1]), "-t", "a",
               "-m", "x", timeout=15)
        t.join(10)
    assert (r.returncode, r.stdout) == (1, b""), r.stderr
    assert r.stderr.decode() == f"Error: connection closed by the server {NO_CONNACK}\n"


def test_sub_w_ends_on_time_while_the_server_holds_back_its_connack():
    """`sub -W S` against a server that accepts and never answers: "Timed out", exit 27, S
    seconds after the connection was made (not S + 1: no lingering after a DISCONNECT when
    no CONNACK came, docs/client-cli.md)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(15)
        proc = subprocess.Popen([*broker_command(), "sub", "-h", "127.0.0.1", "-p",
                                 str(listening.getsockname()[1]), "-t", "a", "-W", "1"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            peer, _ = listening.accept()
            connected = time.monotonic()
            out, err = proc.communicate(timeout=15)
            ended = time.monotonic()
            peer.close()
        finally:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (27, b"", b"Timed out\n")
    assert ended - connected < 1.6          # it was 2 s: -W, then 1 s lingering


@pytest.mark.parametrize("tool, args, message", [
    ("pub", ["-L", "mqtt://[::1"], "pub: -L 'mqtt://[::1': not a URL (Invalid IPv6 URL)"),
    ("sub", ["-L", "mqtt://[::1/t"], "sub: -L 'mqtt://[::1/t': not a URL (Invalid IPv6 URL)"),
    ("pub", ["-L", "mqtt://h:99999/t"], "pub: -L 'mqtt://h:99999/t': the port is not a number "
                                        "from 0 to 65535"),
    ("sub", ["-L", "mqtt://h:x/t"], "sub: -L 'mqtt://h:x/t': the port is not a number"),
    ("pub", ["-L", "ftp://h/t"], "pub: -L 'ftp://h/t': unknown scheme ftp://"),
    ("sub", ["-L", "mqtt:///t"], "sub: -L 'mqtt:///t': no host"),
    ("pub", ["-t", "t", "-k", "70000"], "pub: -k 70000: the keepalive is 0 to 65535 seconds"),
    ("sub", ["-t", "t", "-k", "-1"], "sub: -k -1: the keepalive is 0 to 65535 seconds"),
    ("pub", ["-t", "t", "-p", "99999"], "pub: -p 99999: a port is 1 to 65535"),
    ("pub", ["-t", "t", "-M", "70000"], "pub: -M 70000: messages in flight are 1 to 65535"),
    ("pub", ["-t", "t", "-M", "0"], "pub: -M 0: messages in flight are 1 to 65535"),
    ("pub", ["-t", "t", "--will-topic", "a/#"],
     "pub: --will-topic: topic name 'a/#' contains a wildcard character [MQTT-4.7.1-1]"),
    ("sub", ["-t", "t", "--will-topic", "a/+/b"], "sub: --will-topic: topic name 'a/+/b' "
                                                  "contains a wildcard character"),
    ("pub", ["-t", "t", "--will-payload", "p"],
     "pub: will payload given, but no will topic given (--will-topic)"),
    ("sub", ["-t", "t", "--will-qos", "0", "--will-retain"],
     "sub: will QoS and retain given, but no will topic given (--will-topic)"),
    ("sub", ["-t", "t", "-T", "a/#/b"],
     "sub: -T: topic filter 'a/#/b': '#' must be the whole last level [MQTT-4.7.1-2]"),
    ("sub", ["-t", "t", "-T", "a/b+"], "sub: -T: topic filter 'a/b+': '+' must fill a whole"),
])
def test_option_values_no_connection_can_use_are_usage_errors(tool, args, message):
    """Exit 2 (docs/client-cli.md: usage errors) with one line, before connecting: nothing
    listens on port 1, so a connection attempt would say "Connection refused" instead."""
    extra = ["-m", "x"] if tool == "pub" else []
    port = [] if "-L" in args or "-p" in args else ["-p", "1"]
    r = eb(tool, "-h", "127.0.0.1", *port, *args, *extra, timeout=15)
    assert (r.returncode, r.stdout) == (2, b""), r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgebroker {message}"), r.stderr
    r = eb(tool, "-h", "127.0.0.1", *port, *args, *extra, "--quiet", timeout=15)
    assert (r.returncode, r.stderr) == (2, b"")


@pytest.mark.parametrize("scheme, listener", [("mqtts", TLS), ("ws", WS), ("wss", WSS)])
def test_url_schemes(csrv, pki, uid, scheme, listener):
    topic = f"{uid}/{scheme}"
    base = f"{scheme}://127.0.0.1:{port(csrv, listener)}"
    url = f"{base}/{topic}" if scheme == "mqtts" else base
    tls = ["--cafile", str(pki.ca.cert)] if scheme != "ws" else []
    topic_args = [] if scheme == "mqtts" else ["-t", topic]
    sub = eb_sub("-L", url, *topic_args, *tls, "-C", "1", "-d")
    sub.wait_line("received SUBACK")
    r = eb("pub", "-L", url, *topic_args, *tls, "-m", scheme, "-q", "1")
    assert r.returncode == 0, r.stderr
    assert sub.wait() == 0
    assert [ln for ln in sub.lines if not ln.startswith("Client ")] == [scheme]


def test_url_topic_is_everything_after_the_host_verbatim(csrv, uid):
    """`-L mqtt://host/TOPIC`: a '#' or '?' is the topic's (not a URL fragment or query) and
    '%' is not decoded, as mosquitto_pub/sub take it; a wildcard is refused by pub."""
    base = f"mqtt://127.0.0.1:{port(csrv)}"
    sub = eb_sub("-L", f"{base}/{uid}/#", "-v", "-C", "1", "-d")
    sub.wait_line("received SUBACK")
    r = eb("pub", "-L", f"{base}/{uid}/a?b%41", "-m", "q", "-q", "1")
    assert r.returncode == 0, r.stderr
    assert sub.wait() == 0
    assert [ln for ln in sub.lines if not ln.startswith("Client ")] == [f"{uid}/a?b%41 q"]
    r = eb("pub", "-L", f"{base}/{uid}/#", "-m", "q")
    assert r.returncode == 1 and b"wildcard" in r.stderr, r.stderr


def test_tls_port_with_cafile_and_the_wrong_ca(csrv, pki, uid):
    args = ["-h", "127.0.0.1", "-p", str(port(csrv, TLS)), "-t", f"{uid}/t", "-m", "x"]
    assert eb("pub", *args, "--cafile", str(pki.ca.cert)).returncode == 0
    r = eb("pub", *args, "--cafile", str(pki.other_ca.cert))
    assert r.returncode == 1 and b"CERTIFICATE_VERIFY_FAILED" in r.stderr
    assert eb("pub", *args, "--insecure").returncode == 0


def test_the_wrong_port_for_the_scheme_is_named(csrv, pki, uid):
    """MQTT to a WebSocket port (the server answers HTTP), MQTT to a TLS port (it resets the
    link at our CONNECT), TLS to an MQTT port (it closes at our ClientHello): each one line
    saying which, exit 1 (docs/client-cli.md, "Exit codes and messages")."""
    args = ["-h", "127.0.0.1", "-t", f"{uid}/t", "-m", "x"]
    for listener, extra, line in [
            (WS, [], "Error: the server answered with HTTP, not MQTT ('HTTP/1.1 400 Bad "
                     "Request'): a WebSocket port? use ws://"),
            (TLS, [], NO_CONNACK),
            (TCP, ["--cafile", str(pki.ca.cert)], "is it a TLS port? (mqtt:// ?)")]:
        r = eb("pub", *args, "-p", str(port(csrv, listener)), *extra)
        lines = r.stderr.decode().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert lines[0].startswith("Error: ") and lines[0].endswith(line), r.stderr


def test_pub_f_of_a_file_over_mqtts_largest_message_is_refused_unread(tmp_path):
    """A file larger than any PUBLISH can carry (256 MiB less the topic): one line, exit 1,
    before it is read (a sparse file: reading it would take 270 MB) and before connecting
    (port 1: nothing listens)."""
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(270_000_000)
    r = eb("pub", "-h", "127.0.0.1", "-p", "1", "-t", "big", "-q", "1", "-f", str(big),
           timeout=15)
    assert (r.returncode, r.stdout) == (1, b"")
    assert r.stderr.decode() == (f"Error: {big}: 270,000,000 bytes, over MQTT's largest "
                                 f"message: 268,435,448 bytes with this topic\n")


def test_an_encrypted_client_key_is_refused_without_asking(pki, tmp_path):
    """--key of a key with a pass phrase: OpenSSL asked on the terminal; now one line, exit 1,
    before connecting (port 1: nothing listens)."""
    key = encrypted_copy(pki.client.key, tmp_path / "client-enc.key")
    r = eb("pub", "-h", "127.0.0.1", "-p", "1", "-t", "t", "-m", "x", "--cafile",
           str(pki.ca.cert), "--cert", str(pki.client.cert), "--key", str(key), timeout=15)
    assert r.returncode == 1
    assert r.stderr.decode() == (f"Error: client certificate {pki.client.cert}: key {key}: the "
                                 f"private key is encrypted (edgebroker takes no pass phrase): "
                                 f"decrypt it with openssl pkey -in {key} -out PLAIN.key\n")


def test_against_mosquitto_with_its_own_tools(mosquitto_broker, mosq, uid):
    """edgebroker pub/sub against Mosquitto, with mosquitto_sub/mosquitto_pub on the other
    end, at QoS 1 and 2, 3.1.1 and 5.0."""
    mb = mosquitto_broker(persistence=False)
    msub = mosq("sub", mb.port, "-t", f"{uid}/#", "-v", "-q", "2", "-C", "2", "-d")
    msub.wait_line("SUBACK")
    for v, qos in (("311", "1"), ("5", "2")):
        r = eb("pub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/{v}", "-m", v,
               "-q", qos, "-V", v)
        assert r.returncode == 0, r.stderr
    assert msub.wait() == 0
    assert [ln for ln in msub.lines if ln.startswith(uid)] == [f"{uid}/311 311", f"{uid}/5 5"]
    sub = eb_sub("-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/m", "-q", "2",
                 "-V", "5", "-C", "2", "-d")
    sub.wait_line("received SUBACK")
    mosq("pub", mb.port, "-t", f"{uid}/m", "-m", "from-mosquitto", "-q", "2").wait()
    mosq("pub", mb.port, "-t", f"{uid}/m", "-m", "again", "-q", "1", "-V", "5").wait()
    assert sub.wait() == 0
    assert [ln for ln in sub.lines if not ln.startswith("Client ")] == ["from-mosquitto",
                                                                         "again"]
    r = eb("sub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/none", "-W", "0.3")
    assert r.returncode == 27


def test_mosquitto_refusal_codes(mosquitto_broker, uid, tmp_path):
    mb = mosquitto_broker(persistence=False, extra=["allow_anonymous false"])
    for v, code in (("311", 5), ("5", 135)):
        r = eb("pub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", "x", "-m", "y", "-V", v)
        assert r.returncode == code, r.stderr


@pytest.mark.parametrize("options, printed", [
    (["-v"], "{t} (null)\n{t} a\n{t} (null)\n"), ([], "a\n"), (["-v", "-N"], "{t} a"),
    (["-N"], "a"),
], ids=["v", "plain", "v-N", "N"])
def test_an_empty_payload_prints_as_mosquitto_sub_prints_it(mosquitto_broker, mosq, uid,
                                                            options, printed):
    """Empty, "a", empty to a topic: `edgebroker sub` prints byte for byte what mosquitto_sub
    2.0 prints (-v: "topic (null)"; without -v: nothing, no empty line; it printed
    "topic " and an empty line), and -C counts the empty ones."""
    mb = mosquitto_broker(persistence=False, extra=["log_type subscribe"])
    args = ["-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/e", "-C", "3", *options]
    procs = {}
    for name, command in (("theirs", ["mosquitto_sub"]), ("ours", [*broker_command(), "sub"])):
        procs[name] = subprocess.Popen([*command, *args, "-i", f"{uid}-{name}"], cwd=REPO,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert mb.out.wait(lambda ln: f"{uid}-{name} 0 {uid}/e" in ln, 10), mb.log_text()
    for payload in (["-n"], ["-m", "a"], ["-n"]):
        mosq("pub", mb.port, "-t", f"{uid}/e", "-q", "1", *payload).wait()
    out = {}
    for name, proc in procs.items():
        out[name], err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
    assert out["theirs"] == printed.format(t=f"{uid}/e").encode()
    assert out["ours"] == out["theirs"]


def test_pub_M_at_most_a_lower_mosquitto_limit_loses_no_qos_2_message(mosquitto_broker, paho,
                                                                      uid):
    """docs/client-cli.md: over 3.1.1 a broker cannot say how many unfinished QoS 2 messages
    it takes; to a Mosquitto with max_inflight_messages 5, -M 5 delivers every one."""
    from bridge.helpers import Received
    mb = mosquitto_broker(persistence=False, extra=["max_inflight_messages 5"])
    sub = paho(mb.port, client_id=f"{uid}-s")
    assert sub.subscribe(f"{uid}/q2", 1) == [1]
    got = Received(sub)
    r = eb("pub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/q2", "-m", "7",
           "-q", "2", "-V", "311", "--repeat", "200", "-M", "5", "-d", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().count("received PUBCOMP") == 200
    got.drain(wait=1.0)
    deadline = time.monotonic() + 20
    while len(got.order) < 200 and time.monotonic() < deadline:
        got.drain(wait=0.2)
    assert len(got.order) == 200


def test_c_over_5_keeps_the_session_on_both_brokers(csrv, mosquitto_broker, uid):
    """`-c -V 5` sends a Session Expiry Interval (mosquitto_sub's: never expires): without
    one a 5.0 broker ends the session at the disconnect and the message sent meanwhile is
    lost."""
    mb = mosquitto_broker(persistence=False)
    for p in (port(csrv), mb.port):
        sid = f"{uid}c{p}"
        base = ("-h", "127.0.0.1", "-p", str(p), "-t", f"{sid}/#", "-q", "1", "-c",
                "-V", "5", "-i", sid)
        r = eb("sub", *base, "-E")
        assert r.returncode == 0, r.stderr
        r = eb("pub", "-h", "127.0.0.1", "-p", str(p), "-t", f"{sid}/a", "-m", "away",
               "-q", "1")
        assert r.returncode == 0, r.stderr
        r = eb("sub", *base, "-C", "1", "-W", "10")
        assert (r.returncode, r.stdout) == (0, b"away\n"), (p, r.stderr)


def test_quiet_pub_prints_no_refused_publish_line(mosquitto_broker, uid):
    """A PUBLISH refused by a 5.0 broker (QoS 2 to Mosquitto's `max_qos 1`: 0x9b) is a
    Warning line on stderr and exit 1; with --quiet the exit code only."""
    mb = mosquitto_broker(persistence=False, extra=["max_qos 1"])
    args = ("pub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/q", "-m", "x",
            "-q", "2", "-V", "5")
    r = eb(*args)
    assert (r.returncode, r.stderr) == (1, f"Warning: Publish to {uid}/q failed: reason code "
                                           f"0x9b\n".encode())
    r = eb(*args, "--quiet")
    assert (r.returncode, r.stderr) == (1, b"")


def test_pub_gives_up_when_the_broker_drops_the_link_for_the_message(mosquitto_broker, uid):
    """Over 3.1.1 Mosquitto with `max_qos 1` closes the connection on a QoS 2 PUBLISH: pub
    sent it again on every reconnection, forever; now it exits 7 with mosquitto_pub's line
    after STALLS connections in a row lost with nothing acknowledged."""
    mb = mosquitto_broker(persistence=False, extra=["max_qos 1"])
    r = eb("pub", "-h", "127.0.0.1", "-p", str(mb.port), "-t", f"{uid}/p", "-m", "x",
           "-q", "2", "-d", timeout=15)
    assert r.returncode == 7, r.stderr
    lines = r.stderr.decode().splitlines()
    assert lines[-2] == "Error: The connection was lost.", lines
    assert lines[-1] == ("Hint: a 3.1.1 broker closes the connection on a QoS 2 message it "
                         "does not take (it takes no QoS 2, or fewer unfinished than -M 20): "
                         "try -q 1, a smaller -M, or -V 5 to be told why."), lines
    assert sum("lost the connection" in ln for ln in lines) == 3, lines
