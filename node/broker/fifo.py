"""A queue's ready messages in packed arrays, not one object each.

A backlog is millions of messages that nobody touches until delivery, all
alike: a place in the Raft log, a size, a priority, a persistence flag and
perhaps an expiry, published through one or a few (exchange, routing key)
pairs. A Python Message per message costs ~250 B of heap; here a plain one
costs 32 B in an array chunk plus an 8 B reference to a shared (exchange,
routing key) tuple (~40 B), and a Message is made again when it reaches the
head (`peek`, `pop`). Messages that are not plain (properties or body held
in memory, already delivered or counted, no place in the log) are kept as
the object itself in the reference slot: rare (dead-lettered, inline in
tests), and nothing about them is lost.

Record (int64 x 4): seq | log index | props offset << 32 | props length |
size << 10 | priority << 2 | persistent << 1 | has expiry. The expiry is a
float (the state's clock) in a per-chunk array made on the first message
that has one, so arithmetic on it stays exact.
"""
from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from node.broker.message import Message

CHUNK = 2048  # records per chunk: a 64 KiB array, freed as the head passes it
_OFFSET_LIMIT = 1 << 31  # a props offset that does not fit a record: keep the object


class _Chunk:
    __slots__ = ("nums", "refs", "exp", "head")

    def __init__(self) -> None:
        self.nums = array("q")
        self.refs: list[Any] = []  # (exchange, routing key), or the Message itself
        self.exp: array[float] | None = None
        self.head = 0  # records before it are gone


