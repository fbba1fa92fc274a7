"""Memory held after connections close (issue 26, item 1): rounds of clients that connect with
a long keepalive, stay a while and disconnect; the broker's RSS after each round.

A broker that lets go of everything a connection held grows by nothing per round once its
allocator has warmed up; one that keeps closed clients (in its deadline heap, in a table keyed
by client id or address) grows linearly. Every round waits until the broker counts no socket
open, then reads its RSS and its admin ``stats`` (``timer_entries``: entries in the deadline
heap, ``timer_entries_dead``: entries no longer used).

    python3 bench/leak_bench.py                          # 10 rounds of 3,000, 2 s each
    python3 bench/leak_bench.py --rounds 4 --clients 500 --stay 0.5 --abort

``--abort`` closes without DISCONNECT (a reset), ``--tls`` connects over TLS (a throw-away
certificate made with the ``cryptography`` package in the broker's temporary directory).
Everything is bounded: each round must finish within ``--round-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import brokers  # noqa: E402
import wire  # noqa: E402


def _self_signed(directory: str) -> tuple[str, str]:
    """A certificate and key for 127.0.0.1 (test use only)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2)).sign(key, hashes.SHA256()))
    certfile, keyfile = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(certfile, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(keyfile, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.TraditionalOpenSSL,
                                   serialization.NoEncryption()))
    return certfile, keyfile


class LeakBroker(brokers.Edgebroker):
    """edgebroker with a TLS listener in place of the plain one when ``cfg["tls"]``."""

    def command(self) -> list[str]:
        cmd = super().command()
        if not self.cfg.get("tls"):
            return cmd
        certfile, keyfile = _self_signed(self.tmp)
        cfg = cmd[cmd.index("-c") + 1]
        with open(cfg, "a") as fh:
            fh.write(f'\n[[listener]]\nhost = "{self.host}"\nport = {self.port}\n'
                     f'certfile = "{certfile}"\nkeyfile = "{keyfile}"\n')
        at = cmd.index("--listen")
        return cmd[:at] + cmd[at + 2:]


def one_round(host: str, port: int, n: int, prefix: str, stay: float, abort: bool,
              tls: ssl.SSLContext | None, deadline: float) -> None:
    """Connect ``n`` clients (keepalive 65535), keep them ``stay`` seconds, then disconnect."""
    socks = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
        if tls is not None:
            s = tls.wrap_socket(s, server_hostname="127.0.0.1")
        s.sendall(wire.connect(f"{prefix}-{i}", keepalive=65535))
        socks.append(s)
    for s in socks:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                raise RuntimeError("closed before CONNACK")
            head += chunk
        if head != wire.CONNACK_ACCEPTED:
            raise RuntimeError(f"CONNACK {head!r}")
    time.sleep(stay)
    for s in socks:
        if abort:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            s.sendall(wire.DISCONNECT_BYTES)
        s.close()


def wait_closed(broker, deadline: float) -> dict:
    """The broker's stats once it counts no socket open."""
    while True:
        stats = broker.admin_stats()
        if stats is not None and stats.get("sockets_open") == 0:
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError(f"sockets still open: {stats and stats.get('sockets_open')}")
        time.sleep(0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=3000)
    ap.add_argument("--stay", type=float, default=2.0, help="seconds connected per round")
    ap.add_argument("--abort", action="store_true", help="close without DISCONNECT (RST)")
    ap.add_argument("--tls", action="store_true", help="connect over TLS")
    ap.add_argument("--round-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)

    broker = LeakBroker({"nofile": args.clients + 2000, "tls": args.tls})
    brokers.raise_nofile(args.clients + 2000)
    ctx = None
    if args.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        broker.start()
        base = broker.rss_bytes()
        print(f"rounds of {args.clients} clients (keepalive 65535, {args.stay:g} s connected, "
              f"{'abort' if args.abort else 'DISCONNECT'}{', TLS' if args.tls else ''}); "
              f"RSS at start {base / 1e6:.1f} MB", flush=True)
        rss = []
        for r in range(args.rounds):
            deadline = time.monotonic() + args.round_timeout
            one_round(broker.host, broker.port, args.clients, f"r{r}", args.stay, args.abort,
                      ctx, deadline)
            stats = wait_closed(broker, deadline)
            rss.append(broker.rss_bytes())
            print(f"round {r + 1}: RSS {rss[-1] / 1e6:.1f} MB; timer_entries "
                  f"{stats.get('timer_entries')}, unused "
                  f"{stats.get('timer_entries_dead')}", flush=True)
        if len(rss) >= 3:
            # From the second round on: the first one also warms the allocator up.
            per = (rss[-1] - rss[1]) / ((len(rss) - 2) * args.clients)
            print(f"RSS growth per client, rounds 2-{len(rss)}: {per:.0f} bytes")
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
