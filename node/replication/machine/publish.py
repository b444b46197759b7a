"""Handlers for getting messages in: route a publish, enqueue it (limits,
overflow), dead-letter, and tx.commit.
"""
from __future__ import annotations

from typing import Any

from node.broker import overflow
from node.broker.channel import Channel
from node.broker.dead_letter import full_with
from node.broker.exchange import route
from node.broker.fieldtypes import Int64, Timestamp
from node.broker.queue import Message, Queue, quorum_priority, raw_priority
from node.broker.reply import BASIC_PUBLISH, TX_COMMIT
from node.broker.vhost import SEP, resource_key, split_key
from node.replication.command import BasicAck, BasicNack, BasicPublish, TxCommit
from node.replication.effect import Confirm, Return
from node.replication.machine.errors import _ChanErr, _not_found, _where
from node.replication.machine.handler import ApplierBase, handles
from node.replication.machine.version import QUORUM_OVERFLOW
from node.replication.message_store import BUCKET_SHIFT, make_loc


def _expiration_ms(props: dict[str, Any]) -> int | None:
    exp = props.get("expiration")
    if exp is None:
        return None
    s = exp.decode() if isinstance(exp, bytes) else str(exp)
    try:
        ms = int(s)
    except ValueError:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid expiration '{s}': no_integer",
                       BASIC_PUBLISH) from None
    if ms < 0:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid expiration '{s}': "
                            f"{{value_negative,{ms}}}", BASIC_PUBLISH)
    return ms


