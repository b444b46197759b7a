"""Whether a host is on loopback: one function, two rules.

A peer's address (`peer=True`), as a socket reports it, decides RabbitMQ's
loopback_users rule (guest logs in only from this machine, on AMQP and on
the management API): an IP only, a zone id ignored, an IPv4-mapped IPv6
address taken as its IPv4 one; no address (None, "") is not loopback.

A configured host (`peer=False`), as the operator wrote it (a listen
address, the raft bind host, a member's address), decides whether a port is
exposed beyond this machine: "localhost" counts, IPv6 may be in brackets.
"""
from __future__ import annotations

import ipaddress


def is_loopback(host: str | None, *, peer: bool) -> bool:
    """`host` is on loopback, by the peer-address rule or the configured-host
    rule (module docstring)."""
    if not host:
        return False
    if not peer:
        host = host.strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)
