"""The replicated broker state and its pure, deterministic transition function.

Every node folds the same batches through `apply_batch` and must reach the
same state and effects, so nothing here reads a clock, draws randomness,
iterates a `set` or depends on object identity for ordering. Time comes from
`Batch.now`. No asyncio or pysyncobj imports (unit-testable by folding).

Where things are (after RabbitMQ's rabbit_fifo):
  state.py       BrokerState, default_state
  handler.py     the command registry (@handles) and the handlers' base
  applier.py     apply_batch and the Applier composed of the mixins below
  sessions.py    channels, connections, nodes up/down, channel.flow, echo
  membership.py  Raft members, in-sync set, draining
  access.py      users, vhosts, permissions
  topology.py    exchanges, queues, bindings
  delivery.py    consumers, delivering, requeue, get, acks, expiry (Tick)
  publish.py     routing, enqueue, dead-lettering, tx.commit
  policy.py      policies and operator policies, applied to queues and exchanges
  limit.py       vhost and user limits, topic permissions, the connection table
  dead_letter.py at-least-once dead-lettering (kept dead letters)
  cluster.py     global parameters (the cluster name), vhost deletion protection
  version.py     machine versions (SetMachineVersion)
  arguments.py   x-argument and queue-type validation
  errors.py      channel/connection errors and their texts
  outcomes.py    batch verdicts, failure_effects, skipped_effects
"""
from __future__ import annotations

from node.replication.machine.applier import apply_batch
from node.replication.machine.outcomes import (
    SKIPPED_TEXT,
    batch_verdict,
    failure_effects,
    skipped_effects,
)
from node.replication.machine.state import BrokerState, default_state

__all__ = ["SKIPPED_TEXT", "BrokerState", "apply_batch", "batch_verdict", "default_state",
           "failure_effects", "skipped_effects"]
