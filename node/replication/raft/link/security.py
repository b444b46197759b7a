"""How Raft peer links prove who they are: PeerSecurity, the link key and TLS.

A link is authenticated once when it opens: mutual TLS from one cluster CA
when configured (tls_contexts), and/or the challenge-response of
handshake.py over a key derived from the Raft password with scrypt (once
per process, link_key).
"""
from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass

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
    that require a certificate from the cluster CA."""

    key: bytes = b""
    client_tls: ssl.SSLContext | None = None
    server_tls: ssl.SSLContext | None = None

    @classmethod
    def from_password(cls, password: bytes | None, client_tls: ssl.SSLContext | None = None,
                      server_tls: ssl.SSLContext | None = None) -> PeerSecurity:
        return cls(link_key(password), client_tls, server_tls)

    @property
    def tls(self) -> bool:
        return self.client_tls is not None


def tls_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Mutual TLS between members: each side presents its certificate and
    requires one signed by the cluster CA. Names are not checked (members are
    addressed by IP, and pod IPs change): the CA is the cluster's own."""
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
