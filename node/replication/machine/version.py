"""Machine versions (Ra's model): which apply behaviour the cluster runs.

Every build has MACHINE_VERSION. The replicated state holds the cluster's
`machine_version`; it changes only by a SetMachineVersion entry, which the
leader appends once every member runs a build of at least that version
(node/replication/upgrade.py). Members of two builds (a rolling image
update) therefore apply the log identically: apply code that behaves
differently in a newer version branches on `state.machine_version`, so the
new behaviour starts at that entry's index on every member, and entries
before it replay as they were first applied.

A member whose build is older than the cluster's machine version cannot
apply the log the way the others do: it stops (MachineVersionError) rather
than diverge. The version never goes down.

Versions:
  1  every build before machine versions (and a new cluster's start)
  2  records and snapshots carry their field counts (codec C/Q records,
     the snapshot's machine section); QueueDeclare.default_max_length,
     the cap of builds before issue 27 item 6, is no longer applied
  3  RabbitMQ 4.3's quorum-queue semantics (issue 28): a quorum queue's
     delivery limit defaults to 20 (x-delivery-limit -1: none; existing
     quorum queues take it at this entry); only failed deliveries count
     (x-delivery-count), every return counts as an acquisition
     (x-acquired-count); snapshots of format 4 (the acquired count);
     32 priority levels (x-max-priority refused on a quorum queue)
  4  vhost and user limits, topic permissions and the connection table
     (ConnectionOpen, LimitSet/Clear, TopicPermissionSet/Clear: records a
     version-3 build cannot decode, so no node proposes them before; the
     snapshot's access section)
  5  snapshots of format 5 (issue 27): a queue's ready messages as the
     packed index's columns (a version-4 build cannot read them); and
     at-least-once dead-lettering for quorum queues (issue 28): a queue
     with x-dead-letter-strategy / dead-letter-strategy at-least-once (and
     overflow reject-publish) keeps its dead letters until the targets took
     them (node/broker/dead_letter.py, machine/dead_letter.py); the strategy
     argument is validated; the snapshot's dead-letter section; a quorum
     queue's reject-publish is rabbit_fifo's latch (over the limit: refuse
     until back at 80%, node/broker/overflow.py) and its reject-publish-dlx
     is drop-head; declare arguments of another queue type are refused
  6  cluster metadata (issue 28, the management API's "not yet" routes):
     global runtime parameters, the cluster name among them
     (GlobalParameterSet/Clear), and vhosts protected from deletion
     (VhostProtection; VhostDelete of a protected vhost changes nothing):
     records a version-5 build cannot decode, so no node proposes them
     before; the snapshot's cluster section
  7  binding limits (issue 42): the apply refuses a bind past the node's
     max_binding_key_words, max_bindings_per_exchange,
     max_bindings_per_vhost or max_topic_wildcard_nodes (406); a version-6
     member would add the binding and diverge, so the refusal starts at this
     entry (the topic trie changes no result: it is not versioned)
"""
from __future__ import annotations

from node.broker.queue import uses_levels
from node.replication.command import SetMachineVersion
from node.replication.machine.handler import ApplierBase, handles

MACHINE_VERSION = 7
FIRST_VERSION = 1  # a state that never applied SetMachineVersion
# what switches at which version (apply code compares state.machine_version with these)
COUNTED_RECORDS = 2  # the log and snapshots are written with field counts
NO_LEGACY_QUEUE_CAP = 2  # QueueDeclare.default_max_length is ignored
QUORUM_SEMANTICS = 3  # RabbitMQ 4.3's quorum queues (docs/semantics.md, Quorum queues)
LIMITS = 4  # limits, topic permissions, ConnectionOpen may be proposed
PACKED_SNAPSHOTS = 5  # snapshots may be written in format 5 (ready messages as columns)
DEAD_LETTER_STORE = 5  # at-least-once dead-lettering (machine/dead_letter.py)
QUORUM_OVERFLOW = 5  # a quorum queue's reject-publish latch (node/broker/overflow.py, S32)
TYPE_ARGUMENTS = 5  # another queue type's declare arguments are refused
CLUSTER_METADATA = 6  # global parameters, vhost deletion protection may be proposed
BINDING_LIMITS = 7  # the apply refuses binds past the binding limits (binding_limit.py)
DEFINITION_CEILINGS = 7  # ... and policies/parameters past the fixed ceilings (definition_limit.py)
TOPIC_FAIL_CLOSED = 7  # ... and a channel of an unknown user where topic permissions exist


class MachineVersionError(RuntimeError):
    """This build cannot apply the cluster's log (its machine version is newer)."""


def too_old(cluster: int, runs: int) -> MachineVersionError:
    return MachineVersionError(
        f"the cluster runs machine version {cluster}, this build runs {runs}: refusing to "
        f"apply the log (it would diverge from the other members); run a build of machine "
        f"version {cluster} or later on this member")


class VersionHandlers(ApplierBase):
    __slots__ = ()

    @handles(SetMachineVersion)
    def set_machine_version(self, cmd: SetMachineVersion) -> None:
        s = self.s
        if cmd.version <= s.machine_version:
            return  # never downgrades (a repeated or stale proposal)
        if cmd.version > s.runs_version:
            raise too_old(cmd.version, s.runs_version)
        before = s.machine_version
        s.machine_version = cmd.version
        if before < QUORUM_SEMANTICS <= cmd.version:
            # existing quorum queues take the 4.3 defaults (delivery limit 20)
            # and their 32 priority levels: the messages queued so far count as
            # of the default level, returned ones before them (S28)
            for q in list(s.queues.values()):
                if q.arguments.get("x-queue-type") == "quorum":
                    self.refresh_queue(q)
                    q.levels = uses_levels(q.arguments, True)
        if before < DEAD_LETTER_STORE <= cmd.version:
            # quorum queues configured at-least-once start keeping their dead
            # letters at this entry (the ones before went at most once)
            for q in list(s.queues.values()):
                if q.arguments.get("x-queue-type") == "quorum":
                    self.refresh_queue(q)
