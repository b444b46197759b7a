"""Handlers for channels, connections and nodes coming and going:
open/close, channel.flow, NodeUp/NodeDown, and the Echo reply.
"""
from __future__ import annotations

from node.broker.channel import Channel
from node.broker.ids import ConnId
from node.broker.reply import (
    BASIC_QOS,
    BASIC_RECOVER,
    CHANNEL_CLOSE,
    CHANNEL_FLOW,
    CONFIRM_SELECT,
    TX_ROLLBACK,
    TX_SELECT,
)
from node.replication.command import (
    ChannelClose,
    ChannelFlow,
    ChannelOpen,
    ConnectionClose,
    Echo,
    NodeDown,
    NodeUp,
)
from node.replication.effect import ConnectionFailure
from node.replication.machine.handler import ApplierBase, handles

_ECHO_IDS = {"Confirm.SelectOk": CONFIRM_SELECT, "Tx.SelectOk": TX_SELECT, "Tx.RollbackOk": TX_ROLLBACK,
             "Basic.QosOk": BASIC_QOS, "Basic.RecoverOk": BASIC_RECOVER,
             "Channel.FlowOk": CHANNEL_FLOW, "Channel.CloseOk": CHANNEL_CLOSE}


class SessionHandlers(ApplierBase):
    __slots__ = ()

    # -- channels and connections -------------------------------------------

    @handles(ChannelOpen)
    def channel_open(self, cmd: ChannelOpen) -> None:
        s = self.s
        if cmd.chan in s.channels:
            return
        if cmd.vhost not in s.vhosts:  # deleted between connection.open and now
            conn = cmd.chan.conn_id
            self.close_connection(conn)
            self.fx.append(ConnectionFailure(conn, 530, f"NOT_ALLOWED - vhost {cmd.vhost} not "
                                                      f"found", 20, 10))
            return
        s.channels[cmd.chan] = Channel(cmd.chan, cmd.vhost)
        s.conns.setdefault(cmd.chan.conn_id, {})[cmd.chan] = None
        self.count_channel(cmd.chan, 1)

    @handles(ChannelClose, reply=lambda c: CHANNEL_CLOSE if c.reply else None)
    def channel_close(self, cmd: ChannelClose) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        self.close_channel(ch)
        if cmd.reply:
            self.reply(cmd.chan, "Channel.CloseOk")

    def close_channel(self, ch: Channel, failed: bool = True) -> None:
        """Drop consumers, requeue every unacked delivery (S08): as failed
        deliveries (a quorum queue's x-delivery-count) unless `failed` is
        False (the cluster, not the client, ended it)."""
        s = self.s
        self.count_channel(ch.id, -1)
        del s.channels[ch.id]
        conn = ch.id.conn_id
        chans = s.conns.get(conn)
        if chans is not None:
            chans.pop(ch.id, None)
            if not chans:
                del s.conns[conn]
        for c in list(ch.consumers.values()):
            self.remove_consumer(c)
        unacked = ch.unacked
        ch.unacked = {}
        ch.limited_unacked = 0
        for q, m, _ in unacked.values():
            self.requeue(q, m, failed)

    def close_connection(self, conn: ConnId, failed: bool = True) -> None:
        s = self.s
        for chan in list(s.conns.get(conn, ())):
            self.close_channel(s.channels[chan], failed)
        for qname in list(s.exclusive.get(conn, ())):
            q = s.queues.get(qname)
            if q is not None:
                self.delete_queue(q)
        s.exclusive.pop(conn, None)
        self.forget_connection(conn)

    @handles(ConnectionClose)
    def connection_close(self, cmd: ConnectionClose) -> None:
        self.close_connection(cmd.conn)

    @handles(ChannelFlow, reply=lambda c: CHANNEL_FLOW)
    def channel_flow(self, cmd: ChannelFlow) -> None:
        ch = self.s.channels.get(cmd.chan)
        if ch is None:
            return
        ch.flow = cmd.active
        self.reply(cmd.chan, "Channel.FlowOk", {"active": cmd.active})
        if cmd.active:
            self.mark_channel_queues(ch)

    def mark_channel_queues(self, ch: Channel) -> None:
        for c in ch.consumers.values():
            self.dirty[c.queue.name] = c.queue

    @handles(NodeUp)
    def node_up(self, cmd: NodeUp) -> None:
        s = self.s
        node = cmd.node
        conns = [c for c in s.conns if c.node == node]
        for conn in conns:
            self.close_connection(conn)
        for conn in [c for c in s.exclusive if c.node == node]:
            self.close_connection(conn)
        for conn in [c for c in s.connections if c.node == node]:
            self.close_connection(conn)
        for q in [q for q in s.queues.values() if q.home == node]:
            if not q.durable:
                self.delete_queue(q)
                continue
            # transient messages go, the others stay where they are
            for m in q.keep_persistent():
                self.drop(m)
        for x in [x for x in s.exchanges.values() if x.home == node and not x.durable]:
            self.delete_exchange(x)
        for key in [k for k in s.dedup if k[0] == node and k[1] != cmd.incarnation]:
            del s.dedup[key]

    @handles(NodeDown)
    def node_down(self, cmd: NodeDown) -> None:
        """Drop the node's connections (S25): their unacked deliveries return to
        their queues redelivered and reach consumers on other nodes (flushed
        after this command). Unlike NodeUp, queues and transient messages
        stay: the node may come back, and every node holds every queue."""
        self.drop_connections_of(cmd.node, f"CONNECTION_FORCED - node {cmd.node} was declared down "
                                           "by the cluster")

    def drop_connections_of(self, node: str, text: str) -> None:
        """Close the connections of a node declared down, removed or
        draining. Their deliveries return uncounted: RabbitMQ 4.3 returns a
        disconnected node's checked-out messages with delivery_failed false
        (rabbit_fifo, consumer_disconnected_timeout): the consumer may be
        well, cut off by the cluster."""
        s = self.s
        conns = dict.fromkeys(c for c in s.conns if c.node == node)
        for c in s.exclusive:
            if c.node == node:
                conns[c] = None
        for c in s.connections:  # channel-less ones too
            if c.node == node:
                conns[c] = None
        for conn in conns:
            self.close_connection(conn, failed=False)
            self.fx.append(ConnectionFailure(conn, 320, text, 0, 0))

    @handles(Echo, reply=lambda c: _ECHO_IDS.get(c.method, (0, 0)))
    def echo(self, cmd: Echo) -> None:
        if cmd.chan in self.s.channels:
            self.reply(cmd.chan, cmd.method, dict(cmd.fields))
