"""The one module of node/ that imports cryptography (the operator's
per-cluster admin CA is operator/mirrorq_operator/pki.py's): a cluster CA and
member certificates for mutual TLS on the Raft port (local-cluster, tests; the
operator and chart take theirs from a Secret), and the validity of the PEM
files a TLS listener serves (the certificate-expiration health check, which
node/http gets through its Backend's certificate_validity): per PEM entry, its
notAfter in seconds since the epoch, or why it cannot count (RabbitMQ's
cert_validity in rabbit_mgmt_wm_health_check_certificate_expiration)."""
from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mirrorq"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: Path, cn: str = "mirrorq cluster CA", days: int = 3650) -> tuple[Path, Path]:
    """ca.pem and ca.key in `directory` (kept if they exist); the directory 0700."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid == os.geteuid():  # one made by an older build was 0755
        directory.chmod(0o700)
    cert_path, key_path = directory / "ca.pem", directory / "ca.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_member(directory: Path, name: str, hosts: list[str], ca_dir: Path | None = None,
                days: int = 3650) -> tuple[Path, Path]:
    """name.pem / name.key signed by the CA in ca_dir (default: directory), for
    both ends of a link (server and client auth). Kept if they exist."""
    ca_dir = ca_dir or directory
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.S)


def pem_validity(data: bytes, now: float) -> list[float | str]:
    blocks = list(PEM_BLOCK.finditer(data))
    if not blocks:
        return ["The certificate file provided does not contain any PEM entry."]
    out: list[float | str] = []
    for m in blocks:
        kind = m.group(1).decode()
        if kind != "CERTIFICATE":
            out.append(f"The certificate file provided contains a {kind} entry")
            continue
        try:
            cert = x509.load_pem_x509_certificate(m.group(0))
        except ValueError as exc:
            out.append(f"The certificate file provided has an unreadable entry: {exc}")
            continue
        if cert.not_valid_before_utc.timestamp() > now:
            out.append("Certificate is not yet valid")
        else:
            out.append(cert.not_valid_after_utc.timestamp())
    return out


def file_validity(path: str | None, now: float) -> list[float | str] | None:
    """None: no such file configured; an unreadable file is one failed entry."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return [f"cannot read {path}: {exc.strerror}"]
    return pem_validity(data, now)