class PackedFifo:
    """A FIFO of Messages with deque's few operations the queue uses:
    append, popleft, [0], len, iteration, clear."""

    __slots__ = ("_chunks", "_len", "_head", "_pair", "_transient", "_objects")

    def __init__(self, items: Iterable[Message] = ()) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._len = 0
        self._head: Message | None = None  # the head, made once for peek and pop
        self._pair: tuple[str, str] = ("", "")  # the last pair stored: shared
        self._transient = 0  # messages not persistent (a node's restart drops them)
        self._objects = 0  # messages kept as the object
        for m in items:
            self.append(m)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def append(self, m: Message) -> None:
        loc = m.loc
        if (loc is None or m.props is not None or m.body is not None or m.redelivered
                or m.delivery_count or m.acquired_count or m.deadline is not None
                or (loc >> 32) & 0xFFFFFFFF >= _OFFSET_LIMIT or not 0 <= m.priority < 256):
            c = self._tail()
            c.nums.extend((m.seq, 0, 0, 0))
            c.refs.append(m)
            if c.exp is not None:
                c.exp.append(0.0)
            self._objects += 1
            self._len += 1
            if not m.persistent:
                self._transient += 1
        else:
            self.append_plain(m.seq, m.exchange, m.routing_key, loc >> 64, loc & 0xFFFFFFFFFFFFFFFF,
                              m.size, m.priority, m.persistent, m.expires_at)

    def append_plain(self, seq: int, exchange: str, routing_key: str, idx: int, props_at_len: int,
                     size: int, priority: int, persistent: bool, expires_at: float | None) -> None:
        """A plain message (in the log, never delivered) from its fields, with
        no Message made (snapshot loading). props_at_len: offset << 32 | length,
        the offset below 2**31; priority 0-255."""
        c = self._tail()
        pair = self._pair
        if pair[0] != exchange or pair[1] != routing_key:
            pair = self._pair = (exchange, routing_key)
        c.nums.extend((seq, idx, props_at_len,
                       (size << 10) | (priority << 2) | (2 if persistent else 0) | (expires_at is not None)))
        c.refs.append(pair)
        if expires_at is not None:
            if c.exp is None:
                c.exp = array("d", bytes(8 * (len(c.refs) - 1)))
            c.exp.append(expires_at)
        elif c.exp is not None:
            c.exp.append(0.0)
        self._len += 1
        if not persistent:
            self._transient += 1

    def _tail(self) -> _Chunk:
        chunks = self._chunks
        if not chunks or len(chunks[-1].refs) >= CHUNK:
            chunks.append(_Chunk())
        return chunks[-1]

    def _make(self, c: _Chunk, i: int) -> Message:
        ref = c.refs[i]
        if type(ref) is not tuple:
            return ref  # type: ignore[no-any-return]
        at = 4 * i
        nums = c.nums
        meta = nums[at + 3]
        exp = c.exp[i] if meta & 1 and c.exp is not None else None
        m = Message(nums[at], ref[0], ref[1], None, None, bool(meta & 2), exp,
                    (nums[at + 1] << 64) | nums[at + 2], meta >> 10, (meta >> 2) & 0xFF)
        return m

    def __getitem__(self, k: int) -> Message:
        if k != 0 or not self._len:
            raise IndexError("PackedFifo: only the head is indexed")
        h = self._head
        if h is None:
            c = self._chunks[0]
            h = self._head = self._make(c, c.head)
        return h

    def head_seq(self) -> int:
        """The head's sequence, without making it."""
        h = self._head
        if h is not None:
            return h.seq
        c = self._chunks[0]
        return c.nums[4 * c.head]

    def popleft(self) -> Message:
        if not self._len:
            raise IndexError("pop from an empty PackedFifo")
        c = self._chunks[0]
        m = self._head
        if m is None:
            m = self._make(c, c.head)
        else:
            self._head = None
        if type(c.refs[c.head]) is not tuple:
            self._objects -= 1
        c.refs[c.head] = None  # the object (if one) goes now, not with the chunk
        c.head += 1
        self._len -= 1
        if not m.persistent:
            self._transient -= 1
        if c.head >= len(c.refs):
            self._chunks.popleft()
        return m

    def __iter__(self) -> Iterator[Message]:
        first = True
        for c in self._chunks:
            for i in range(c.head, len(c.refs)):
                if first and self._head is not None:
                    yield self._head
                else:
                    yield self._make(c, i)
                first = False

    def log_indices(self) -> set[int]:
        """The Raft index of every message with a place in the log, read from
        the records' columns (snapshots: the entries they need)."""
        out: set[int] = set()
        for c in self._chunks:
            out.update(c.nums[4 * c.head + 1::4])
        out.discard(0)  # the objects' records
        if self._objects:
            for c in self._chunks:
                for ref in c.refs[c.head:]:
                    if type(ref) is not tuple and ref.loc is not None:
                        out.add(ref.loc >> 64)
        return out

    def columns(self) -> tuple[array[int], array[float] | None, list[Any], int]:
        """The records from the head on, in one piece each: (int64 x 4 per
        message, the expiries or None when no message has one, the references,
        how many are not persistent). A snapshot writes them as they are."""
        nums = array("q")
        refs: list[Any] = []
        exp: array[float] | None = array("d") if any(c.exp is not None for c in self._chunks) else None
        for c in self._chunks:
            h = c.head
            nums.extend(c.nums[4 * h:])
            refs.extend(c.refs[h:])
            if exp is not None:
                if c.exp is None:
                    exp.frombytes(bytes(8 * (len(c.refs) - h)))
                else:
                    exp.extend(c.exp[h:])
        return nums, exp, refs, self._transient

    def column_chunks(self) -> Iterator[tuple[array[int], array[float] | None, list[Any]]]:
        """columns() a chunk at a time, from the head on (a snapshot streams
        them: no copy of the whole index, in a forked writer whose every
        new page is memory the node's limit pays for)."""
        for c in self._chunks:
            h = c.head
            if h == 0:
                yield c.nums, c.exp, c.refs
            else:
                yield c.nums[4 * h:], None if c.exp is None else c.exp[h:], c.refs[h:]

    def has_expiry(self) -> bool:
        return any(c.exp is not None for c in self._chunks)

    @property
    def transient(self) -> int:
        return self._transient

    @classmethod
    def from_columns(cls, nums: array[int], exp: array[float] | None, refs: list[Any],
                     transient: int, objects: int) -> PackedFifo:
        """The inverse of columns(): references are the shared (exchange,
        routing key) tuples, or the Messages kept as objects (their records
        are zeros but for seq)."""
        f = cls()
        n = len(refs)
        chunks = f._chunks
        for a in range(0, n, CHUNK):
            c = _Chunk()
            c.nums = nums[4 * a:4 * (a + CHUNK)]
            c.refs = refs[a:a + CHUNK]
            if exp is not None:
                c.exp = exp[a:a + CHUNK]
            chunks.append(c)
        f._len = n
        f._transient = transient
        f._objects = objects
        return f

    @classmethod
    def from_chunks(cls, parts: Iterable[tuple[array[int], array[float] | None, list[Any]]],
                    transient: int, objects: int) -> PackedFifo:
        """from_columns() for columns already cut into CHUNK-record pieces (a
        snapshot's reader copies each from the file once, not twice)."""
        f = cls()
        chunks = f._chunks
        n = 0
        for nums, exp, refs in parts:
            c = _Chunk()
            c.nums = nums
            c.refs = refs
            c.exp = exp
            chunks.append(c)
            n += len(refs)
        f._len = n
        f._transient = transient
        f._objects = objects
        return f

    def all_persistent(self) -> bool:
        return self._transient == 0

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0
        self._head = None
        self._transient = 0
        self._objects = 0

    def filtered(self, keep: Callable[[Message], bool]) -> tuple[PackedFifo, list[Message]]:
        """(the messages `keep` takes, in order, packed again; the others)."""
        kept = PackedFifo()
        gone: list[Message] = []
        for m in self:
            if keep(m):
                kept.append(m)
            else:
                gone.append(m)
        return kept, gone
