"""The replication layer as the wire sees it (no pysyncobj here).

raft_node.RaftNode implements Proposer; tests may plug in an in-process one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from node.replication.command import Command
from node.replication.effect import Effect
from node.replication.read_model import ReadModel

EffectSink = Callable[[list[Effect]], None]


class Proposer(Protocol):
    def propose(self, cmd: Command, size: int = 0) -> None:
        """Queue `cmd` for the log (batched; FIFO per node). `size` is its
        payload in bytes, for the in-flight bound. Never blocks. The outcome
        arrives as effects through the sink given to the node; a batch that
        could not be committed comes back as failure effects (Confirm
        ack=False for publishes, ChannelError 541 for the rest)."""
        ...

    def is_congested(self) -> bool:
        """True while in-flight batches/bytes are over the bound: the wire
        stops reading from publishers until a drain listener fires."""
        ...

    def add_drain_listener(self, cb: Callable[[], None]) -> None:
        """Called on the event loop when congestion ends."""
        ...

    def blocked_reason(self) -> str | None:
        """Why publishers must be blocked (e.g. this node cannot reach a
        majority), or None."""
        ...

    def read_model(self) -> ReadModel:
        """The replicated state as the event loop may read it: an immutable
        ReadModel, replaced (never mutated) once per Raft tick in which
        something in it changed. Users (name -> (password hash, tags); empty
        on a cluster that has none yet: the node's configured users apply
        then), vhosts, permissions ((user, vhost) -> (configure, write,
        read)), members, in-sync set, draining members (a draining node
        accepts no client connections) and the bytes of message bodies held
        (memory high-watermark). A part that did not change is the same
        object in the next model, so identity tells a cache it is stale."""
        ...

    def add_model_listener(self, cb: Callable[[ReadModel], None]) -> None:
        """`cb(model)` on the event loop whenever users, vhosts or
        permissions changed (e.g. to close connections of deleted users)."""
        ...

    async def queue_rows(self) -> list[dict[str, Any]]:
        """name, vhost, ready, unacked, consumers, durable of every queue, by
        vhost and name, built on the raft thread at its next tick (a fresh
        list for the caller); TimeoutError if the raft thread does not tick."""
        ...
