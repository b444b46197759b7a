"""The validity of the PEM files a TLS listener serves (the certificate-
expiration health check): per PEM entry, its notAfter in seconds since the
epoch, or why it cannot count (RabbitMQ's cert_validity in
rabbit_mgmt_wm_health_check_certificate_expiration)."""
from __future__ import annotations

import re

from cryptography import x509

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
