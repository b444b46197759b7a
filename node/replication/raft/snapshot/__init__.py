"""Snapshots: the whole replicated state in one file, written by a forked child.

The snapshot file: the whole replicated state (BrokerState) and the Raft
position it was taken at, in a versioned binary format of our own. No pickle:
decoding builds only the broker's own types (set field by field from checked
values), the codec's plain values and records, or raises SnapshotFormatError.

Layout (integers little endian):
  header  magic (8) | format version u16 | reserved u16 | body length u64 | CRC32 of the body u32
  body    log entries (version 3): u64 count, then that many u64 Raft indices,
          ascending: the entries the messages' bytes are in (see below)
          raft position: one codec value (RaftMeta)
          plain state: one codec value (the scalar fields and plain tables)
          exchanges    u32 count, each one codec tuple
          queues       u32 count, each: a codec tuple of its fields, then its
                       returned (heap) and ready messages
          channels     u32 count, each one codec tuple
          consumers    u32 count, each one codec tuple (channel and queue by index)
          links        per channel: its unacked deliveries and consumers;
                       per queue: its consumers and exclusive consumer
          policies     one codec value: the policies and operator policies
                       (issue 28; absent from older files: none then)
A message is a fixed struct, its exchange and routing key, then (version 3)
where its bytes are in the Raft log (index, offset and length of its
properties inside that entry; the body follows them): the snapshot holds the
index only, never the bodies (issue 27 item 3), and the log's segments that
hold those entries are kept while a snapshot or the state needs them. A
message whose properties or body are held here instead (a test's state, a
dead-lettered message's new properties, versions 1 and 2) has them inline: a
codec table or a back reference (publishes routed to several queues share
one table and one body, and still do after a load), the body as raw bytes.
Queues, channels and consumers are referenced by index, so the object graph
(an unacked delivery's queue and consumer, a consumer's channel) comes back
with the same sharing, deleted queues that deliveries still name included.

The whole body is covered by the CRC: a damaged file is refused before any of
it is decoded. A new layout gets a new version number; this build reads
READ_VERSIONS. Version 2 (issue 28): message properties may hold the codec's
W values (header values with their AMQP wire type); version 1 files, which
cannot, are read as before. Version 3 (issue 27): the log-entries section,
messages by their place in the log, the priority in the message struct.
After the policies section, from machine version 2 on, the machine section
(node/replication/machine/version.py): absent, the machine version is 1.
Version 4 (issue 28, written from machine version 3 on, when every member
reads it): the message struct ends with the acquired count (x-acquired-count);
older files load with 0 there.
After it, from machine version 4 on, the access section (limits, topic
permissions, the connection table): absent, there are none.
Version 5 (issue 27, written from machine version 5 on): a queue's ready
messages are its packed index's columns (node/broker/fifo.py) as they are in
memory: u64 count, u64 how many are not persistent, the int64 x 4 records,
a u8 flag and the float64 expiries if any message has one, the (exchange,
routing key) table (one codec value), u32 per message indexing it
(0xFFFFFFFF: a message kept as an object, written after, in order, as any
message). A restart reads a backlog with a few large copies instead of a
struct per message; the log-entries check and the live counts run per
distinct entry (the records of a queue are in log order).
After that, from machine version 5 on, the dead-letter section: the
messages queues keep for at-least-once dead-lettering (state.dead_letters),
one codec value naming the stores and their entries' reasons and settled
targets, then the messages in the message format: absent, there are none.
After that, from machine version 6 on, the cluster section: the global
parameters (the cluster name among them) and the vhosts protected from
deletion: absent, there are none.

The format (pure: no pysyncobj):
  envelope.py   the header (magic, version, body length, CRC32) and its checks,
                SnapshotFormatError, RaftMeta, the body's writer (_Writer)
  fields.py     the fields each record is written with (checked against __slots__)
  message.py    a message: its struct, writing and reading (and the reader's base)
  packed.py     version 5: a queue's ready messages as the packed index's columns
  section.py    the registry of the trailing sections (@section)
  sections.py   the trailing sections: policies, machine, access, dead letters, cluster
  writer.py     write_snapshot, encode_snapshot: the records, then the sections
  reader.py     read_snapshot, read_meta, read_entries
pysyncobj's side (RaftShim):
  raft_data.py  pysyncobj's part (last two entries, cluster nodes) <-> RaftMeta
  child.py      the forked child that writes a snapshot
  transfer.py   the log entries a leader sends after its snapshot file
  receiver.py   SnapshotReceiver: pysyncobj's Serializer, sending and receiving
  startup.py    our own snapshot, read and checked before pysyncobj starts
  mixin.py      SnapshotMixin, the snapshot half of RaftShim
"""
from __future__ import annotations

from node.replication.raft.snapshot.envelope import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    READ_VERSIONS,
    RaftMeta,
    SnapshotFormatError,
    check,
    check_file,
    snapshot_size,
)
from node.replication.raft.snapshot.fields import iter_fields
from node.replication.raft.snapshot.mixin import SnapshotMixin
from node.replication.raft.snapshot.reader import read_entries, read_meta, read_snapshot
from node.replication.raft.snapshot.receiver import SnapshotReceiver
from node.replication.raft.snapshot.writer import (
    encode_snapshot,
    iter_messages,
    logged_entries,
    write_snapshot,
)

__all__ = [
    "FORMAT_VERSION", "HEADER_SIZE", "MAGIC", "READ_VERSIONS", "RaftMeta", "SnapshotFormatError",
    "SnapshotMixin", "SnapshotReceiver", "check", "check_file", "encode_snapshot", "iter_fields",
    "iter_messages", "logged_entries", "read_entries", "read_meta", "read_snapshot",
    "snapshot_size", "write_snapshot",
]
