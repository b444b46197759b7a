"""The Raft meta file (`raft.journal.meta`, beside the log): term, vote and
commit index.

- FsyncMetaStorer: term and vote fsync'd before they are acted on (Raft §5.2),
  the commit index stored without a sync; in our codec (pysyncobj pickles the
  meta file; an older build's pickled one is parsed without unpickling:
  legacy_meta);
- encode_meta/decode_meta: the file's bytes, magic and version from
  node/replication/format.py (META, META_V1_MAGIC).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickletools
from typing import Any

from crc32c import crc32c
from pysyncobj.journal import MetaStorer

from node.replication import format
from node.replication.codec import CodecError, decode, encode
from node.replication.raft.data_dir import open_private
from node.replication.raft.log.fs import _fsync_dir
from node.replication.raft.storage_fault import FSYNC, guarded, stop_if_fatal

log = logging.getLogger(__name__)


class FsyncMetaStorer(MetaStorer):  # type: ignore[misc]
    """Term and vote must be durable before a vote is granted (Raft §5.2):
    a change of either is fsync'd (file and directory). pysyncobj also
    stores the commit index once a second; that needs no sync (a stale one
    is re-learned from the leader), and two fsyncs a second on the raft
    thread stalled it for hundreds of ms under write load. Its bytes are
    fdatasync'd all the same (one small file, no directory sync): it replaces
    the term/vote file, and any later fsync of the directory (a snapshot's)
    makes that name durable; unsynced bytes behind it left an empty meta file
    after a power loss: term 0, no vote (harness.lazyfs showed it)."""

    _durable: tuple[Any, Any] | None = None
    damaged = False  # getMeta found the file unreadable: the vote this node cast is unknown

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 - pysyncobj's name
        path = self.getPath()
        tmp = path + ".tmp"
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        sync = vote != self._durable
        op = "create"
        try:
            with os.fdopen(open_private(tmp), "wb") as f:  # 0600: the data dir is private
                op = "write"
                f.write(encode_meta(meta))
                f.flush()
                op = FSYNC
                if sync:
                    os.fsync(f.fileno())
                else:
                    os.fdatasync(f.fileno())
        except OSError as exc:
            # the directory gone (ENOENT), EIO, EROFS, any failed sync: stop (issue 46);
            # only a full disk goes on as below
            stop_if_fatal(tmp, op, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if sync:
                raise  # a term/vote that is not durable must not be acted on
            # only the commit index (once a second from pysyncobj's tick): on a
            # full disk it was an exception that cut every such tick short;
            # skipping it is safe (a stale commit index is re-learned)
            log.warning("journal meta: commit index not stored: %s", exc)
            return
        with guarded(tmp, "rename"):
            os.replace(tmp, path)
        if sync:
            _fsync_dir(os.path.dirname(path) or ".")
            self._durable = vote

    def getMeta(self) -> dict[str, Any]:  # noqa: N802 - pysyncobj's name
        try:
            with open(self.getPath(), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            return decode_meta(data)
        except ValueError as exc:
            # what pysyncobj does with a meta file it cannot read (start from term 0),
            # but said
            self.damaged = True
            log.error("journal meta %s unreadable (%s): starting from term 0, no vote",
                      self.getPath(), exc)
            return {}


# version 2 ends with a CRC32C of what precedes it: a flipped bit in version 1
# decoded as a term of 7e16 (adopted by the whole cluster) or could raise the
# commit index past what was committed (chaos corruption, issue 29)
META_MAGIC = format.META.magic
META_MAGIC_V1 = format.META_V1_MAGIC  # (read: written by an older build)
_META_KEYS = ("currentTerm", "votedForNodeId", "raftCommitIndex")


def encode_meta(meta: dict[str, Any]) -> bytes:
    body = META_MAGIC + encode({k: meta[k] for k in _META_KEYS if k in meta})
    return body + crc32c(body).to_bytes(4, "little")


def decode_meta(data: bytes) -> dict[str, Any]:
    """The meta file's dict; ValueError if it is not one (or fails its checksum)."""
    if data.startswith(META_MAGIC):
        if len(data) < len(META_MAGIC) + 4 or crc32c(data[:-4]) != int.from_bytes(data[-4:], "little"):
            raise ValueError("checksum mismatch")
        data = data[:-4]
    if data.startswith(META_MAGIC) or data.startswith(META_MAGIC_V1):
        try:
            meta = decode(data, len(META_MAGIC))
        except CodecError as exc:
            raise ValueError(str(exc)) from None
    else:
        meta = legacy_meta(data)
    if not (isinstance(meta, dict) and set(meta) <= set(_META_KEYS)
            and all(type(v) is int for k, v in meta.items() if k != "votedForNodeId")
            and type(meta.get("votedForNodeId")) in (str, type(None))):
        raise ValueError("not a journal meta table")
    return meta


# pickle opcodes a pickled {str: int | str | None} is made of, and nothing else
_PUSH = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "BININT", "BININT1",
         "BININT2", "LONG1", "LONG4", "INT", "LONG"}


def legacy_meta(data: bytes) -> dict[str, Any]:
    """The meta dict an older build wrote with pysyncobj's pickle, read by
    walking its opcodes (pickletools.genops only parses: nothing is imported,
    called or constructed). Any opcode outside a plain table of strings,
    integers and None is a ValueError."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                break
            if name == "EMPTY_DICT":
                stack.append({})
            elif name in _PUSH:
                stack.append(arg)
            elif name == "NONE":
                stack.append(None)
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(str(arg))] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[int(str(arg))])
            elif name == "SETITEM":
                v, k = stack.pop(), stack.pop()
                stack[-1][k] = v
            elif name == "SETITEMS":
                at = marks.pop()
                items, stack[at:] = stack[at:], []
                stack[-1].update(zip(items[::2], items[1::2], strict=True))
            else:
                raise ValueError(f"pickle opcode {name} in a journal meta file")
    except (IndexError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed pickle: {exc!r}") from None
    if len(stack) != 1:
        raise ValueError("malformed pickle")
    return stack[0]  # type: ignore[no-any-return]
