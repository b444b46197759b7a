"""How Raft peer links prove who they are: PeerSecurity, the link key and TLS.

A link is authenticated once when it opens: mutual TLS from one cluster CA
when configured (tls_contexts), and/or the challenge-response of
handshake.py over a key derived from the Raft password with scrypt (once
per process, link_key).
"""
from __future__ import annotations

import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from typing import Any

from node.replication.config import MAX_FRAME_BYTES

# scrypt (memory-hard) of the Raft password: ~75 ms and 16 MiB once per
# process, and the same for every guess of someone who saw a handshake. The
# salt is a fixed label: every member must derive the same key before it
# knows anything about the cluster; a long random password (local-cluster and
# the operator generate them) makes precomputation pointless.
KDF_SALT = b"mirrorq raft link key v2"
KDF_N, KDF_R, KDF_P = 1 << 14, 8, 1


def link_key(password: bytes | None) -> bytes:
    """The HMAC key of the challenge-response, from the Raft password (slow on
    purpose: each offline guess costs the same). No password: an empty key
    (--insecure-dev or TLS alone), which authenticates nothing."""
    if not password:
        return b""
    return hashlib.scrypt(password, salt=KDF_SALT, n=KDF_N, r=KDF_R, p=KDF_P,
                          maxmem=64 * 1024 * 1024, dklen=32)


@dataclass(frozen=True)
class PeerSecurity:
    """How links prove who they are. key: link_key(password), computed once
    (empty only with --insecure-dev or TLS); tls: client and server contexts
    that require a certificate from the cluster CA; verify_names: a peer's
    certificate must name the address it claims (cert_names_host); max_frame:
    the longest frame read from an authenticated peer (raft.max_frame_bytes)."""

    key: bytes = b""
    client_tls: ssl.SSLContext | None = None
    server_tls: ssl.SSLContext | None = None
    verify_names: bool = True
    max_frame: int = MAX_FRAME_BYTES

    @classmethod
    def from_password(cls, password: bytes | None, client_tls: ssl.SSLContext | None = None,
                      server_tls: ssl.SSLContext | None = None, verify_names: bool = True,
                      max_frame: int = MAX_FRAME_BYTES) -> PeerSecurity:
        return cls(link_key(password), client_tls, server_tls, verify_names, max_frame)

    @property
    def tls(self) -> bool:
        return self.client_tls is not None


def tls_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Mutual TLS between members: each side presents its certificate and
    requires one signed by the cluster CA. OpenSSL checks no name (the
    dialled address is not known to the accepting side, and a member's
    address is a name or an IP): the handshake does, against the address the
    peer claims (cert_names_host), once both are known."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_REQUIRED
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.verify_mode = ssl.CERT_REQUIRED
    for ctx in (client, server):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(ca)
    return client, server


def address_host(address: str) -> str:
    """The host of a member's address "host:port" ("[v6]:port" too)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _dns_matches(pattern: str, host: str) -> bool:
    """A DNS SAN against a host name: equal, or "*." standing for exactly one
    leftmost label (RFC 6125's rule; no partial-label wildcards)."""
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern.startswith("*."):
        label, _, rest = host.partition(".")
        return bool(label) and rest == pattern[2:] and "*" not in rest
    return "*" not in pattern and pattern == host


def cert_names_host(cert: dict[str, Any] | None, host: str) -> bool:
    """Does a peer's certificate (ssl's getpeercert()) name `host` in its
    subjectAltName: an IP address SAN equal to it, or a DNS SAN matching it?
    The common name is never used (RFC 6125, and Python's own check)."""
    if not cert or not host:
        return False
    try:
        ip: Any = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address" and ip is not None:
            try:
                if ipaddress.ip_address(value.strip()) == ip:
                    return True
            except ValueError:
                continue
        elif kind == "DNS" and ip is None and _dns_matches(value, host):
            return True
    return False
