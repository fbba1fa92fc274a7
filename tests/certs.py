"""Test certificates made with the ``cryptography`` package: CAs, server and client certificates.

``make_pki(directory)`` writes a fresh set of PEM files and returns their paths:
a CA, a server certificate for 127.0.0.1/localhost signed by it, client
certificates signed by it, and a second, unrelated CA with a client certificate
of its own (the "wrong CA" cases). Keys are EC P-256 so generation is fast.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgebroker tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def encrypted_copy(key: Path, dest: Path, traditional: bool = False) -> Path:
    """``key`` encrypted with the pass phrase "secret": PKCS#8 (``ENCRYPTED PRIVATE KEY``) or,
    with ``traditional``, OpenSSL's older PEM (``Proc-Type: 4,ENCRYPTED``)."""
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    fmt = (serialization.PrivateFormat.TraditionalOpenSSL if traditional
           else serialization.PrivateFormat.PKCS8)
    dest.write_bytes(loaded.private_bytes(serialization.Encoding.PEM, fmt,
                                          serialization.BestAvailableEncryption(b"secret")))
    dest.chmod(0o600)
    return dest


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass
class Issued:
    cert: Path
    key: Path
    certificate: x509.Certificate


class CA:
    def __init__(self, directory: Path, name: str):
        self.directory = directory
        self.key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name)).issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256()))
        self.cert = _write_cert(directory / f"{name}.crt", self.certificate)

    def issue(self, filename: str, cn: str, server: bool = False,
              valid: tuple[datetime.datetime, datetime.datetime] | None = None,
              names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Issued:
        """``valid``: its notBefore and notAfter (by default from 5 minutes ago to a day on);
        ``names``: a server certificate's subjectAltName (host names and IP addresses)."""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        not_before, not_after = valid or (now - datetime.timedelta(minutes=5),
                                          now + datetime.timedelta(days=1))
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn)).issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
                for n in names]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(_write_cert(self.directory / f"{filename}.crt", cert),
                      _write_key(self.directory / f"{filename}.key", key), cert)


@dataclass
class PKI:
    ca: CA
    server: Issued
    client: Issued           # CN "device-1", signed by ca
    client2: Issued          # CN "device-2", signed by ca
    other_ca: CA             # an unrelated CA
    other_client: Issued     # CN "device-1", signed by other_ca
    other_server: Issued     # a server certificate signed by other_ca


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = CA(directory, "ca")
    other = CA(directory, "other-ca")
    return PKI(ca=ca,
               server=ca.issue("server", "localhost", server=True),
               client=ca.issue("client", "device-1"),
               client2=ca.issue("client2", "device-2"),
               other_ca=other,
               other_client=other.issue("other-client", "device-1"),
               other_server=other.issue("other-server", "localhost", server=True))
