"""apply_batch: fold one batch of commands into the state.

The Applier is one object whose handlers live in one mixin per concern
(sessions, membership, access, topology, delivery, publish, policy, limit,
cluster); each handler is registered for its command by `handler.handles`.
"""
from __future__ import annotations

from node.broker.ids import ChanId
from node.replication.command import (
    APPLIED,
    Batch,
    Command,
    ExchangeBind,
    ExchangeDeclare,
    PolicyClear,
    PolicySet,
    QueueBind,
    QueueDeclare,
)
from node.replication.effect import ChannelError, ConnectionFailure, Effect
from node.replication.machine.access import AccessHandlers
from node.replication.machine.cluster import ClusterHandlers
from node.replication.machine.dead_letter import DeadLetterHandlers
from node.replication.machine.delivery import DeliveryHandlers
from node.replication.machine.errors import _ChanErr, _ConnErr
from node.replication.machine.handler import HANDLERS
from node.replication.machine.limit import LimitHandlers
from node.replication.machine.membership import MembershipHandlers
from node.replication.machine.outcomes import batch_verdict
from node.replication.machine.policy import PolicyHandlers
from node.replication.machine.publish import PublishHandlers
from node.replication.machine.sessions import SessionHandlers
from node.replication.machine.state import BrokerState
from node.replication.machine.topology import TopologyHandlers
from node.replication.machine.version import VersionHandlers
from node.replication.message_store import PropsReader


class Applier(SessionHandlers, MembershipHandlers, AccessHandlers, TopologyHandlers,
              DeliveryHandlers, PublishHandlers, DeadLetterHandlers, PolicyHandlers, LimitHandlers,
              VersionHandlers, ClusterHandlers):
    """Applies the commands of one batch; collects effects and the queues
    whose delivery may have become possible."""

    __slots__ = ()

    # -- dispatch ---------------------------------------------------------

    def run(self, cmd: Command) -> None:
        handler = HANDLERS[type(cmd)]
        try:
            handler(self, cmd)
        except _ConnErr as e:
            conn = cmd.chan.conn_id  # type: ignore[union-attr]
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, e.code, e.text, *e.ids))
        except _ChanErr as e:
            chan: ChanId = cmd.chan  # type: ignore[union-attr]
            ch = self.s.channels.get(chan)
            if ch is not None:
                self.close_channel(ch)
            self.fx.append(ChannelError(chan, e.code, e.text, *e.ids))
        if self.s.dead_letters and type(cmd) in _ROUTE_CHANGES:
            self.retry_all_dead_letters()  # kept dead letters may have a route now
        if self.dirty:
            self.flush()

    def flush(self) -> None:
        while self.dirty:
            dirty = self.dirty
            self.dirty = {}
            for q in dirty.values():
                self.service(q)


# commands after which kept dead letters are retried at once (Tick retries too)
_ROUTE_CHANGES = frozenset((QueueDeclare, QueueBind, ExchangeDeclare, ExchangeBind, PolicySet,
                            PolicyClear))


def apply_batch(state: BrokerState, batch: Batch, index: int = 0,
                spans: dict[int, tuple[int, int]] | None = None,
                reader: PropsReader | None = None) -> list[Effect]:
    """`index` and `spans` (codec.decode_batch): where the batch sits in the
    Raft log, so that its messages keep locations there instead of bytes;
    `reader` reads the properties of such messages back (dead-lettering)."""
    if batch_verdict(state, batch) != APPLIED:
        return []
    state.dedup[(batch.node, batch.incarnation)] = batch.seq + 1
    if batch.now > state.now:
        state.now = batch.now
    ap = Applier(state, index, spans, reader)
    for cmd in batch.commands:
        ap.run(cmd)
    return ap.fx
