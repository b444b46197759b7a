"""node/broker/loopback.py: the two rules of is_loopback, where they differ
(each caller's own tests: tests/unit/amqp/test_connection.py for a peer's
address, tests/unit/app/test_raft_exposure.py for a configured host)."""
from __future__ import annotations

import pytest

from node.broker.loopback import is_loopback


@pytest.mark.parametrize("host,peer,configured", [
    ("127.0.0.1", True, True),
    ("::1", True, True),
    ("10.0.0.5", False, False),
    (None, False, False),
    ("", False, False),
    ("localhost", False, True),  # a name: only as configured
    ("[::1]", False, True),  # brackets: only as configured
    ("::ffff:127.0.0.1", True, False),  # IPv4-mapped: a dual-stack socket's peer
    ("127.0.0.1%lo", True, False),  # a zone id: dropped from a peer's address
    ("::1%lo", True, True),
    ("fe80::1%eth0", False, False),
])
def test_the_peer_rule_and_the_configured_host_rule(host: str | None, peer: bool,
                                                     configured: bool) -> None:
    assert is_loopback(host, peer=True) is peer
    assert is_loopback(host, peer=False) is configured
