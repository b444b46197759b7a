"""The one module that owns `cryptography`: a MirrorqCluster's admin PKI (issue 26).

Per cluster, a private CA, a certificate for the broker pods' admin port (also
their client certificate: the in-pod readiness probe presents it) and one for
the operator. ECDSA P-256. No renewal: the CA lasts CA_DAYS, the leaves
LEAF_DAYS; replacing them means deleting the Secret and restarting the pods
(docs/kubernetes.md "Admin TLS")."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .model import headless_name

CA_DAYS = 3650
LEAF_DAYS = 730
OPERATOR_CN = "mirrorq-operator"


@dataclass(frozen=True)
class AdminPki:
    """PEM bytes; the keys of the Secret are builders.ADMIN_TLS_KEYS."""
    ca_cert: bytes
    ca_key: bytes
    server_cert: bytes
    server_key: bytes
    client_cert: bytes
    client_key: bytes


def server_dns_names(name: str, namespace: str) -> list[str]:
    """Every pod's DNS names behind the headless Service (the operator and the
    probe dial NAME-k.NAME-headless.NS.svc), and localhost for in-pod tools."""
    headless = headless_name(name)
    return [f"*.{headless}.{namespace}.svc", f"*.{headless}.{namespace}.svc.cluster.local",
            "localhost"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             now: datetime.datetime, days: int) -> x509.CertificateBuilder:
    # a few minutes back: nodes whose clocks lag the operator's still accept it
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def _leaf(cn: str, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, now: datetime.datetime,
          usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName] | None) -> bytes:
    b = (_builder(_name(cn), ca.subject, key, now, LEAF_DAYS)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                      content_commitment=False, key_encipherment=False,
                                      data_encipherment=False, key_agreement=False,
                                      encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
             ca_key.public_key()), critical=False))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _cert_pem(b.sign(ca_key, hashes.SHA256()))


def generate(name: str, namespace: str, now: datetime.datetime | None = None) -> AdminPki:
    """A fresh CA for cluster NAME in NAMESPACE and the two leaves it signs."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca_name = _name(f"mirrorq admin CA {namespace}/{name}")
    ca = (_builder(ca_name, ca_name, ca_key, now, CA_DAYS)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_dns_names(name, namespace)]
    sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
             x509.IPAddress(ipaddress.ip_address("::1"))]
    server_key, client_key = _key(), _key()
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return AdminPki(
        ca_cert=_cert_pem(ca), ca_key=_key_pem(ca_key),
        server_cert=_leaf(f"{name}.{namespace} admin", server_key, ca, ca_key, now, both, sans),
        server_key=_key_pem(server_key),
        client_cert=_leaf(OPERATOR_CN, client_key, ca, ca_key, now,
                          [ExtendedKeyUsageOID.CLIENT_AUTH], None),
        client_key=_key_pem(client_key))
