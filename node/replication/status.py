"""NodeStatus: one immutable, typed snapshot of a node's Raft and broker figures.

RaftNode.status() builds it on the caller's thread from the read model and
counters (its peers from the last RaftView: peer_rows); the app adds what only it knows (connections, AMQP ports) and the
management API the members' addresses, each with `dataclasses.replace`. Typed
readers use the attributes; the generic ones (the gRPC Status message, the
Prometheus text, JSON) take `to_dict()`, whose keys and order are the wire
contract (docs/operations.md, node/admin/admin.proto).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.replication.view import RaftView


@dataclass(frozen=True, slots=True)
class PeerStatus:
    """Another Raft member as this node's last tick saw it (match indexes and
    reply ages mean something on the leader only)."""

    member: str | None
    address: str
    match_index: int
    connected: bool
    lost: bool
    reply_age: float | None
    machine_version: int = 0  # leader: the version its build runs, as it told us (0: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "address": self.address, "match_index": self.match_index,
                "connected": self.connected, "lost": self.lost, "reply_age": self.reply_age,
                "machine_version": self.machine_version}


def peer_rows(view: RaftView | None, member_id: Callable[[str], str | None]
              ) -> tuple[PeerStatus, ...]:
    """Every other Raft node as this node's last tick saw it (the leader's
    match indexes and reply times are meaningful on the leader only)."""
    if view is None:
        return ()
    return tuple(PeerStatus(p.member or member_id(p.address), p.address, p.match_index,
                            p.connected, p.lost,
                            round(max(0.0, view.now - p.last_reply), 3)
                            if p.last_reply else None, p.machine_version)
                 for p in view.peers)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: str
    role: str  # follower, candidate, leader
    leader: str | None
    term: int | None
    commit_index: int | None
    last_applied: int | None
    log_len: int | None
    members: list[str]
    in_sync: list[str]
    draining: list[str]
    has_quorum: bool
    mirrored_index: int
    blocked: bool
    pending_batches: int
    resends: int
    nacked_publishes: int
    failed_batches: dict[str, int]
    queues: int
    journal_flushes: int
    snapshots: int
    last_snapshot_seconds: float
    last_snapshot_bytes: int
    applied_batches: int
    message_bytes: int
    published: int
    confirmed: int
    nacked: int
    delivered: int
    redelivered: int
    acked: int
    leader_changes: int
    deferred_elections: int
    prevote_rounds: int
    ignored_votes: int
    fast_elections: int
    peer_rejects: int
    peer_mac_failures: int  # authenticated frames whose MAC failed (each closed its link)
    peer_tls: bool
    encoded_appends: int
    longest_raft_stall_ms: float
    longest_flush_ms: float
    journal_write_errors: int
    journal_flush_errors: int
    installed_snapshots: int
    refused_snapshots: int
    damaged_snapshots: int  # leader's snapshots refused here: they did not read back (checksum, format)
    failed_snapshots: int  # own snapshot writers that failed (not fatally: retried with a backoff)
    log_segments: int  # segment files of the log (Raft's part and those kept for messages)
    log_compactions: int  # mostly-dead segments whose live records were rewritten
    skipped_closes: int
    longest_fork_ms: float
    longest_owner_tick_ms: float
    forced_compactions: int
    longest_leader_gap_ms: float  # follower: longest silence between AppendEntries received
    longest_send_gap_ms: float  # leader: longest time between AppendEntries sent to one follower
    in_sync_size: int
    machine_version: int  # the cluster's, as applied here (node/replication/machine/version.py)
    runs_machine_version: int  # this build's (lower only by the MIRRORQ_MACHINE_VERSION test hook)
    confirm_latency: dict[str, Any]  # metric.Histogram.snapshot()
    peers: tuple[PeerStatus, ...]
    # filled by the app (node/app/node.py), all at once: absent from to_dict() until
    # it has (connections is then an int; either port may be None: TLS only, no TLS)
    connections: int | None = None
    amqp_port: int | None = None
    amqps_port: int | None = None
    # bytes connections hold in unfinished bodies and open transactions; the
    # node's resident set as the memory alarm last read it, the high-watermark
    # it is compared with (0 = off), and whether the alarm is on
    connection_held_bytes: int | None = None
    mem_used: int | None = None
    mem_limit: int | None = None
    mem_alarm: bool | None = None
    # filled by the management API's backend: absent from to_dict() until set
    member_addresses: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The status as the generic consumers have always seen it: every Raft and
        broker figure, then the app's fields once the app has filled them."""
        out: dict[str, Any] = {}
        for f in fields(self):
            name = f.name
            if name in _APP_FIELDS and self.connections is None:
                continue
            if name == "member_addresses" and self.member_addresses is None:
                continue
            value = getattr(self, name)
            out[name] = [p.to_dict() for p in value] if name == "peers" else value
        return out


_APP_FIELDS = frozenset({"connections", "amqp_port", "amqps_port", "connection_held_bytes",
                         "mem_used", "mem_limit", "mem_alarm"})
