"""The fields each broker record is written with, and the slots that are not
(written another way, as references or messages, or derived on load).

A slot added to a broker class must be named here: iter_fields() pairs each
record class with its fields, and tests/unit/replication/test_snapshot_format.py
checks them against the classes' __slots__.
"""
from __future__ import annotations

from collections.abc import Iterable

from node.broker.channel import Channel, Consumer
from node.broker.exchange import Exchange
from node.broker.queue import Message, Queue
from node.replication.machine.state import BrokerState

# The fields each record is written with. tests/unit/replication/test_snapshot_format.py
# checks them against the classes' __slots__: a new slot must be added here.
STATE_FIELDS = ("now", "counter", "message_bytes", "config_version", "members", "in_sync",
                "draining", "users", "vhosts", "permissions", "dedup", "ttl_index",
                "expires_index", "conns", "exclusive")
EXCHANGE_FIELDS = ("name", "type", "durable", "auto_delete", "internal", "arguments", "home",
                   "direct", "fanout", "incoming")
QUEUE_FIELDS = ("name", "durable", "exclusive", "owner", "auto_delete", "arguments", "home",
                "message_ttl", "expires", "max_length", "max_length_bytes", "overflow", "dlx",
                "dlrk", "max_priority", "single_active", "delivery_limit", "counts_deliveries",
                "prio_consumers", "next_seq", "ready_bytes", "last_used", "deleted", "incoming",
                "stats")
CHANNEL_FIELDS = ("id", "vhost", "next_tag", "prefetch", "global_prefetch", "limited_unacked",
                  "flow")
CONSUMER_FIELDS = ("chan", "tag", "no_ack", "exclusive", "prefetch", "unacked", "credit",
                   "priority")
# written from version 4 on, after the fields above (S29)
CHANNEL_FIELDS_4 = ("released",)
CONSUMER_FIELDS_4 = ("timeout",)
# written from version 5 on, after the fields above (S32)
QUEUE_FIELDS_5 = ("rejecting",)
# BrokerState's slots written in the policies section (the first trailing section)
POLICY_FIELDS = ("policies", "operator_policies")
# and in the access section (after the machine section)
ACCESS_FIELDS = ("vhost_limits", "user_limits", "topic_permissions", "connections")
# and in the cluster section (after the dead-letter section)
CLUSTER_FIELDS = ("global_parameters", "protected_vhosts")


def queue_fields(version: int) -> tuple[str, ...]:
    """A queue's fields in a file of format `version`."""
    return QUEUE_FIELDS + QUEUE_FIELDS_5 if version >= 5 else QUEUE_FIELDS


def channel_fields(version: int) -> tuple[str, ...]:
    """A channel's fields in a file of format `version`."""
    return CHANNEL_FIELDS + CHANNEL_FIELDS_4 if version >= 4 else CHANNEL_FIELDS


def consumer_fields(version: int) -> tuple[str, ...]:
    """A consumer's fields in a file of format `version`."""
    return CONSUMER_FIELDS + CONSUMER_FIELDS_4 if version >= 4 else CONSUMER_FIELDS


# slots not in the field lists: written another way (references, messages) or derived
DERIVED = {
    "BrokerState": ("exchanges", "queues", "channels", "live", "policy_ae", "policy_index",
                    "deadline_chans", "dead_letters",
                    "machine_version", "runs_version", *POLICY_FIELDS, *ACCESS_FIELDS,
                    *CLUSTER_FIELDS, "counts", "binding_limits", "vhost_bindings",
                    "vhost_wild_nodes"),
    "Exchange": ("bindings", "_topic_cache", "_topic"),
    "Queue": ("returned", "ready", "consumers", "exclusive_consumer", "levels", "bands",
              "band_order", "banded", *QUEUE_FIELDS_5),
    "Channel": ("unacked", "consumers", "next_deadline", *CHANNEL_FIELDS_4),
    "Consumer": ("channel", "queue", *CONSUMER_FIELDS_4),
    "Message": ("size", "loc", "priority"),
}


def iter_fields() -> Iterable[tuple[type, tuple[str, ...]]]:
    """Each record class with the fields written for it (and its derived ones)."""
    yield BrokerState, STATE_FIELDS + DERIVED["BrokerState"]
    yield Exchange, EXCHANGE_FIELDS + DERIVED["Exchange"]
    yield Queue, QUEUE_FIELDS + DERIVED["Queue"]
    yield Channel, CHANNEL_FIELDS + DERIVED["Channel"]
    yield Consumer, CONSUMER_FIELDS + DERIVED["Consumer"]
    yield Message, (("seq", "exchange", "routing_key", "props", "body", "persistent",
                     "expires_at", "redelivered", "delivery_count", "acquired_count", "deadline")
                    + DERIVED["Message"])
