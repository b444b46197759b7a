"""Issue 26 item 10: where an unauthenticated Raft port listens, and which
members it may add."""
from __future__ import annotations

from node.app.administrator import member_address_refusal
from node.app.config import raft_bind_host
from node.broker.loopback import is_loopback


def test_is_loopback() -> None:
    def configured(host: str) -> bool:
        return is_loopback(host, peer=False)

    assert configured("127.0.0.1") and configured("127.0.0.3") and configured("::1")
    assert configured("[::1]") and configured("localhost")
    assert not configured("10.0.0.1") and not configured("::") and not configured("node-1.svc")


def test_unauthenticated_raft_binds_loopback_unless_told() -> None:
    assert raft_bind_host("10.0.0.5", None, authenticated=True) is None  # every address, as before
    assert raft_bind_host("10.0.0.5", "10.0.0.5", authenticated=True) == "10.0.0.5"
    assert raft_bind_host("10.0.0.5", None, authenticated=False) == "127.0.0.1"
    assert raft_bind_host("fd00::5", None, authenticated=False) == "::1"
    assert raft_bind_host("127.0.0.2", None, authenticated=False) == "127.0.0.2"
    assert raft_bind_host("10.0.0.5", "0.0.0.0", authenticated=False) == "0.0.0.0"  # explicit: warned


def test_add_member_refusal() -> None:
    assert member_address_refusal("10.0.0.9:25672", links_authenticated=True) is None
    assert member_address_refusal("127.0.0.9:25672", links_authenticated=False) is None
    assert member_address_refusal("[::1]:25672", links_authenticated=False) is None
    why = member_address_refusal("10.0.0.9:25672", links_authenticated=False)
    assert why is not None and "not authenticated" in why
