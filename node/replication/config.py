"""Raft settings of a node: what the app configures, without importing pysyncobj."""
from __future__ import annotations

from dataclasses import dataclass, field

from node.broker.binding_limit import BindingLimits
from node.replication.machine.version import MACHINE_VERSION

# A Raft password shorter than this (characters) gets a warning at start when
# links are not TLS: one handshake seen on the wire lets an observer test
# guesses offline, each at the cost of one scrypt (~75 ms on one core).
SHORT_RAFT_PASSWORD = 16

FRAME_HEADROOM = 1024 * 1024  # a frame's bytes besides its entries: properties, headers, encoding
MAX_FRAME_BYTES = 64 * 1024 * 1024  # raft.max_frame_bytes's default (was a fixed 1 GiB)


def min_frame_bytes(max_message_size: int, append_chunk_bytes: int, batch_max_bytes: int) -> int:
    """The least raft.max_frame_bytes that holds every frame a member sends:
    an AppendEntries carries up to append_chunk_bytes of entries, or one entry
    alone (a batch of up to batch_max_bytes, or one publish of up to
    max_message_size)."""
    return max(max_message_size, append_chunk_bytes, batch_max_bytes) + append_chunk_bytes + FRAME_HEADROOM


@dataclass
class RaftConfig:
    host: str = "127.0.0.1"
    port: int = 25672
    # the address the Raft port binds (`serve --raft-listen`); None: every address of
    # `host`'s family (local-cluster passes its loopback host)
    bind_host: str | None = None
    peers: dict[str, str] = field(default_factory=dict)  # node id -> host:port (others)
    join: bool = False  # joining a running cluster: wait to hear a leader before campaigning
    password: str | None = None
    # mutual TLS between members (one cluster CA); with it the password is optional
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    # with TLS: a peer's certificate must name (SAN, IP or DNS, "*." for one
    # label) the host of the address it claims; false: any certificate of the CA
    tls_verify_names: bool = True
    # the largest Raft link frame read from an authenticated peer; a longer one
    # is refused from its header, before its body is read (at least
    # min_frame_bytes: one AppendEntries); None (unset): MAX_FRAME_BYTES, or
    # min_frame_bytes if a larger max_message_size needs more (config validate)
    max_frame_bytes: int | None = None
    # entry bytes in flight per follower (measured: 256 KiB bodies, 1 MiB gave ~27 MB/s,
    # 4 MiB ~50 MB/s, 8 MiB no more)
    follower_window_bytes: int = 4 * 1024 * 1024
    append_chunk_bytes: int = 512 * 1024  # entry bytes per AppendEntries
    batch_max_commands: int = 128
    batch_max_bytes: int = 512 * 1024  # well under append_entries_batch_bytes
    append_entries_batch_bytes: int = 4 * 1024 * 1024
    max_inflight_batches: int = 64
    max_inflight_bytes: int = 32 * 1024 * 1024
    idle_tick: float = 0.02
    batch_linger: float = 0.002  # wait this long to fill a batch ...
    batch_linger_after: int = 2  # ... once this many batches are in flight
    tick_interval: float = 1.0  # Tick command (TTL / x-expires)
    # silence-based elections only (a crashed leader's links break and the
    # survivors campaign at once, raft/election.py): long enough for the raft
    # thread's starvation under flat-out load on 2 shared cores (measured
    # leader stalls of 0.3-0.8 s) not to depose a healthy leader; the chart's
    # values since issue 9
    election_min: float = 1.0
    election_max: float = 2.0
    leader_fallback: float = 2.5
    out_of_sync_after: float = 5.0  # above the election timeout
    nack_after: float = 10.0  # a publish not made safe by then is nacked
    block_after: float = 2.0  # no leader / stuck batches this long: connection.blocked
    # BROKEN ON PURPOSE, for the chaos suite's proof that it catches loss:
    # confirm publishes on receipt, before replication (env
    # MIRRORQ_UNSAFE_EARLY_CONFIRM=1). Never set it otherwise.
    unsafe_early_confirm: bool = False
    # BROKEN ON PURPOSE, for the proof that a power loss is caught (chaos
    # kill_with_loss / power_cut over harness.lazyfs): the log's flush skips
    # its fdatasync and counts the entries as on disk, so they are acked and
    # confirmed while only in the page cache (env MIRRORQ_UNSAFE_NO_FSYNC=1).
    unsafe_no_fsync: bool = False
    # how long a peer name's address is trusted before it is looked up again
    # (only when dialling: a connected link keeps its socket)
    dns_cache_seconds: float = 2.0
    compaction_min_entries: int = 5000
    compaction_min_time: float = 300.0
    # also compact once the journal holds this many bytes (entries alone let a
    # journal of 256 KiB bodies reach GBs, mapped into memory), at most every
    # compaction_min_gap seconds
    compaction_max_bytes: int = 256 * 1024 * 1024
    compaction_min_gap: float = 10.0
    # a leader takes no snapshot while a follower catches up from the one it sent,
    # until its log holds this many bytes (a transfer of a large backlog under load
    # takes minutes; snapshots every compaction_max_bytes overtook it for as long as
    # the load lasted)
    catch_up_hold_bytes: int = 2 * 1024 * 1024 * 1024
    # the Raft log's segment files roll over past this size (raft/log/segment_log.py)
    segment_bytes: int = 64 * 1024 * 1024
    # a start checks the newest sealed segments' CRCs up to this many bytes
    # (a cold page cache reads ~230 MB/s here: 10M messages' 11 GB took 46 s);
    # the older ones are checked after the start, at scrub_bytes_per_second
    verify_at_open_bytes: int = 512 * 1024 * 1024
    scrub_bytes_per_second: int = 256 * 1024 * 1024
    # the machine version this node runs (machine/version.py); below this build's
    # only by the test hook MIRRORQ_MACHINE_VERSION (simulates an older build)
    machine_version: int = MACHINE_VERSION
    # what the apply allows of bindings (the node's [wire] max_binding* settings:
    # node/app/node.py copies them here; the same on every member)
    binding_limits: BindingLimits = field(default_factory=BindingLimits)
