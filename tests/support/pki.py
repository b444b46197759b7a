"""A throwaway PKI for TLS tests: a CA, server and client certificates (EC keys), the
node's [tls] config section and client SSL contexts."""
from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          issuer_key: ec.EllipticCurvePrivateKey, ca: bool,
          usage: x509.ObjectIdentifier | None = None, sans: list[x509.GeneralName] | None = None,
          ) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False,
                                          encipher_only=False, decipher_only=False), critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                            critical=False)
    else:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            issuer_key.public_key()), critical=False)
    if usage is not None:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@dataclass
class Pem:
    cert: Path
    key: Path


def _write(d: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    c, k = d / f"{stem}.crt", d / f"{stem}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    k.chmod(0o600)
    return Pem(c, k)


@dataclass
class Pki:
    ca: Path  # our CA's certificate
    server: Pem
    client: Pem  # signed by our CA, CN "alice"
    foreign_client: Pem  # signed by another CA
    other: Pem  # a key/cert pair that does not match `server`


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)

    def ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        return _cert(cn, key, _name(cn), key, ca=True), key

    ca_cert, ca_key = ca("mirrorq test CA")
    evil_cert, evil_key = ca("some other CA")
    (d / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(cn: str, issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey,
             usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None = None,
             ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        return _cert(cn, key, issuer.subject, issuer_key, ca=False, usage=usage, sans=sans), key

    sans: list[x509.GeneralName] = [x509.DNSName("localhost"),
                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _write(d, "server", *leaf("localhost", ca_cert, ca_key, ExtendedKeyUsageOID.SERVER_AUTH,
                                       sans))
    client = _write(d, "client", *leaf("alice", ca_cert, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH))
    foreign = _write(d, "foreign", *leaf("mallory", evil_cert, evil_key,
                                         ExtendedKeyUsageOID.CLIENT_AUTH))
    other = _write(d, "other", *leaf("localhost", ca_cert, ca_key, ExtendedKeyUsageOID.SERVER_AUTH,
                                     sans))
    return Pki(d / "ca.crt", server, client, foreign, other)


def tls_config(pki: Pki, verify: str = "none", only: bool = False, extra: str = "") -> str:
    return (extra + "[tls]\n"
            f'cert = "{pki.server.cert}"\nkey = "{pki.server.key}"\nca = "{pki.ca}"\n'
            f'verify = "{verify}"\nonly = {"true" if only else "false"}\n')


def client_context(pki: Pki, cert: Pem | None = None) -> ssl.SSLContext:
    """Verifies the server (our CA, hostname) and optionally presents a client certificate."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx
