"""The data dir is private to the node: the directory 0700, every file 0600.

The journal holds every message body and the users' password hashes; the
snapshot the whole state. Modes are set explicitly (no process-wide umask:
that would also change files the process creates elsewhere). pysyncobj
creates some files itself with the default mode (the journal, a snapshot
received from the leader): tighten() after it has, and at every start (a data
dir written by an older build, or loosened by the kubelet's fsGroup walk).
"""
from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def wanted_mode(mode: int) -> int | None:
    """The permission bits a data-dir entry of st_mode `mode` should have, or None
    when it has them (or is neither a file nor a directory)."""
    want = PRIVATE_DIR if stat.S_ISDIR(mode) else PRIVATE_FILE if stat.S_ISREG(mode) else None
    if want is None or stat.S_IMODE(mode) == want:
        return None
    return want


@dataclass
class Tightened:
    changed: list[str] = field(default_factory=list)  # "path (0644)"
    foreign: list[str] = field(default_factory=list)  # loose, but not ours to change


def tighten(path: str) -> Tightened:
    """Set every directory under `path` (itself included) 0700 and every file
    0600, where this user owns them; symlinks are not followed."""
    out = Tightened()
    me = os.geteuid()
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, f) for f in files + dirs)]:
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            want = wanted_mode(st.st_mode)
            if want is None:
                continue
            shown = f"{name} ({stat.S_IMODE(st.st_mode):04o})"
            if st.st_uid != me:
                out.foreign.append(shown)
                continue
            os.chmod(name, want, follow_symlinks=False)
            out.changed.append(shown)
    return out


def make_private_dir(path: str) -> None:
    """Create the data dir 0700, or tighten the one there (and its files), with a log line."""
    os.makedirs(path, mode=PRIVATE_DIR, exist_ok=True)
    done = tighten(path)
    if done.changed:
        log.warning("data dir %s: made private (directories 0700, files 0600): %s",
                    path, ", ".join(done.changed[:10]) + (" ..." if len(done.changed) > 10 else ""))
    if done.foreign:
        # e.g. a volume's root owned by root, group-writable for the pod's fsGroup
        log.info("data dir %s: not owned by this user (uid %d), left as is: %s", path, os.geteuid(), ", ".join(done.foreign[:10]))


def open_private(path: str) -> int:
    """A file descriptor of `path` for writing, created or truncated, mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # an existing file keeps its mode through O_CREAT
    return fd
