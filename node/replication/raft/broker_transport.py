"""BrokerTransport: the shim's part of the peer transport (link/transport.py).

It holds a follower's AppendEntries acknowledgements (next_node_idx) until
the tick's journal flush (release_held: the group commit of shim.py), routes
our own messages (messages.py) to the shim, drops RequestVote while a live
leader is known (Raft thesis §4.2.3), and marks a peer whose link breaks
(reset, EOF, connect refused) `lost` (lost_at) until it links again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pysyncobj.monotonic import monotonic as clock
from pysyncobj.tcp_connection import CONNECTION_STATE

from node.replication.machine.version import FIRST_VERSION
from node.replication.raft.link.connection import LOST_REASONS
from node.replication.raft.link.transport import PeerTransport
from node.replication.raft.messages import MIRRORED, PREVOTE, PREVOTE_REPLY, TERM_NOTICE

if TYPE_CHECKING:
    from node.replication.raft.shim import _BrokerLog


class BrokerTransport(PeerTransport):
    """Holds AppendEntries acks until the journal is flushed; carries the
    leader's mirrored index, PreVote and term notices; drops RequestVote
    while a live leader is known (Raft thesis §4.2.3)."""

    def __init__(self, syncobj: _BrokerLog, self_node: Any, other_nodes: Any) -> None:
        self._held: list[tuple[Any, dict[str, Any]]] = []
        self._owner = syncobj._owner
        self._syncobj_ref = syncobj
        self.security = syncobj._owner.peer_security
        # node -> when its link broke (reset, EOF, refused), until it links again
        self.lost_at: dict[Any, float] = {}
        super().__init__(syncobj, self_node, other_nodes)

    def _onDisconnected(self, conn: Any) -> None:  # noqa: N802
        node = self._connToNode(conn)
        if node is not None:
            self._owner.peer_versions.pop(node, None)  # unknown until it answers again (U2)
        if node is not None and getattr(conn, "close_reason", "") in LOST_REASONS \
                and node not in self.lost_at:
            self.lost_at[node] = clock()
            self._owner._on_link_lost(node)
        super()._onDisconnected(conn)

    def _connectIfNecessarySingle(self, node: Any) -> bool:  # noqa: N802
        ok = bool(super()._connectIfNecessarySingle(node))
        conn = self._connections.get(node)
        if not ok and conn is not None and conn.state == CONNECTION_STATE.DISCONNECTED \
                and getattr(conn, "close_reason", "") == "refused" and node not in self.lost_at:
            self.lost_at[node] = clock()  # refused at once (no listener: the process is gone)
            self._owner._on_link_lost(node)
        return ok

    def _onNodeConnected(self, node: Any) -> None:  # noqa: N802
        self.lost_at.pop(node, None)
        super()._onNodeConnected(node)

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "next_node_idx":
            if message.get("reset") and not message.get("success"):
                # pysyncobj answers a mismatch with "my last index + 1" or "one
                # before yours"; under load, answers to older in-flight appends
                # keep resetting the leader's nextIndex up again and the walk
                # back never ends. Everything up to our commit index is in the
                # leader's log (Raft), so send it straight there.
                floor = self._syncobj_ref.raftCommitIndex + 1
                if message["next_node_idx"] > floor:
                    message = dict(message, next_node_idx=floor)
            # the machine version we run, for the leader's upgrade planner (a
            # key older builds ignore; absent from theirs: version 1)
            message["mq_machine"] = self._owner.config.machine_version
            self._held.append((node, message))  # all of them, to keep their order
            return True
        if kind == "request_vote" and self._owner._campaign_transfer:
            message = dict(message, transfer=True)  # asked for by the leader (TimeoutNow)
        return bool(super().send(node, message))

    def release_held(self) -> None:
        held, self._held = self._held, []
        for node, message in held:
            super().send(node, message)

    def send_raw(self, node: Any, message: dict[str, Any]) -> None:
        super().send(node, message)

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        owner = self._owner
        kind = message.get("type")
        if kind == MIRRORED:
            owner._on_mirrored(int(message["index"]))
            return
        if kind in ("request_vote", PREVOTE) and owner.repair_until:
            owner.ignored_votes += 1  # forgot a damaged log: may lack entries it acknowledged
            return
        if kind == "request_vote" and int(message.get("term", 0) or 0) <= owner.vote_floor:
            owner.ignored_votes += 1  # a term it may have voted in before its meta file was damaged
            return
        if kind == PREVOTE:
            owner._on_prevote(node, message)
            return
        if kind == PREVOTE_REPLY:
            owner._on_prevote_reply(node, message)
            return
        if kind == TERM_NOTICE:
            owner._on_term_notice(node, message)
            return
        if kind == "next_node_idx":
            version = message.get("mq_machine", FIRST_VERSION)
            if type(version) is int and version >= FIRST_VERSION:
                owner.peer_versions[node] = version
        if kind == "request_vote" and not message.get("transfer") and owner._leader_alive():
            owner.ignored_votes += 1
            return
        if kind == "append_entries":
            if "transmission" in message:
                return  # pysyncobj's pickled chunking: never sent by us, never unpickled
            if not owner._on_append_term(node, message):
                return
            if "serialized" in message and not owner._snapshot_moves_forward(node, message):
                return
            if message.get("entries") and "prevLogIdx" in message:
                message = owner._trim_append(node, message)
                if message is None:
                    return
            try:
                super()._onMessageReceived(node, message)
            except OSError as exc:
                # the log could not take the entries (a full disk: ENOSPC
                # before the write): the ones before the failing one are in the
                # log, no ack is sent for this append, the leader resends and
                # its in-sync planner marks us lagging (I5) until space is back
                owner._on_journal_error("append", exc)
            return
        super()._onMessageReceived(node, message)
