"""Server SSLContexts built at start-up: the amqps listener's from [tls], and
the management HTTPS listener's (the same checks, its own key names).

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


# the config keys errors name, per listener
AMQPS_KEYS = {"cert": "tls.cert", "key": "tls.key", "ca": "tls.ca", "listener": "the amqps listener"}
HTTPS_KEYS = {"cert": "http.tls_cert", "key": "http.tls_key", "ca": "http.tls_client_ca",
              "listener": "the management HTTPS listener"}


def _read(name: str, path: str, marker: str, kind: str, listener: str) -> None:
    """The file is readable and looks like the PEM it should be (OpenSSL's own
    errors name neither the file nor the problem)."""
    if not path:
        raise TlsConfigError(f"{listener} needs {name} (a PEM file)")
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise TlsConfigError(f"cannot read {name} {path}: {exc.strerror}") from exc
    if marker.encode() not in text:
        raise TlsConfigError(f"{name} {path} holds no PEM {kind}")


def server_context(tls: TlsConfig, keys: dict[str, str] | None = None) -> ssl.SSLContext:
    """`tls`'s files as a TLS 1.2+ server context; `keys` names the config keys
    in errors (default: [tls]'s)."""
    k = keys or AMQPS_KEYS
    if tls.verify not in VERIFY_MODES:
        raise TlsConfigError(f"tls.verify must be one of {', '.join(VERIFY_MODES)}, "
                             f"got {tls.verify!r}")
    _read(k["cert"], tls.cert, "-----BEGIN CERTIFICATE-----", "certificate", k["listener"])
    _read(k["key"], tls.key, "PRIVATE KEY-----", "private key", k["listener"])

    def encrypted_key() -> NoReturn:
        # without a callback OpenSSL would prompt on the terminal
        raise TlsConfigError(f"{k['key']} is passphrase-protected; give an unencrypted key "
                             "(mode 0600)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert, tls.key, password=encrypted_key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TlsConfigError(f"{k['key']} {tls.key} does not match {k['cert']} "
                                 f"{tls.cert}") from exc
        raise TlsConfigError(f"cannot load {k['cert']} {tls.cert} / {k['key']} {tls.key}: "
                             f"{exc.reason or exc}") from exc
    if tls.verify != "none" and not tls.ca:
        raise TlsConfigError(f"tls.verify = \"{tls.verify}\" needs {k['ca']} (the CA "
                             "certificates that sign client certificates)")
    if tls.ca:
        _read(k["ca"], tls.ca, "-----BEGIN CERTIFICATE-----", "certificate", k["listener"])
        try:
            ctx.load_verify_locations(cafile=tls.ca)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"cannot load {k['ca']} {tls.ca}: {exc.reason or exc}") from exc
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
