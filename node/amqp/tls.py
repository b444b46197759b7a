"""The amqps listener's SSLContext, built from [tls] at start-up.

Every problem is a TlsConfigError with a one-line message (the CLI prints it
and exits 2): a node must not start with a listener that fails every handshake.
"""
from __future__ import annotations

import ssl
from typing import NoReturn

from node.amqp.config import VERIFY_MODES, TlsConfig

_VERIFY = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    pass


def _read(what: str, path: str, marker: str, kind: str) -> None:
    """The file is readable and looks like the PEM it should be (OpenSSL's own
    errors name neither the file nor the problem)."""
    if not path:
        raise TlsConfigError(f"the amqps listener needs tls.{what} (a PEM file) in the [tls] table")
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise TlsConfigError(f"cannot read tls.{what} {path}: {exc.strerror}") from exc
    if marker.encode() not in text:
        raise TlsConfigError(f"tls.{what} {path} holds no PEM {kind}")


def _encrypted_key() -> NoReturn:
    # without a callback OpenSSL would prompt on the terminal
    raise TlsConfigError("tls.key is passphrase-protected; give an unencrypted key (mode 0600)")


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    if tls.verify not in VERIFY_MODES:
        raise TlsConfigError(f"tls.verify must be one of {', '.join(VERIFY_MODES)}, "
                             f"got {tls.verify!r}")
    _read("cert", tls.cert, "-----BEGIN CERTIFICATE-----", "certificate")
    _read("key", tls.key, "PRIVATE KEY-----", "private key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert, tls.key, password=_encrypted_key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TlsConfigError(f"tls.key {tls.key} does not match tls.cert {tls.cert}") from exc
        raise TlsConfigError(f"cannot load tls.cert {tls.cert} / tls.key {tls.key}: "
                             f"{exc.reason or exc}") from exc
    if tls.verify != "none" and not tls.ca:
        raise TlsConfigError(f"tls.verify = \"{tls.verify}\" needs tls.ca (the CA certificates "
                             "that sign client certificates)")
    if tls.ca:
        _read("ca", tls.ca, "-----BEGIN CERTIFICATE-----", "certificate")
        try:
            ctx.load_verify_locations(cafile=tls.ca)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"cannot load tls.ca {tls.ca}: {exc.reason or exc}") from exc
    ctx.verify_mode = _VERIFY[tls.verify]
    return ctx


def peer_common_name(cert: object) -> str | None:
    """The subject CN of a verified peer certificate (ssl's getpeercert() dict)."""
    if not isinstance(cert, dict):
        return None
    for rdn in cert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
