"""Issue 26 item 5: the pure decisions behind the handshake deadline and the
cap on unauthenticated inbound links."""
from __future__ import annotations

import pytest

from node.replication.config import FRAME_HEADROOM, min_frame_bytes
from node.replication.raft.link.frame import PRE_AUTH_MAX, frame_refused
from node.replication.raft.link.handshake import FRAMES, agreed_frames, evictions, handshake_overdue
from node.replication.raft.link.security import address_host, cert_names_host


def test_only_inbound_unauthenticated_links_have_a_handshake_deadline() -> None:
    assert handshake_overdue(True, False, opened_at=0.0, now=10.5, deadline=10.0)
    assert not handshake_overdue(True, False, opened_at=0.0, now=9.5, deadline=10.0)
    assert not handshake_overdue(True, True, opened_at=0.0, now=1e6, deadline=10.0)  # a slow follower stays
    assert not handshake_overdue(False, False, opened_at=0.0, now=1e6, deadline=10.0)  # our own dial


def test_evictions_drop_the_oldest_beyond_the_cap() -> None:
    assert evictions(["a", "b", "c", "d"], keep=2) == ["a", "b"]
    assert evictions(["a", "b"], keep=2) == []
    assert evictions([], keep=0) == []


def test_a_frame_length_is_judged_from_its_header() -> None:
    # issue 42 item 10: 1 GiB was trusted after authentication; now raft.max_frame_bytes
    assert frame_refused(1 << 30, True, 64 << 20) is not None
    assert frame_refused(64 << 20, True, 64 << 20) is None
    assert frame_refused(0, True, 64 << 20) is not None
    assert frame_refused(PRE_AUTH_MAX + 1, False, 64 << 20) is not None
    assert frame_refused(PRE_AUTH_MAX, False, 64 << 20) is None


def test_the_least_max_frame_holds_the_largest_append_a_member_sends() -> None:
    mib = 1 << 20
    assert min_frame_bytes(16 * mib, mib // 2, mib // 2) == 16 * mib + mib // 2 + FRAME_HEADROOM
    assert min_frame_bytes(1024, 8 * mib, mib) == 16 * mib + FRAME_HEADROOM


@pytest.mark.parametrize(("address", "host"), [("10.0.0.1:25672", "10.0.0.1"), ("[::1]:25672", "::1"),
                                               ("m-0.hl.ns.svc:25672", "m-0.hl.ns.svc")])
def test_the_host_of_a_member_address(address: str, host: str) -> None:
    assert address_host(address) == host


def _cert(*sans: tuple[str, str]) -> dict[str, object]:
    return {"subject": ((("commonName", "10.0.0.1"),),), "subjectAltName": sans}


def test_a_certificate_names_a_host_by_its_san_only() -> None:
    assert cert_names_host(_cert(("IP Address", "10.0.0.1")), "10.0.0.1")
    assert cert_names_host(_cert(("IP Address", "0:0:0:0:0:0:0:1\n")), "::1")
    assert not cert_names_host(_cert(("IP Address", "10.0.0.2")), "10.0.0.1")
    assert not cert_names_host(_cert(("DNS", "10.0.0.1")), "10.0.0.1")  # an IP needs an IP SAN
    assert not cert_names_host(_cert(), "10.0.0.1")  # the common name never counts
    assert not cert_names_host(None, "10.0.0.1") and not cert_names_host(_cert(("DNS", "a")), "")
    wild = _cert(("DNS", "*.mq-headless.ns.svc"))
    assert cert_names_host(wild, "mq-0.mq-headless.ns.svc")
    assert cert_names_host(wild, "MQ-1.mq-headless.ns.svc.")
    assert not cert_names_host(wild, "mq-headless.ns.svc")  # "*" is one label, never none
    assert not cert_names_host(wild, "a.mq-0.mq-headless.ns.svc")  # nor two
    assert not cert_names_host(_cert(("DNS", "mq*.ns.svc")), "mq0.ns.svc")  # no partial labels
    assert cert_names_host(_cert(("DNS", "mq-0.ns.svc")), "mq-0.ns.svc")


def test_link_version_3_only_when_the_peer_offers_it() -> None:
    assert FRAMES == 3
    assert agreed_frames(3) == 3 and agreed_frames(4) == 3  # a later build offering more gets ours
    for said in (None, 2, "3", True, 3.0):  # the previous release says nothing
        assert agreed_frames(said) == 2
