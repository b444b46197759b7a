"""Bounds on bindings (issue 42): the words of a topic binding key, the
bindings per exchange and per vhost, and the topic trie nodes below a
wildcard per vhost (what bounds a publish's routing cost), with the
refusals' texts (pure).

RabbitMQ has no binding limit; mirrorq routes in the replicated apply, where
a tenant's bindings cost every member, so it caps them. A refusal is 406
PRECONDITION_FAILED, as RabbitMQ refuses a queue.declare past a vhost's
max-queues (the management API's binding POST answers 400). A limit of 0 is
none. The apply reads the node's settings: set them alike on every member.
"""
from __future__ import annotations

from typing import NamedTuple

from node.broker.exchange import split_topic


class BindingLimits(NamedTuple):
    # a topic binding key's words: a match costs at most (routing-key words + 1)
    # x trie nodes, and a binding adds at most this many nodes
    key_words: int = 32
    per_exchange: int = 20_000
    per_vhost: int = 100_000
    # trie nodes below a `*` or `#` edge, summed over the vhost's topic
    # exchanges: a publish visits each exchange at most once and costs at most
    # its key's words + 1 + 2 x these (node/broker/topic.py)
    wildcard_nodes: int = 32_768


def key_refused(limits: BindingLimits, exchange_type: str, key: str) -> str | None:
    """Why `key` may not be a new binding key on an exchange of this type, or None."""
    if exchange_type != "topic" or not limits.key_words:
        return None
    words = len(split_topic(key))
    if words <= limits.key_words:
        return None
    return (f"PRECONDITION_FAILED - binding key has {words} words, more than the "
            f"limit of {limits.key_words} (max_binding_key_words)")


def count_refused(limits: BindingLimits, exchange: str, vhost: str, on_exchange: int,
                  in_vhost: int, wild_in_vhost: int = 0, wild_added: int = 0) -> str | None:
    """Why one more binding may not be added (counts of the existing ones and
    the wildcard trie nodes it would add), or None."""
    if limits.per_exchange and on_exchange >= limits.per_exchange:
        return (f"PRECONDITION_FAILED - cannot bind to exchange '{exchange}' in vhost "
                f"'{vhost}': its binding limit ({limits.per_exchange}) is reached "
                f"(max_bindings_per_exchange)")
    if limits.per_vhost and in_vhost >= limits.per_vhost:
        return (f"PRECONDITION_FAILED - cannot bind in vhost '{vhost}': binding limit "
                f"in vhost '{vhost}' ({limits.per_vhost}) is reached (max_bindings_per_vhost)")
    if limits.wildcard_nodes and wild_added and wild_in_vhost + wild_added > limits.wildcard_nodes:
        return (f"PRECONDITION_FAILED - cannot bind in vhost '{vhost}': its topic bindings "
                f"would hold more than {limits.wildcard_nodes} trie nodes below a wildcard "
                f"(max_topic_wildcard_nodes)")
    return None
