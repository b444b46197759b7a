"""SnapshotReceiver: pysyncobj's Serializer, swapped in by the shim, that
sends our snapshot (with the entries it needs, transfer.py) to a follower
and receives the leader's into a private file, read in full before it
replaces ours.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import IO, Any

from pysyncobj.serializer import Serializer

from node.replication.raft.data_dir import open_private
from node.replication.raft.log import LogDamaged, SegmentLog
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.snapshot.envelope import SnapshotFormatError
from node.replication.raft.snapshot.transfer import _Outgoing
from node.replication.raft.storage_fault import FSYNC, guarded, stop_if_fatal

log = logging.getLogger("node.replication.raft.snapshot")  # the package's: log lines as before


class SnapshotReceiver(Serializer):  # type: ignore[misc]
    """pysyncobj's Serializer, swapped in by the shim, receiving a snapshot
    from the leader: the file is created 0600 (pysyncobj's open() gave 0644
    while it arrived), synced, and read in full (checksum, format) before it
    replaces our own snapshot; a bad one is deleted and refused (the leader
    sends it again from its first chunk)."""

    accept: Callable[[str, str], bool]  # (received file, dump path) -> install it?
    own_damaged: Callable[[str], None]  # (why) our snapshot file fails its check: write a new one
    journal: SegmentLog  # where the entries a snapshot needs are read from
    _incoming: IO[bytes] | None = None
    _outgoing: dict[Any, _Outgoing]

    # ---- sending (leader): the snapshot file, then the log entries it needs
    def getTransmissionData(self, transmissionID: Any) -> Any:  # noqa: N802 - pysyncobj's name
        if self._Serializer__pid != 0:  # a snapshot being written
            return None
        outgoing = self.__dict__.setdefault("_outgoing", {})
        out = outgoing.get(transmissionID)
        first = out is None
        try:
            if out is None:
                out = outgoing[transmissionID] = _Outgoing(self._Serializer__fileName, self.journal)
            chunk = out.chunk(self._Serializer__transmissionBatchSize)
        except (OSError, IndexError, LogDamaged, SnapshotFormatError) as exc:
            if isinstance(exc, OSError):  # (our snapshot file: EIO, the data dir gone)
                stop_if_fatal(self._Serializer__fileName, "read", exc)
            outgoing.pop(transmissionID, None)
            if out is not None:
                out.close()
            log.error("cannot send the snapshot to %s: %s", transmissionID, exc)
            if isinstance(exc, SnapshotFormatError):
                # the follower would refuse every copy of this file, until the next
                # snapshot (minutes): write one now (chaos corruption, issue 29)
                self.own_damaged(str(exc))
            return None
        last = not chunk
        if last:
            outgoing.pop(transmissionID).close()
        return chunk, first, last

    def cancelTransmisstion(self, transmissionID: Any) -> None:  # noqa: N802 - pysyncobj's (misspelt) name
        out = self.__dict__.get("_outgoing", {}).pop(transmissionID, None)
        if out is not None:
            out.close()

    # ---- receiving (follower)

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802 - pysyncobj's name
        if not (isinstance(data, list | tuple) and len(data) == 3 and isinstance(data[0], bytes)):
            return False
        chunk, first, last = data
        path: str = self._Serializer__fileName
        tmp = path + ".1.tmp"
        if first:
            self._drop_incoming(None)
            try:
                self._incoming = os.fdopen(open_private(tmp), "wb")
            except OSError as exc:
                stop_if_fatal(tmp, "create", exc)
                log.error("cannot receive the leader's snapshot: %s", exc)
                return False
        f = self._incoming
        if f is None:
            return False  # a chunk after a failure or without the first one
        op = "write"
        try:
            f.write(chunk)
            if not last:
                return False
            f.flush()
            op = FSYNC
            os.fsync(f.fileno())
            f.close()
        except OSError as exc:
            stop_if_fatal(tmp, op, exc)  # (ENOSPC: refused, the leader sends it again)
            log.error("cannot receive the leader's snapshot: %s", exc)
            self._drop_incoming(tmp)
            return False
        self._incoming = None
        if not self.accept(tmp, path):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        with guarded(tmp, "rename"):
            os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path) or ".")
        return True

    def _drop_incoming(self, tmp: str | None) -> None:
        f, self._incoming = self._incoming, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
