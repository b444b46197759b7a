"""The replicated broker state (BrokerState), the state a cluster starts
from, and the helpers that change it outside any one handler.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Any

from node.broker.binding_limit import BindingLimits
from node.broker.channel import Channel
from node.broker.dead_letter import DeadLetterStore
from node.broker.exchange import Exchange
from node.broker.ids import ChanId, ConnId
from node.broker.policy import Policy
from node.broker.policy_index import Obj, PolicyIndex
from node.broker.queue import Queue
from node.broker.vhost import DEFAULT_VHOST, resource_key, split_key
from node.replication.machine.version import FIRST_VERSION, MACHINE_VERSION

DEFAULT_EXCHANGES = (("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
                     ("amq.topic", "topic"), ("amq.headers", "headers"),
                     ("amq.match", "headers"))


class BrokerState:
    """The whole replicated state: plain objects, dicts as ordered sets
    (node/replication/raft/snapshot/: writer.py writes it, reader.py reads it)."""

    __slots__ = ("now", "exchanges", "queues", "channels", "conns", "exclusive",
                 "ttl_index", "expires_index", "dedup", "counter", "message_bytes",
                 "members", "in_sync", "draining", "users", "vhosts", "permissions",
                 "config_version", "live", "policies", "operator_policies",
                 "policy_ae", "policy_index", "machine_version", "runs_version", "deadline_chans", "vhost_limits",
                 "user_limits", "topic_permissions", "connections", "counts",
                 "dead_letters", "global_parameters", "protected_vhosts",
                 "binding_limits", "vhost_bindings", "vhost_wild_nodes")

    def __init__(self) -> None:
        self.now = 0.0
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.channels: dict[ChanId, Channel] = {}
        # connection -> its open channels (ordered set)
        self.conns: dict[ConnId, dict[ChanId, None]] = {}
        # connection -> exclusive queues it owns
        self.exclusive: dict[ConnId, dict[str, None]] = {}
        # queues that may hold expiring messages / that have x-expires (cheap Tick)
        self.ttl_index: dict[str, None] = {}
        self.expires_index: dict[str, None] = {}
        # (node, incarnation) -> which of its batches were applied
        # (node, incarnation) -> next batch seq to apply (seqs start at 1)
        self.dedup: dict[tuple[str, int], int] = {}
        # feeds server-generated names
        self.counter = 0
        # body bytes of messages held (ready + unacked)
        self.message_bytes = 0
        # Raft members: node id -> raft address, and the in-sync set (ordered, in
        # members order). Only the raft thread touches the state: the event loop
        # reads the immutable ReadModel built from it once per tick
        # (node/replication/read_model.py), so apply mutates these dicts in place.
        self.members: dict[str, str] = {}
        self.in_sync: dict[str, None] = {}
        # members in maintenance mode (SetDraining): out of the in-sync set for good
        self.draining: dict[str, None] = {}
        # user -> (password hash, tags)
        self.users: dict[str, tuple[str, tuple[str, ...]]] = {}
        # vhosts (ordered set) and (user, vhost) -> (configure, write, read) patterns
        self.vhosts: dict[str, None] = {}
        self.permissions: dict[tuple[str, str], tuple[str, str, str]] = {}
        # bumped whenever members, in_sync, draining, users, vhosts or
        # permissions change: the read model rebuilds those parts only then
        self.config_version = 0
        # Raft index bucket (index >> message_store.BUCKET_SHIFT) -> messages held
        # whose bytes are in the log there (this node's log segments are kept
        # while a count is > 0). Never written: a snapshot holds its messages'
        # places in the log, and the counts are rebuilt from them on a load.
        self.live: dict[int, int] = {}
        # (vhost, name) -> Policy: policies and operator policies (config: they
        # bump config_version); snapshotted in their own section
        self.policies: dict[tuple[str, str], Policy] = {}
        self.operator_policies: dict[tuple[str, str], Policy] = {}
        # exchange key -> the alternate exchange its policy names (derived from
        # the policies: rebuilt after a snapshot load, never written)
        self.policy_ae: dict[str, str] = {}
        # derived from the policies too (node/broker/policy_index.py): their
        # compiled patterns per vhost and the ones matching each queue and
        # exchange, so reading a queue's policies is O(1) and a policy write
        # tests one pattern against its vhost's objects only
        self.policy_index = PolicyIndex()
        # the cluster's machine version (replicated: SetMachineVersion, machine/version.py;
        # a snapshot's machine section) and the one this build runs (local: set
        # by the node; a state that asks for more is refused, never applied)
        self.machine_version = FIRST_VERSION
        self.runs_version = MACHINE_VERSION
        # vhost -> {limit name: value} and user -> {limit name: value} (config);
        # (user, vhost, exchange) -> (write, read) topic patterns (config).
        # Snapshotted in the access section (after the machine section)
        self.vhost_limits: dict[str, dict[str, int]] = {}
        self.user_limits: dict[str, dict[str, int]] = {}
        self.topic_permissions: dict[tuple[str, str, str], tuple[str, str]] = {}
        # client connections past connection.open (ConnectionOpen): conn -> (vhost, user)
        self.connections: dict[ConnId, tuple[str, str]] = {}
        # (kind, name, node) -> how many: "vhost" connections per vhost, "user"
        # connections and "chan" channels per user, per node. Derived from
        # `connections` and `channels` (rebuilt after a snapshot load, never written)
        self.counts: dict[tuple[str, str, str], int] = {}
        # channels holding deliveries with a deadline (consumer timeouts, S29;
        # derived from the messages' deadlines, never written)
        self.deadline_chans: dict[ChanId, None] = {}
        # queue key -> its kept dead letters, for each queue whose strategy is
        # at-least-once (machine version 5 on; node/broker/dead_letter.py).
        # Snapshotted in the dead-letter section
        self.dead_letters: dict[str, DeadLetterStore] = {}
        # global runtime parameters: name -> JSON value (the cluster name is
        # "cluster_name"; node/broker/parameter.py) and the vhosts protected
        # from deletion (ordered set), from machine version 6 on (config: they
        # bump config_version). A value is replaced, never changed in place (the
        # read model shares it). Snapshotted in the cluster section
        self.global_parameters: dict[str, Any] = {}
        self.protected_vhosts: dict[str, None] = {}
        # issue 42: the node's binding limits (local, set by the node like
        # runs_version; every member must be configured alike) and the
        # bindings per vhost and topic trie nodes below a wildcard per vhost
        # they count (derived from the exchanges' bindings: rebuilt after a
        # snapshot load, never written)
        self.binding_limits = BindingLimits()
        self.vhost_bindings: dict[str, int] = {}
        self.vhost_wild_nodes: dict[str, int] = {}


def rebuild_deadlines(s: BrokerState) -> None:
    """The derived consumer-timeout index (S29), from the unacked deliveries'
    deadlines (after a snapshot load)."""
    s.deadline_chans = {}
    for chan, ch in s.channels.items():
        ds = [m.deadline for _q, m, _c in ch.unacked.values() if m.deadline is not None]
        ch.next_deadline = min(ds) if ds else None
        if ds:
            s.deadline_chans[chan] = None


def _move(counts: dict[str, int], vhost: str, delta: int) -> None:
    n = counts.get(vhost, 0) + delta
    if n > 0:
        counts[vhost] = n
    else:
        counts.pop(vhost, None)


def count_binding(s: BrokerState, exchange: str, delta: int, wild_delta: int) -> None:
    """Move the vhost's binding count and its wildcard trie node count
    (`exchange`: the source's key)."""
    vhost = split_key(exchange)[0]
    _move(s.vhost_bindings, vhost, delta)
    if wild_delta:
        _move(s.vhost_wild_nodes, vhost, wild_delta)


def rebuild_binding_counts(s: BrokerState) -> None:
    """The derived per-vhost binding counts (after a snapshot load)."""
    s.vhost_bindings = {}
    s.vhost_wild_nodes = {}
    for key, x in s.exchanges.items():
        if x.bindings:
            vhost = split_key(key)[0]
            _move(s.vhost_bindings, vhost, len(x.bindings))
            _move(s.vhost_wild_nodes, vhost, x.topic_wild())


def _config_changed(s: BrokerState) -> None:
    s.config_version += 1


def _add_vhost(s: BrokerState, vhost: str) -> None:
    s.vhosts[vhost] = None
    _config_changed(s)
    for name, type_ in DEFAULT_EXCHANGES:
        key = resource_key(vhost, name)
        s.exchanges[key] = Exchange(key, type_, durable=True)
        s.policy_index.add_object(Obj("exchange", key, name), vhost)  # no policies yet


def default_state() -> BrokerState:
    s = BrokerState()
    _add_vhost(s, DEFAULT_VHOST)
    return s


def _gen_name(prefix: str, chan: ChanId, counter: int) -> str:
    digest = hashlib.md5(f"{chan.node}/{chan.conn}/{chan.serial}/{counter}".encode(),
                         usedforsecurity=False).digest()
    return prefix + base64.urlsafe_b64encode(digest).decode().rstrip("=")
