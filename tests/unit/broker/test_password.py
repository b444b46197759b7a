"""Password hashes in RabbitMQ's format (rabbit_password_hashing_sha256)."""
from __future__ import annotations

import base64
import hashlib

import pytest

from node.broker.password import SALT_BYTES, check_password, hash_password


def test_format_is_base64_of_salt_and_sha256_of_salt_and_password() -> None:
    salt = b"\x90\x8d\xc6\x0a"
    stored = hash_password("test12", salt)
    raw = base64.b64decode(stored)
    assert raw[:SALT_BYTES] == salt and len(raw) == SALT_BYTES + 32
    assert raw[SALT_BYTES:] == hashlib.sha256(salt + b"test12").digest()


def test_round_trip_random_salt_and_unicode() -> None:
    a, b = hash_password("pässwörd"), hash_password("pässwörd")
    assert a != b  # a fresh salt each time
    assert check_password(a, "pässwörd") and check_password(b, "pässwörd")
    assert not check_password(a, "passwörd") and not check_password(a, "")


@pytest.mark.parametrize("stored", ["", "not base64!", base64.b64encode(b"short").decode(), "é"])
def test_malformed_stored_hash_never_matches(stored: str) -> None:
    assert not check_password(stored, "")
    assert not check_password(stored, "x")


def test_salt_must_be_four_bytes() -> None:
    with pytest.raises(ValueError):
        hash_password("x", b"123")
