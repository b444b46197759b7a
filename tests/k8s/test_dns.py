"""k8s/dns.py: the cluster DNS the real-kubelet tests give their pods (issue 30).
The zone is folded from Service and Endpoints objects as the API server returns
them; the answers are checked byte by byte and through a real UDP socket."""
from __future__ import annotations

import os
import socket
import struct
from typing import Any

import pytest

from k8s.dns import (
    RCODE_FORMERR,
    RCODE_NXDOMAIN,
    RCODE_OK,
    RCODE_REFUSED,
    ClusterDns,
    DnsFormatError,
    answer,
    parse_query,
    zone_of,
)


def svc(name: str, ns: str, ip: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterIP": ip or "None"}}


def eps(name: str, ns: str, *addrs: tuple[str, str | None]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "subsets": [{"addresses": [
        {"ip": ip, **({"hostname": h} if h else {})} for ip, h in addrs]}]}


SERVICES = [svc("kubernetes", "default", "10.0.0.1"), svc("mirrorq", "mq", "10.0.0.57"),
            svc("mirrorq-headless", "mq", None)]
ENDPOINTS = [eps("kubernetes", "default", ("10.244.0.1", None)),
             eps("mirrorq", "mq", ("10.244.0.3", None)),
             eps("mirrorq-headless", "mq", ("10.244.0.3", "mirrorq-0"), ("10.244.0.4", "mirrorq-1"))]


def query(name: str, qtype: int = 1, ident: int = 0x1234, flags: int = 0x0100) -> bytes:
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, flags, 1, 0, 0, 1) + q + struct.pack("!HH", qtype, 1)


def decode(reply: bytes) -> tuple[int, int, list[str]]:
    ident, flags, _qd, an = struct.unpack_from("!HHHH", reply, 0)
    pos = 12
    while reply[pos]:
        pos += reply[pos] + 1
    pos += 5
    ips = []
    for _ in range(an):
        _ptr, rtype, _cls, _ttl, rdlen = struct.unpack_from("!HHHIH", reply, pos)
        pos += 12
        assert rtype == 1 and rdlen == 4
        ips.append(socket.inet_ntoa(reply[pos:pos + 4]))
        pos += 4
    assert pos == len(reply)
    return ident, flags & 0xF, ips


def test_zone_has_cluster_ips_headless_addresses_and_pod_hostnames() -> None:
    zone = zone_of(SERVICES, ENDPOINTS)
    assert zone["mirrorq.mq.svc.cluster.local"] == ("10.0.0.57",)  # not its endpoints
    assert zone["mirrorq-headless.mq.svc.cluster.local"] == ("10.244.0.3", "10.244.0.4")
    assert zone["mirrorq-1.mirrorq-headless.mq.svc.cluster.local"] == ("10.244.0.4",)
    assert zone["kubernetes.default.svc.cluster.local"] == ("10.0.0.1",)
    # a pod that is gone leaves the zone with its Endpoints entry
    zone2 = zone_of(SERVICES, ENDPOINTS[:2] + [eps("mirrorq-headless", "mq",
                                                    ("10.244.0.9", "mirrorq-0"))])
    assert "mirrorq-1.mirrorq-headless.mq.svc.cluster.local" not in zone2
    assert zone2["mirrorq-0.mirrorq-headless.mq.svc.cluster.local"] == ("10.244.0.9",)


@pytest.mark.parametrize(("name", "qtype", "rcode", "ips"), [
    ("mirrorq-0.mirrorq-headless.mq.svc.cluster.local", 1, RCODE_OK, ["10.244.0.3"]),
    ("MIRRORQ-0.Mirrorq-Headless.mq.svc.cluster.local", 1, RCODE_OK, ["10.244.0.3"]),
    ("mirrorq-0.mirrorq-headless.mq.svc.cluster.local", 28, RCODE_OK, []),  # AAAA: NODATA
    ("mq.svc.cluster.local", 1, RCODE_OK, []),  # a name with names under it
    # the search list's first tries (ndots 5) end at once
    ("mirrorq-0.mirrorq-headless.mq.svc.mq.svc.cluster.local", 1, RCODE_NXDOMAIN, []),
    ("pypi.org", 1, RCODE_REFUSED, []),  # no forwarding
])
def test_answers(name: str, qtype: int, rcode: int, ips: list[str]) -> None:
    zone = zone_of(SERVICES, ENDPOINTS)
    ident, got_rcode, got = decode(answer(zone, parse_query(query(name, qtype))))
    assert (ident, got_rcode, got) == (0x1234, rcode, ips)


@pytest.mark.parametrize("bad", [b"", b"\x12\x34", query("a.b")[:-3],
                                 query("a.b", flags=0x8100),  # a response, not a query
                                 query("a.b")[:12] + b"\xc0\x0c\0\1\0\1"])
def test_malformed_queries_are_refused_as_format_errors(bad: bytes) -> None:
    with pytest.raises(DnsFormatError):
        parse_query(bad)


class Objects:
    """The API's answers, as lists of objects (what ClusterDns polls)."""
    def __init__(self) -> None:
        self.services, self.endpoints = list(SERVICES), list(ENDPOINTS)

    def get(self, path: str) -> Any:
        return {"items": self.services if path.endswith("/services") else self.endpoints}


def test_server_answers_over_udp_and_follows_a_new_pod_address() -> None:
    objs = Objects()
    dns = ClusterDns(objs, "127.0.0.1", port=0, poll=0.05).start()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        name = "mirrorq-1.mirrorq-headless.mq.svc.cluster.local"
        s.sendto(query(name), ("127.0.0.1", dns.port))
        assert decode(s.recv(512))[1:] == (RCODE_OK, ["10.244.0.4"])
        # garbage with a header gets FORMERR; the server goes on serving
        s.sendto(os.urandom(2) + b"\x01\x00" + b"\0" * 8, ("127.0.0.1", dns.port))
        assert struct.unpack_from("!H", s.recv(512), 2)[0] & 0xF == RCODE_FORMERR
        objs.endpoints = ENDPOINTS[:2] + [eps("mirrorq-headless", "mq", ("10.244.0.7", "mirrorq-1"))]
        dns.refresh_once()
        s.sendto(query(name), ("127.0.0.1", dns.port))
        assert decode(s.recv(512))[1:] == (RCODE_OK, ["10.244.0.7"])
    finally:
        s.close()
        dns.stop()
