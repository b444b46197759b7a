"""What a batch comes to besides its effects: its verdict (applied,
duplicate, gap), the effects owed when it could not be committed, and
the effects owed after a snapshot skipped entries.
"""
from __future__ import annotations

from typing import Any

from node.broker.ids import ChanId, ConnId
from node.replication.command import APPLIED, DUPLICATE, GAP, BasicPublish, Batch, TxCommit
from node.replication.effect import ChannelError, Confirm, ConnectionFailure, Effect
from node.replication.machine.handler import REPLY_IDS
from node.replication.machine.state import BrokerState


def batch_verdict(state: BrokerState, batch: Batch) -> str:
    """What apply_batch makes of `batch`: APPLIED (next in its proposer's
    order), DUPLICATE (applied before: ignored) or GAP (an earlier batch of
    the same (node, incarnation) has not applied yet: ignored, and the
    proposer resends from the missing one). Each node's batches apply strictly
    in order so that a channel's commands never overtake each other. Pure,
    the same on every node."""
    expected = state.dedup.get((batch.node, batch.incarnation), 1)
    if batch.seq < expected:
        return DUPLICATE
    return GAP if batch.seq > expected else APPLIED


SKIPPED_TEXT = ("CONNECTION_FORCED - this node installed a snapshot past changes it had not applied "
                "yet; replies, confirms or deliveries for this connection may be among them: reconnect")


def skipped_effects(old: BrokerState, new: BrokerState, node: str, incarnation: int) -> list[Effect]:
    """What `node` owes its clients after a snapshot from the leader replaced
    `old` with `new`: the entries between them were never applied here, so
    their effects (replies, confirms, deliveries, cancels) never left. Each
    connection of this node whose effects may be among them is closed with
    320, as a node that loses its state would: the client reconnects,
    republishes what was not confirmed, and what it had unacked is requeued
    when the close applies. Untouched connections stay open. Pure."""
    ours = (node, incarnation)
    all_mine = new.dedup.get(ours, 1) != old.dedup.get(ours, 1)  # our commands applied: replies lost
    conns = dict.fromkeys(c for st in (old, new) for c in st.conns if c.node == node)
    return [ConnectionFailure(c, 320, SKIPPED_TEXT, 0, 0) for c in conns
            if all_mine or _connection_view(old, c) != _connection_view(new, c)]


def _connection_view(st: BrokerState, conn: ConnId) -> tuple[Any, ...] | None:
    """What a connection's clients have seen happen: its channels, each one's
    next delivery tag and consumers. None: the connection is not open."""
    chans = st.conns.get(conn)
    if chans is None:
        return None
    out = []
    for c in chans:
        ch = st.channels.get(c)
        if ch is not None:
            out.append((c, ch.next_tag, tuple(ch.consumers)))
    return tuple(out)


def failure_effects(batch: Batch) -> list[Effect]:
    """Effects for a batch that could not be committed: nack every confirmed
    publish (S16) and fail each channel that waits for a reply (541)."""
    fx: list[Effect] = []
    failed: dict[ChanId, None] = {}
    for cmd in batch.commands:
        if isinstance(cmd, BasicPublish):
            if cmd.seq > 0:
                fx.append(Confirm(cmd.chan, cmd.seq, False))
            continue
        if isinstance(cmd, TxCommit):
            for sub in cmd.commands:
                if isinstance(sub, BasicPublish) and sub.seq > 0:
                    fx.append(Confirm(sub.chan, sub.seq, False))
        ids_of = REPLY_IDS.get(type(cmd))
        if ids_of is None:
            continue
        ids = ids_of(cmd)
        chan: ChanId = cmd.chan  # type: ignore[union-attr]
        if ids is None or chan in failed:
            continue
        failed[chan] = None
        fx.append(ChannelError(chan, 541, "INTERNAL_ERROR - could not replicate", *ids))
    return fx
