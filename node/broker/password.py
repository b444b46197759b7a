"""Password hashes as RabbitMQ stores them (rabbit_password_hashing_sha256):
base64(salt || SHA-256(salt || UTF-8 password)) with a random 4-byte salt.
Pure; the salt is chosen by the caller's side (the admin API), never in apply."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SALT_BYTES = 4


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    if len(salt) != SALT_BYTES:
        raise ValueError(f"salt must be {SALT_BYTES} bytes")
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(stored: str, password: str) -> bool:
    """Constant-time comparison; a malformed stored hash never matches."""
    try:
        raw = base64.b64decode(stored.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False
    if len(raw) != SALT_BYTES + 32:
        return False
    salt, digest = raw[:SALT_BYTES], raw[SALT_BYTES:]
    return hmac.compare_digest(digest, hashlib.sha256(salt + password.encode("utf-8")).digest())


def password_hash_ok(stored: str) -> bool:
    """A well-formed stored hash (4-byte salt + 32-byte digest, base64); ""
    is RabbitMQ's "no password" (nobody can log in with one)."""
    if stored == "":
        return True
    try:
        raw = base64.b64decode(stored.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False
    return len(raw) == SALT_BYTES + 32
