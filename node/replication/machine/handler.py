"""The one command registry and the base of every handler mixin.

Each command handler is a method of a mixin (sessions, membership, access,
topology, delivery, publish, policy, limit, cluster) marked `@handles(SomeCommand, reply=...)`: that
decorator is the only place a command is bound to its handler and to the
reply ids its channel waits for (failure_effects fails that channel with 541
when the batch cannot be committed). tests/unit/replication/machine/test_command_registry.py
checks that the Command union, the codec's records and these tables agree.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from node.broker.vhost import SEP, ResourceKey, resource_key
from node.replication.effect import Effect, Reply
from node.replication.machine.errors import _ChanErr
from node.replication.message_store import BUCKET_SHIFT, PropsReader

if TYPE_CHECKING:
    from node.broker.channel import Channel, Consumer
    from node.broker.dead_letter import DeadLetterStore
    from node.broker.exchange import Exchange
    from node.broker.ids import ChanId, ConnId
    from node.broker.queue import Message, Queue
    from node.replication.command import BasicAck, BasicNack
    from node.replication.machine.state import BrokerState

ReplyIds = Callable[[Any], "tuple[int, int] | None"]

# command type -> its handler (called as handler(applier, command))
HANDLERS: dict[type, Callable[[Any, Any], None]] = {}
# command type -> the (class, method) ids of the reply its channel waits for
# (None: this command, e.g. with nowait, waits for none)
REPLY_IDS: dict[type, ReplyIds] = {}

_C = TypeVar("_C")
_H = TypeVar("_H", bound=Callable[..., None])


def handles(command: type[_C],
            reply: Callable[[_C], tuple[int, int] | None] | None = None) -> Callable[[_H], _H]:
    """Register the decorated method as the handler of `command`; `reply`
    maps a command to the ids of the reply its channel waits for."""
    def register(fn: _H) -> _H:
        if command in HANDLERS:
            raise TypeError(f"{command.__name__} has two handlers: "
                            f"{HANDLERS[command].__qualname__} and {fn.__qualname__}")
        HANDLERS[command] = fn
        if reply is not None:
            REPLY_IDS[command] = reply
        return fn
    return register


class ApplierBase:
    """What every handler mixin shares: the state, the effects collected so
    far and the queues whose delivery may have become possible."""

    __slots__ = ("s", "fx", "dirty", "index", "spans", "reader")

    def __init__(self, state: BrokerState, index: int = 0,
                 spans: dict[int, tuple[int, int]] | None = None,
                 reader: PropsReader | None = None) -> None:
        self.s = state
        self.fx: list[Effect] = []
        self.dirty: dict[str, Queue] = {}
        # the Raft index of the entry being applied and where its publishes'
        # properties sit in it (codec.decode_batch): messages then keep a
        # location instead of their bytes. None: bytes kept inline (tests, tools)
        self.index = index
        self.spans = spans
        # the properties of a message in the log, by loc (read only; dead-lettering,
        # on the raft thread): the node's log reader, None where messages are inline
        self.reader = reader

    def hold(self, m: Message) -> None:
        """Count a message in: its bytes, and its log bucket."""
        s = self.s
        s.message_bytes += m.size
        if m.loc is not None:
            b = m.loc >> (64 + BUCKET_SHIFT)
            s.live[b] = s.live.get(b, 0) + 1

    def drop(self, m: Message) -> None:
        """A message leaves the state for good (settled, dropped, expired,
        dead-lettered, purged, its queue deleted)."""
        s = self.s
        s.message_bytes -= m.size
        if m.loc is not None:
            b = m.loc >> (64 + BUCKET_SHIFT)
            n = s.live[b] - 1
            if n:
                s.live[b] = n
            else:
                del s.live[b]

    def reply(self, chan: ChanId, method: str, fields: dict[str, Any] | None = None) -> None:
        self.fx.append(Reply(chan, method, fields or {}))

    @staticmethod
    def key(ch: Channel, name: str, ids: tuple[int, int]) -> ResourceKey:
        """The table key of `name` in the channel's vhost."""
        if SEP in name:  # would alias another vhost's resource
            raise _ChanErr(406, "PRECONDITION_FAILED - resource names cannot contain NUL", ids)
        return resource_key(ch.vhost, name)

    if TYPE_CHECKING:  # what mixins call across modules; defined by the mixin named
        # sessions.SessionHandlers
        def close_channel(self, ch: Channel, failed: bool = True) -> None: ...
        def close_connection(self, conn: ConnId, failed: bool = True) -> None: ...
        def mark_channel_queues(self, ch: Channel) -> None: ...
        def drop_connections_of(self, node: str, text: str) -> None: ...
        # topology.TopologyHandlers
        def delete_exchange(self, x: Exchange) -> None: ...
        def delete_queue(self, q: Queue) -> None: ...
        def _queue_for(self, ch: Channel, name: str, ids: tuple[int, int]) -> Queue: ...
        # delivery.DeliveryHandlers
        def remove_consumer(self, c: Consumer) -> None: ...
        def pick(self, q: Queue) -> Consumer | None: ...
        def deliver(self, c: Consumer, q: Queue, m: Message) -> None: ...
        def service(self, q: Queue) -> None: ...
        def requeue(self, q: Queue, m: Message, failed: bool = True) -> None: ...
        def basic_ack(self, cmd: BasicAck, ids: tuple[int, int] = ...) -> None: ...
        def basic_nack(self, cmd: BasicNack, ids: tuple[int, int] | None = None) -> None: ...
        # publish.PublishHandlers
        def dead_letter(self, q: Queue, m: Message, reason: str) -> None: ...
        def enqueue(self, q: Queue, exchange: str, rk: str, props: dict[str, Any] | None,
                    body: bytes | None, persistent: bool, exp: int | None,
                    loc: int | None = None, size: int = -1, prio: int = -1,
                    qprio: int = -1) -> bool: ...
        def death_props(self, q: Queue, m: Message, reason: str) -> dict[str, Any]: ...
        def dead_letter_targets(self, q: Queue, props: dict[str, Any], routing_key: str,
                                reason: str) -> tuple[str, list[str]]: ...
        # dead_letter.DeadLetterHandlers
        def configure_dead_letters(self, q: Queue, policy: dict[str, Any] | None) -> None: ...
        def keep_dead_letter(self, q: Queue, store: DeadLetterStore, m: Message,
                             reason: str) -> None: ...
        def drop_kept(self, store: DeadLetterStore) -> int: ...
        def retry_all_dead_letters(self) -> None: ...
        # policy.PolicyHandlers
        def apply_policies(self, q: Queue) -> None: ...
        def refresh_queue(self, q: Queue) -> None: ...
        # limit.LimitHandlers
        def forget_connection(self, conn: ConnId) -> None: ...
        def count_channel(self, chan: ChanId, delta: int) -> None: ...
        def check_queue_limit(self, ch: Channel, name: str, ids: tuple[int, int]) -> None: ...
        def check_topic(self, ch: Channel, x: Exchange, key: str, write: bool,
                        ids: tuple[int, int]) -> None: ...
        def drop_access_of_user(self, user: str) -> None: ...
        def drop_access_of_vhost(self, vhost: str) -> None: ...
