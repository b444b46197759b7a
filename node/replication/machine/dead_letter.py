"""At-least-once dead-lettering (machine version 5 on), after RabbitMQ's
rabbit_fifo_dlx and rabbit_fifo_dlx_worker.

A quorum queue whose effective dead-letter strategy is at-least-once (with
overflow reject-publish: node/broker/dead_letter.py at_least_once) keeps
each message it dead-letters in its store (state.dead_letters) until every
queue its DLX routes the message to has taken it. RabbitMQ's worker
republishes and waits for the targets' publisher confirms; here routing and
enqueueing happen in the same replicated apply, so "confirmed" means a
target's enqueue accepted it (not refused by its reject-publish overflow).
A message no queue takes (no DLX exchange, no route, every target full) stays
and is retried: on every Tick and after the commands that may give it a
route (declares, bindings, policies), on every member alike. Switching the
strategy away deletes the kept messages, as RabbitMQ does.
"""
from __future__ import annotations

import logging
from typing import Any

from node.broker.dead_letter import (
    AT_LEAST_ONCE,
    RETRY_WINDOW,
    DeadLetter,
    DeadLetterStore,
    at_least_once,
    strategy,
)
from node.broker.queue import Message, Queue, quorum_priority, raw_priority
from node.broker.vhost import resource_key, split_key
from node.replication.machine.handler import ApplierBase
from node.replication.machine.version import DEAD_LETTER_STORE

log = logging.getLogger(__name__)


class DeadLetterHandlers(ApplierBase):
    __slots__ = ()

    def configure_dead_letters(self, q: Queue, policy: dict[str, Any] | None) -> None:
        """Give `q` a store when it turns at-least-once; delete its kept
        messages when it stops (rabbit_fifo_dlx switch_from: "Deleted N
        dead-lettered messages")."""
        s = self.s
        if s.machine_version < DEAD_LETTER_STORE or q.deleted:
            return
        want = at_least_once(q, policy)
        if (not want and q.dlx is not None and q.arguments.get("x-queue-type") == "quorum"
                and strategy(q.arguments, policy) == AT_LEAST_ONCE):
            log.warning("falling back to dead-letter strategy at-most-once for %s: "
                        "at-least-once needs overflow reject-publish (it is %s)",
                        _name(q.name), q.overflow)
        store = s.dead_letters.get(q.name)
        if want and store is None:
            s.dead_letters[q.name] = DeadLetterStore()
        elif not want and store is not None:
            del s.dead_letters[q.name]
            n, size = len(store), store.bytes
            self.drop_kept(store)
            if n:
                log.info("deleted %d dead-lettered messages (%d bytes) in %s: its "
                         "dead-letter strategy is no longer at-least-once",
                         n, size, _name(q.name))

    def drop_kept(self, store: DeadLetterStore) -> int:
        """Delete a store's messages (a purge, the queue deleted, a switch)."""
        gone = store.clear()
        for d in gone:
            self.drop(d.message)
        return len(gone)

    def keep_dead_letter(self, q: Queue, store: DeadLetterStore, m: Message,
                         reason: str) -> None:
        """`m` dies in `q`: record its death now (the x-death its targets get,
        whenever that is) and keep it until its targets took it. The first
        attempt is at once while fewer than RETRY_WINDOW wait (RabbitMQ's
        worker forwards what it gets while under its prefetch; the rest waits
        in the discards queue for a retry)."""
        m.props = self.death_props(q, m, reason)
        m.expires_at = None
        m.deadline = None
        d = DeadLetter(m, reason)
        if len(store) < RETRY_WINDOW and self.forward(q, d):
            self.drop(m)
            return
        store.add(d)

    def forward(self, q: Queue, d: DeadLetter) -> bool:
        """Offer a kept message to the queues `q`'s DLX routes it to now,
        those that took it before left out; True once every one of them has
        it (rabbit_fifo_dlx_worker redeliver0). A message whose route is
        gone after some target took it is done (mandatory semantics)."""
        s = self.s
        if q.dlx is None or resource_key(split_key(q.name)[0], q.dlx) not in s.exchanges:
            return False
        m = d.message
        props = m.props
        assert props is not None  # kept messages always carry their new properties
        rk, targets = self.dead_letter_targets(q, props, m.routing_key, d.reason)
        if not targets:
            return bool(d.settled)
        done = True
        for name in targets:
            if name in d.settled:
                continue
            if self.enqueue(s.queues[name], q.dlx, rk, props, m.body, m.persistent, None,
                            m.loc, m.size, raw_priority(props), quorum_priority(props)):
                d.settled[name] = None
            else:
                done = False  # full (reject-publish): retried later
        return done

    def retry_dead_letters(self, q: Queue, store: DeadLetterStore) -> None:
        """One pass over `q`'s kept messages, oldest first, until RETRY_WINDOW
        of them failed again (they keep their places)."""
        s = self.s
        if q.dlx is None or resource_key(split_key(q.name)[0], q.dlx) not in s.exchanges:
            return  # nothing can route (RabbitMQ's worker: DLX not found)
        entries = store.entries
        failed: list[DeadLetter] = []
        while entries and len(failed) < RETRY_WINDOW:
            d = entries.popleft()
            store.bytes -= d.message.size
            if self.forward(q, d):
                self.drop(d.message)
            else:
                failed.append(d)
        if s.dead_letters.get(q.name) is store:
            entries.extendleft(reversed(failed))
            store.bytes += sum(d.message.size for d in failed)
        else:  # the queue stopped keeping them meanwhile
            for d in failed:
                self.drop(d.message)

    def retry_all_dead_letters(self) -> None:
        s = self.s
        for name, store in list(s.dead_letters.items()):
            q = s.queues.get(name)
            if store and q is not None:
                self.retry_dead_letters(q, store)


def _name(key: str) -> str:
    vhost, name = split_key(key)
    return f"queue '{name}' in vhost '{vhost}'"