class PublishHandlers(ApplierBase):
    __slots__ = ()

    # -- publishing ---------------------------------------------------------

    @handles(BasicPublish)
    def basic_publish(self, cmd: BasicPublish) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        # A publish that closes its channel (404 no exchange, 403 internal, 406 bad
        # expiration) gets no basic.ack/nack, only the channel.close, as RabbitMQ
        # does: a nack first made aiormq/aio-pika report a DeliveryError instead
        # of the channel error their users handle (issue 14). The channel is gone,
        # so nothing waits for that confirm.
        names = self._route(ch, cmd, BASIC_PUBLISH)
        exp = _expiration_ms(cmd.props)
        self._publish(cmd, names, exp)

    def _route(self, ch: Channel, cmd: BasicPublish, ids: tuple[int, int]) -> list[str]:
        s = self.s
        xname = cmd.exchange
        if xname == "":  # the default exchange: the routing key names a queue
            qkey = resource_key(ch.vhost, cmd.routing_key)
            return [qkey] if qkey in s.queues and SEP not in cmd.routing_key else []
        xkey = self.key(ch, xname, ids)
        x = s.exchanges.get(xkey)
        if x is None:
            raise _not_found("exchange", xkey, ids)
        if x.internal:
            raise _ChanErr(403, f"ACCESS_REFUSED - cannot publish to internal exchange "
                                f"{_where(xkey)}", ids)
        self.check_topic(ch, x, cmd.routing_key, True, ids)
        return route(s.exchanges, x, cmd.routing_key, cmd.props.get("headers"), s.policy_ae)

    def _publish(self, cmd: BasicPublish, names: list[str], exp: int | None) -> None:
        queues = self.s.queues
        props = cmd.props
        persistent = props.get("delivery_mode") == 2
        accepted = True
        span = self.spans.get(id(cmd)) if self.spans is not None and names else None
        if span is None:  # inline (no log: tests, tools)
            kept_props: dict[str, Any] | None = props
            body: bytes | None = cmd.body
            loc = None
        else:  # the bytes stay in the log entry being applied
            kept_props = body = None
            loc = make_loc(self.index, span[0], span[1])
        size, prio, qprio = len(cmd.body), raw_priority(props), quorum_priority(props)
        for name in names:
            if not self.enqueue(queues[name], cmd.exchange, cmd.routing_key, kept_props, body,
                                persistent, exp, loc, size, prio, qprio):
                accepted = False
        if not names and cmd.mandatory:
            self.fx.append(Return(cmd.chan, 312, "NO_ROUTE", cmd.exchange, cmd.routing_key,
                                  props, cmd.body))  # before its confirm (S17)
        if cmd.seq > 0:
            self.fx.append(Confirm(cmd.chan, cmd.seq, accepted))

    def enqueue(self, q: Queue, exchange: str, rk: str, props: dict[str, Any] | None,
                body: bytes | None, persistent: bool, exp: int | None, loc: int | None = None,
                size: int = -1, prio: int = -1, qprio: int = -1) -> bool:
        """Put a message on a queue (or hand it straight to a consumer).
        False when x-overflow reject-publish refused it. props/body None: in
        the log at `loc` (message_store). prio: the priority as published,
        qprio: its quorum level (a quorum queue's 32 levels keep that)."""
        s = self.s
        if q.levels:
            prio = qprio
        q.stats[0] += 1
        latched = False
        if q.overflow == "drop-head":
            pass
        elif s.machine_version >= QUORUM_OVERFLOW and q.arguments.get("x-queue-type") == "quorum":
            if q.overflow == "reject-publish":  # a latch (S32); -dlx: drop-head, as RabbitMQ
                kept = s.dead_letters.get(q.name) if s.dead_letters else None
                if not overflow.admits(q, kept):
                    return False
                latched = True
        elif (q.full() if not s.dead_letters or q.name not in s.dead_letters
                else full_with(q, s.dead_letters[q.name])):
            if q.overflow == "reject-publish-dlx":
                m = Message(0, exchange, rk, props, body, persistent, None, loc, size, prio)
                self.hold(m)
                self.dead_letter(q, m, "maxlen")
            return False
        ttl = q.message_ttl
        if exp is not None and (ttl is None or exp < ttl):
            ttl = exp
        expires_at = None if ttl is None else s.now + ttl / 1000.0
        if loc is not None and props is None and body is None \
                and (not q.consumers or q.peek() is not None) \
                and q.push_plain(exchange, rk, loc, size, prio, persistent, expires_at):
            # a backlog's publish: packed straight into the index, no Message made
            s.message_bytes += size
            b = loc >> (64 + BUCKET_SHIFT)
            s.live[b] = s.live.get(b, 0) + 1
        else:
            m = Message(0, exchange, rk, props, body, persistent, expires_at, loc, size, prio)
            self.hold(m)
            if q.consumers and q.peek() is None:
                # fast path: nothing queued ahead, hand it over directly (so even a
                # TTL 0 message reaches a waiting consumer, as in RabbitMQ)
                c = self.pick(q)
                if c is not None:
                    m.seq = q.next_seq
                    q.next_seq += 1
                    self.deliver(c, q, m)
                    return True  # not ready: no change to the latch
            q.push(m)
        if expires_at is not None:
            s.ttl_index[q.name] = None
        if q.name in s.ttl_index:
            self.service(q)  # drop expired heads on enqueue
        if latched:
            overflow.latch(q, s.dead_letters.get(q.name) if s.dead_letters else None)
        elif (q.max_length is not None or q.max_length_bytes is not None) and q.over_limit():
            while q.over_limit():
                self.dead_letter(q, q.pop(), "maxlen")
        return True

    def dead_letter(self, q: Queue, m: Message, reason: str) -> None:
        """Remove `m` from `q` for good, republishing it through the queue's
        DLX (at most once); a queue dead-lettering at least once keeps it
        until its targets took it (machine/dead_letter.py)."""
        s = self.s
        if s.dead_letters and reason != "maxlen":  # rabbit_fifo_dlx: never maxlen
            store = s.dead_letters.get(q.name)
            if store is not None:
                self.keep_dead_letter(q, store, m, reason)
                return
        self.drop(m)
        if q.dlx is None:
            return
        if s.exchanges.get(resource_key(split_key(q.name)[0], q.dlx)) is None:
            return
        props = self.death_props(q, m, reason)
        rk, targets = self.dead_letter_targets(q, props, m.routing_key, reason)
        for name in targets:
            t = s.queues[name]
            # new properties here, the body where it was (inline or in the log)
            self.enqueue(t, q.dlx, rk, props, m.body, m.persistent, None, m.loc, m.size,
                         raw_priority(props), quorum_priority(props))

    def death_props(self, q: Queue, m: Message, reason: str) -> dict[str, Any]:
        """`m`'s properties as dead-lettered from `q`: its death recorded in
        x-death (and the x-first-death-* headers), its expiration gone."""
        s = self.s
        qname = split_key(q.name)[1]
        if m.props is not None:
            props = dict(m.props)
        else:  # in the log: read on this (the raft) thread; only queues with a DLX
            assert m.loc is not None and self.reader is not None
            props = dict(self.reader.props(m.loc))
        headers = dict(props.get("headers") or {})
        deaths = [d for d in (headers.get("x-death") or []) if isinstance(d, dict)]
        entry: dict[str, Any] | None = None
        for i, d in enumerate(deaths):
            if d.get("queue") == qname and d.get("reason") == reason:
                entry = dict(d)
                entry["count"] = Int64(int(d.get("count", 1)) + 1)
                del deaths[i]
                break
        if entry is None:
            rks = [m.routing_key]
            cc = headers.get("CC")
            if isinstance(cc, list):
                rks.extend(str(k) for k in cc)
            # count a long and time a timestamp on the wire, as RabbitMQ writes them
            entry = {"count": Int64(1), "reason": reason, "queue": qname,
                     "time": Timestamp(int(s.now)),
                     "exchange": m.exchange, "routing-keys": rks}
            if "expiration" in props:
                entry["original-expiration"] = props["expiration"]
        props.pop("expiration", None)
        deaths.insert(0, entry)
        headers["x-death"] = deaths
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", qname)
        headers.setdefault("x-first-death-exchange", m.exchange)
        props["headers"] = headers
        return props

    def dead_letter_targets(self, q: Queue, props: dict[str, Any], routing_key: str,
                            reason: str) -> tuple[str, list[str]]:
        """The routing key a message dead-lettered from `q` goes with and the
        queues `q`'s DLX (which exists) routes it to now, cycles left out.
        `props`: as death_props made them; `routing_key`: as published."""
        s = self.s
        vhost = split_key(q.name)[0]
        assert q.dlx is not None
        rk = q.dlrk if q.dlrk is not None else routing_key
        headers = props["headers"]
        if q.dlx == "":  # the default exchange routes by queue name
            tkey = resource_key(vhost, rk)
            targets: list[str] = [tkey] if tkey in s.queues and SEP not in rk else []
        else:
            targets = route(s.exchanges, s.exchanges[resource_key(vhost, q.dlx)], rk, headers,
                            s.policy_ae)
        if reason != "rejected":
            deaths = headers["x-death"]
            targets = [t for t in targets if not _is_cycle(split_key(t)[1], deaths)]
        return rk, targets

    # -- transactions -------------------------------------------------------

    @handles(TxCommit, reply=lambda c: TX_COMMIT)
    def tx_commit(self, cmd: TxCommit) -> None:
        s = self.s
        ch = s.channels.get(cmd.chan)
        if ch is None:
            return
        # Validate everything first so the commit is all or nothing (S24).
        outstanding = dict.fromkeys([*ch.unacked, *ch.released])  # timed out: known (S29)
        for sub in cmd.commands:
            if isinstance(sub, BasicPublish):
                self._route(ch, sub, TX_COMMIT)
                try:
                    _expiration_ms(sub.props)
                except _ChanErr as e:
                    raise _ChanErr(e.code, e.text, TX_COMMIT) from None
            else:
                multiple = sub.multiple and not (isinstance(sub, BasicNack) and sub.reject)
                tag = sub.delivery_tag
                if multiple and tag == 0:
                    outstanding.clear()
                    continue
                if tag not in outstanding:
                    raise _ChanErr(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}",
                                   TX_COMMIT)
                for t in ([x for x in outstanding if x <= tag] if multiple else [tag]):
                    del outstanding[t]
        for sub in cmd.commands:
            if isinstance(sub, BasicPublish):
                self._publish(sub, self._route(ch, sub, TX_COMMIT), _expiration_ms(sub.props))
            elif isinstance(sub, BasicAck):
                self.basic_ack(sub, TX_COMMIT)
            else:
                self.basic_nack(sub, TX_COMMIT)
        self.reply(cmd.chan, "Tx.CommitOk")


def _is_cycle(queue: str, deaths: list[dict[str, Any]]) -> bool:
    """RabbitMQ's rule: dead-lettering back into a queue the message already died
    in is a cycle unless a client rejection happened along the way."""
    for i, d in enumerate(deaths):
        if d.get("queue") == queue:
            return all(x.get("reason") != "rejected" for x in deaths[: i + 1])
    return False
