"""The replication layer as the wire sees it (no pysyncobj here).

raft_node.RaftNode implements Proposer; tests may plug in an in-process one.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from node.replication.command import Command
from node.replication.effect import Effect

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

    def message_bytes(self) -> int:
        """Bytes of message bodies held in queues (memory high-watermark)."""
        ...

    def draining(self) -> bool:
        """True while this node is in maintenance mode (SetDraining): the wire
        accepts no client connections."""
        ...

    def users(self) -> Mapping[str, tuple[str, tuple[str, ...]]]:
        """The replicated users: name -> (password hash, tags); empty on a
        cluster that has none yet (the node's configured users apply then)."""
        ...

    def vhosts(self) -> Mapping[str, None]:
        """The replicated vhosts (always at least "/" until it is deleted)."""
        ...

    def permissions(self) -> Mapping[tuple[str, str], tuple[str, str, str]]:
        """(user, vhost) -> (configure, write, read) patterns; replaced, never
        mutated, on every change (so identity tells a cache it is stale)."""
        ...
