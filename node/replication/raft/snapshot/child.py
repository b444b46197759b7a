"""The forked snapshot writer: a child forked between two applies (a
copy-on-write view of the state) writes the snapshot, syncs it and leaves,
so the raft thread never stalls on a large state (SnapshotMixin._serialize
forks it, _check_snapshot installs its file).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections.abc import Callable
from typing import Any, NoReturn

from node.replication.machine.state import BrokerState
from node.replication.raft.data_dir import open_private
from node.replication.raft.snapshot.raft_data import raft_meta
from node.replication.raft.snapshot.writer import write_snapshot
from node.replication.raft.storage_fault import child_status

_PR_SET_PDEATHSIG = 1
try:  # resolved here: no dlopen in a child forked from a threaded process
    _libc_prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):  # not Linux / glibc
    _libc_prctl = None


def _die_with_parent(parent: int) -> None:
    """In a forked child: be SIGKILLed when the thread that forked it (the raft
    thread, alive as long as the node) ends; exit at once if the node is
    already gone. Linux only, a no-op elsewhere."""
    if _libc_prctl is None:
        return
    _libc_prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL
    if os.getppid() != parent:
        os._exit(1)


def _close_sockets() -> None:
    """In a forked child: close every socket it inherited (listening AMQP,
    HTTP, admin and Raft ports, client links). A SIGKILLed node's child
    dies with it, but tearing down a copy of a large heap takes a while,
    and meanwhile the restarted node's bind failed ("Address already in use")
    or a connect reached the dying child's listener and was refused."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)


def write_in_child(parent: int, part: str, snapshot_state: Callable[[], BrokerState],
                   raft_data: Any) -> NoReturn:
    """The forked child (no threads, no loop): write the snapshot of the
    state (the owner's snapshot_state) to `part`, sync it, leave (exit
    status 0 once it is synced; after an OSError its errno in the status,
    storage_fault.child_status: the parent decides, a child must not log)."""
    code = 1
    try:
        # die with the node: an orphan would keep the node's listening
        # sockets (inherited) while it writes, and the restarted node
        # could not bind its ports ("Address already in use": a SIGKILLed
        # node under load, its child writing a 1.3 GB snapshot, chaos
        # kill_during_snapshot / issue 16)
        _die_with_parent(parent)
        _close_sockets()
        # every member compacts at about the same entry count: at full
        # priority three children starve the raft threads on a small
        # machine into missed heartbeats and an election
        os.nice(19)
        with os.fdopen(open_private(part), "wb") as f:  # 0600: private data dir
            # messages as their places in the log: no body is read or written
            write_snapshot(f, snapshot_state(), raft_meta(raft_data))
            f.flush()
            os.fsync(f.fileno())
        code = 0
    except BaseException as exc:  # noqa: BLE001 - said by the exit status, to the parent
        code = child_status(exc)
    finally:
        os._exit(code)
