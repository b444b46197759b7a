"""A DNS answer for Services in the tests' cluster (issue 30): Debian 12 packages no
CoreDNS, so this is a small authoritative resolver of our own for `cluster.local`,
nothing more. It answers A queries as the Kubernetes DNS spec says:

- `SVC.NS.svc.cluster.local`: the Service's ClusterIP, or for a headless Service
  the addresses of its Endpoints (`addresses`, which hold not-ready pods too when
  the Service publishes them);
- `HOST.SVC.NS.svc.cluster.local`: an endpoint address that has a hostname (a
  StatefulSet pod under its governing headless Service).

Other types of a known name get an empty answer (NODATA, so AAAA lookups end at
once); unknown names in the zone get NXDOMAIN; names outside it get REFUSED (no
forwarding: nothing outside the cluster is reachable here). UDP only, no
EDNS; answers carry a TTL of 1 s because pods come back with new addresses.

The decisions are pure (`zone_of`, `parse_query`, `answer`); `ClusterDns` is the
shell: it polls Services and Endpoints and serves one UDP socket from a thread.
"""
from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

DOMAIN = "cluster.local"
TTL = 1
TYPE_A = 1
CLASS_IN = 1
RCODE_OK, RCODE_FORMERR, RCODE_NXDOMAIN, RCODE_NOTIMP, RCODE_REFUSED = 0, 1, 3, 4, 5

Zone = Mapping[str, tuple[str, ...]]  # lower-case name without the final dot -> IPv4s


def zone_of(services: Iterable[dict[str, Any]], endpoints: Iterable[dict[str, Any]],
            domain: str = DOMAIN) -> dict[str, tuple[str, ...]]:
    """The A records of a cluster, from its Service and Endpoints objects."""
    zone: dict[str, list[str]] = {}
    headless = set()
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec") or {}
        fq = f"{meta['name']}.{meta['namespace']}.svc.{domain}".lower()
        ip = spec.get("clusterIP")
        if ip in (None, "", "None"):
            headless.add(fq)
            zone.setdefault(fq, [])
        elif spec.get("type") != "ExternalName":
            zone[fq] = [ip]
    for ep in endpoints:
        meta = ep["metadata"]
        base = f"{meta['name']}.{meta['namespace']}.svc.{domain}".lower()
        if base not in headless:
            continue
        for subset in ep.get("subsets") or ():
            for addr in subset.get("addresses") or ():
                ip = addr.get("ip")
                if not ip:
                    continue
                if ip not in zone[base]:
                    zone[base].append(ip)
                if addr.get("hostname"):
                    zone.setdefault(f"{addr['hostname']}.{base}".lower(), []).append(ip)
    return {name: tuple(ips) for name, ips in zone.items()}


@dataclass(frozen=True)
class Query:
    ident: int
    flags: int
    name: str  # lower-case, no final dot
    qtype: int
    qclass: int
    question: bytes  # the question section as it came, echoed in the answer


class DnsFormatError(ValueError):
    pass


def parse_query(data: bytes) -> Query:
    """The first question of a DNS query message (RFC 1035 4.1); no compression
    is expected in a question, so a pointer is refused."""
    if len(data) < 12:
        raise DnsFormatError("shorter than a header")
    ident, flags, qdcount = struct.unpack_from("!HHH", data, 0)
    if flags & 0x8000 or qdcount < 1:
        raise DnsFormatError("not a query with a question")
    pos, labels = 12, []
    while True:
        if pos >= len(data):
            raise DnsFormatError("name runs past the end")
        n = data[pos]
        if n & 0xC0:
            raise DnsFormatError("compressed or extended label in a question")
        pos += 1
        if n == 0:
            break
        if pos + n > len(data):
            raise DnsFormatError("label runs past the end")
        labels.append(data[pos:pos + n].decode("ascii", "replace"))
        pos += n
    if pos + 4 > len(data):
        raise DnsFormatError("question without type and class")
    qtype, qclass = struct.unpack_from("!HH", data, pos)
    return Query(ident, flags, ".".join(labels).lower(), qtype, qclass, data[12:pos + 4])


def _header(ident: int, flags: int, rcode: int, qd: int, an: int) -> bytes:
    # QR and AA set; the opcode and RD are echoed; RA clear (no recursion here)
    out_flags = 0x8400 | (flags & 0x7900) | rcode
    return struct.pack("!HHHHHH", ident, out_flags, qd, an, 0, 0)


def answer(zone: Zone, query: Query, domain: str = DOMAIN) -> bytes:
    """The response to `query` from `zone`."""
    opcode = (query.flags >> 11) & 0xF
    if opcode != 0:
        return _header(query.ident, query.flags, RCODE_NOTIMP, 1, 0) + query.question
    name = query.name
    if name != domain and not name.endswith("." + domain):
        return _header(query.ident, query.flags, RCODE_REFUSED, 1, 0) + query.question
    ips = zone.get(name)
    if ips is None:
        # a name under which others exist (e.g. `NS.svc.cluster.local`) is NODATA
        if not any(k.endswith("." + name) for k in zone) and name != domain:
            return _header(query.ident, query.flags, RCODE_NXDOMAIN, 1, 0) + query.question
        ips = ()
    if query.qtype != TYPE_A or query.qclass != CLASS_IN:
        ips = ()
    records = b"".join(struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4)
                       + ipaddress.IPv4Address(ip).packed for ip in ips)
    return _header(query.ident, query.flags, RCODE_OK, 1, len(ips)) + query.question + records


def formerr(data: bytes) -> bytes | None:
    """FORMERR for a message too broken to answer, if it has a header at all."""
    if len(data) < 12:
        return None
    ident, flags = struct.unpack_from("!HH", data, 0)
    return _header(ident, flags, RCODE_FORMERR, 0, 0)


class Source(Protocol):
    def get(self, path: str) -> Any: ...


class ClusterDns:
    """Serves `zone_of` the API's Services and Endpoints on a UDP address; the zone
    is rebuilt every `poll` seconds and handed to the server thread whole."""

    def __init__(self, api: Source, address: str, port: int = 53, poll: float = 0.5) -> None:
        self.api = api
        self.address = address
        self.poll = poll
        self.zone: Zone = {}
        self.errors: list[str] = []
        self.queries = 0
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._threads = [threading.Thread(target=self._refresh, name="dns-zone", daemon=True),
                         threading.Thread(target=self._serve, name="dns-udp", daemon=True)]

    def start(self) -> ClusterDns:
        self.refresh_once()
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t.is_alive():
                t.join(5)
        self._sock.close()

    def refresh_once(self) -> None:
        services = self.api.get("/api/v1/services")["items"]
        endpoints = self.api.get("/api/v1/endpoints")["items"]
        self.zone = zone_of(services, endpoints)  # replaced whole: the server reads a snapshot

    def _refresh(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.refresh_once()
            except Exception as exc:  # noqa: BLE001 - keep the last zone; the test reads errors
                self.errors.append(repr(exc))
                del self.errors[:-20]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1
            try:
                reply: bytes | None = answer(self.zone, parse_query(data))
            except DnsFormatError:
                reply = formerr(data)
            if reply is not None:
                with contextlib.suppress(OSError):
                    self._sock.sendto(reply, peer)
