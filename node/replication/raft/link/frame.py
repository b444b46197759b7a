"""The frames of a Raft peer link: kinds, lengths and the per-frame MAC.

A frame is its length (4 bytes: what follows it), its kind (1 byte), on a
link of version 3 that MACs its frames the header's tag (HTAG bytes), its
payload and, on a link that MACs its frames, the tag (TAG bytes). Without TLS every frame after the handshake carries
an HMAC-SHA256 tag under a per-direction session key (from the link key and
both nonces, handshake.session_keys) over a per-direction sequence number:
an injected, altered, replayed, reordered or dropped frame closes the link
(TLS links rely on TLS's own integrity).
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from typing import Any

from node.replication.config import MAX_FRAME_BYTES

K_HELLO, K_CHALLENGE, K_PROOF, K_WELCOME = 1, 2, 3, 4
K_MSG, K_APPEND, K_PING = 16, 17, 32
PRE_AUTH_MAX = 4096  # bytes of a handshake frame
MAX_FRAME = MAX_FRAME_BYTES  # after authentication: raft.max_frame_bytes (PeerSecurity.max_frame)
TAG = 32  # HMAC-SHA256 tag after every authenticated frame of a link without TLS
# link version 3: after the header, a truncated HMAC of it (and of the sequence
# number) under its own key, checked before the body is read or buffered
HTAG = 16
LEN = struct.Struct("<I")  # a length prefix (an AppendEntries' header, a proof's part)
HDR = struct.Struct("<IB")  # a frame's header: its length and kind
_SEQ = struct.Struct("<Q")


def frame_refused(length: int, authenticated: bool, max_frame: int) -> str | None:
    """Why a frame announcing `length` bytes is refused from its header alone,
    before a byte of its body is read or buffered (None: read it)."""
    limit = max_frame if authenticated else PRE_AUTH_MAX
    if length == 0 or length > limit:
        return f"bad frame length {length} (at most {limit})" + ("" if authenticated else
                                                                 " before authentication")
    return None


def frame_mac(key: bytes) -> Any:
    """A keyed HMAC-SHA256 to copy per frame (a copy skips the key set-up:
    ~2.5 us a frame instead of ~4)."""
    return hmac.new(key, digestmod=hashlib.sha256)


def entries_digest(entries_blob: bytes | memoryview) -> bytes:
    """SHA-256 of an AppendEntries' encoded entries: the frame MAC covers this
    digest, so the leader hashes a batch once, not once per follower."""
    return hashlib.sha256(entries_blob).digest()


def mac_parts(kind: int, payload: bytes) -> list[bytes | memoryview] | None:
    """What a received frame's MAC covers after its header: the payload, or for
    K_APPEND its header part and the digest of its entries (None: an append
    whose header length overruns it, which no sender's MAC can cover)."""
    if kind != K_APPEND:
        return [payload]
    if len(payload) < 4:
        return None
    split = 4 + LEN.unpack_from(payload, 0)[0]
    if split > len(payload):
        return None
    return [memoryview(payload)[:split], entries_digest(memoryview(payload)[split:])]


def header_tag(keyed: Any, seq: int, header: bytes | memoryview) -> bytes:
    """The header MAC of one frame of a version-3 link under `keyed` (a
    frame_mac of the direction's header key): its sequence number and its
    header (length and kind), so that a forged length is refused before the
    body it announces is read."""
    mac = keyed.copy()
    mac.update(_SEQ.pack(seq))
    mac.update(header)
    return bytes(mac.digest()[:HTAG])


def frame_tag(keyed: Any, seq: int, header: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
    """The MAC of one frame under `keyed` (frame_mac): its sequence number in
    its direction (implicit, never sent), its header (length and kind) and
    its payload (mac_parts)."""
    mac = keyed.copy()
    mac.update(_SEQ.pack(seq))
    mac.update(header)
    for p in parts:
        mac.update(p)
    return mac.digest()
