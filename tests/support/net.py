"""What a process listens on (from /proc), and the machine's addresses: for the
tests that check which address a port binds."""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, IPv4 and IPv6, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            if sys.byteorder == "little":  # printed as 32-bit words in host order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((str(ipaddress.ip_address(raw)), int(hexport, 16)))
    return out


def unmapped(address: str) -> str:
    """An IPv4-mapped IPv6 address (gRPC listens on ::ffff:127.0.0.1) as IPv4."""
    mapped = getattr(ipaddress.ip_address(address), "ipv4_mapped", None)
    return str(mapped) if mapped is not None else address


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # gRPC listens on ::ffff:127.0.0.1
    return bool((mapped or ip).is_loopback)


def non_loopback_ipv4() -> str | None:
    """An address of this machine other than loopback (None if it has none)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for a in out.split():
        if "." in a and not ipaddress.ip_address(a).is_loopback:
            return a
    return None


def connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False
