"""Queue declaration checks: x-arguments and x-queue-type, as RabbitMQ
validates them (rabbit_amqqueue / rabbit_quorum_queue).
"""
from __future__ import annotations

from typing import Any

from node.broker.dead_letter import STRATEGIES
from node.broker.queue import MAX_PRIORITY
from node.broker.reply import QUEUE_DECLARE
from node.broker.vhost import ResourceKey
from node.replication.machine.errors import _ChanErr, _type_name, _where

# queue arguments RabbitMQ compares on redeclare (others are ignored)
_EQUIV_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-expires",
               "x-max-length", "x-max-length-bytes", "x-message-ttl", "x-overflow",
               "x-max-priority", "x-queue-mode", "x-queue-type", "x-single-active-consumer",
               "x-delivery-limit")


_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")

# each queue type's declare arguments (RabbitMQ 4.3's capabilities(), queue_arguments);
# an argument another type knows is refused (rabbit_amqqueue:check_arguments_key,
# 3.10 alike), so what RabbitMQ refuses is not accepted and then ignored here
_TYPE_ARGS: dict[str, frozenset[str]] = {
    "classic": frozenset((
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
        "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
        "x-queue-leader-locator")),
    "quorum": frozenset((
        "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
        "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
        "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
        "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
        "x-queue-leader-locator", "x-consumer-disconnected-timeout", "x-consumer-timeout",
        "x-delayed-retry-type", "x-delayed-retry-min", "x-delayed-retry-max")),
    "stream": frozenset((
        "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator")),
}
_KNOWN_ARGS = frozenset().union(*_TYPE_ARGS.values())
_TYPE_MODULE = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue"}


def _foreign_args(args: dict[str, Any]) -> list[str]:
    """The arguments another queue type knows and this one does not, in the
    order given (unknown ones are ignored, as in RabbitMQ)."""
    qtype = args.get("x-queue-type", "classic")
    own = _TYPE_ARGS.get(qtype if isinstance(qtype, str) else "", None)
    if own is None:
        return []  # an unknown type is refused by _check_queue_type
    return [k for k in args if k in _KNOWN_ARGS and k not in own]


def _validate_queue_args(key: ResourceKey, args: dict[str, Any],
                         quorum_semantics: bool = False,
                         check_strategy: bool = False) -> dict[str, Any]:
    """Check x-arguments like RabbitMQ and return them normalised (bytes -> str).
    With `quorum_semantics` (machine version 3 on) a quorum queue's
    x-delivery-limit may be negative: no limit (RabbitMQ 4.x; its declare
    does not check the argument, rabbit_fifo takes a negative one as none),
    and its x-consumer-timeout must be a non-negative integer (S29). With
    `check_strategy` (machine version 5 on) x-dead-letter-strategy must be
    one RabbitMQ knows (rabbit_amqqueue check_dlxstrategy_arg)."""
    def bad(arg: str, why: str) -> _ChanErr:
        return _ChanErr(406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue "
                             f"{_where(key)}: {why}", QUEUE_DECLARE)

    # "replace": pamqp gives a longstr that is not UTF-8 as bytes; a strict
    # decode raised out of apply_batch on every node (found by tests/fuzz)
    out = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
           for k, v in args.items()}
    quorum43 = quorum_semantics and out.get("x-queue-type") == "quorum"
    # RabbitMQ runs only the type's own validators; the others are refused by key
    foreign = set(_foreign_args(out)) if check_strategy else set()
    for arg, zero_ok in (("x-message-ttl", True), ("x-expires", False),
                         ("x-max-length", True), ("x-max-length-bytes", True),
                         ("x-max-priority", True), ("x-delivery-limit", True),
                         ("x-consumer-timeout", True)):
        if arg not in out or arg in foreign or (arg == "x-consumer-timeout" and not quorum43):
            continue
        v = out[arg]
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(arg, f'"expected integer, got {_type_name(v)}"')
        if v < 0 and not (arg == "x-delivery-limit" and quorum43):
            raise bad(arg, f"{{value_negative,{v}}}")
        if v == 0 and not zero_ok:
            raise bad(arg, "{value_zero,0}")
    maxp = out.get("x-max-priority", 0)
    if isinstance(maxp, int) and maxp > MAX_PRIORITY and "x-max-priority" not in foreign:
        raise bad("x-max-priority", f"{{max_value_exceeded,{maxp}}}")
    sac = out.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise bad("x-single-active-consumer", f"{{unacceptable_type,{_type_name(sac)}}}")
    if "x-overflow" in out and not isinstance(out["x-overflow"], str):
        raise bad("x-overflow", f"{{unacceptable_type,{_type_name(out['x-overflow'])}}}")
    for arg in ("x-dead-letter-exchange", "x-dead-letter-routing-key"):
        if arg in out and not isinstance(out[arg], str):
            raise _ChanErr(406, f"PRECONDITION_FAILED - invalid type '{_type_name(out[arg])}' "
                                f"for arg '{arg}' in queue {_where(key)}",
                           QUEUE_DECLARE)
        # a longstr, but dead-lettered messages carry it as exchange / routing
        # key, shortstrs in basic.deliver and get-ok: a longer one made every
        # delivery of them fail (found by tests/fuzz)
        if arg in out and len(out[arg].encode("utf-8")) > 255:
            raise bad(arg, "longer than 255 bytes")
    if "x-overflow" in out and out["x-overflow"] not in _OVERFLOW:
        raise bad("x-overflow", "invalid_overflow")
    if check_strategy and "x-dead-letter-strategy" in out and "x-dead-letter-strategy" not in foreign:
        v = out["x-dead-letter-strategy"]
        if not isinstance(v, str):
            raise bad("x-dead-letter-strategy", f"{{unacceptable_type,{_type_name(v)}}}")
        if v not in STRATEGIES:
            raise bad("x-dead-letter-strategy", "invalid_dlx_strategy")
    if "x-dead-letter-routing-key" in out and "x-dead-letter-exchange" not in out:
        raise bad("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    return out


# What clients declare (Celery, MassTransit, Spring AMQP: `quorum`): both map to
# mirrorq's one replicated queue; RabbitMQ's rules for a quorum queue apply
QUEUE_TYPES = ("classic", "quorum")


def _check_queue_type(key: ResourceKey, args: dict[str, Any], durable: bool, exclusive: bool,
                      auto_delete: bool, quorum_semantics: bool = False,
                      type_args: bool = False) -> None:
    """The queue type and what it requires; with `type_args` (machine version
    5 on) arguments that belong to another queue type are refused."""
    where = _where(key)
    if "x-queue-type" not in args:
        if type_args:
            _refuse_foreign(where, args)
        return
    qtype = args["x-queue-type"]
    if not isinstance(qtype, str):
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid type '{_type_name(qtype)}' for arg "
                            f"'x-queue-type' in queue {where}", QUEUE_DECLARE)
    if qtype == "stream":
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue "
                            f"{where}: streams are not supported by mirrorq (declare "
                            f"'quorum' or 'classic': every mirrorq queue is replicated)",
                       QUEUE_DECLARE)
    if qtype not in QUEUE_TYPES:
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue "
                            f"{where}: unknown queue type '{qtype}' (supported: "
                            f"{', '.join(QUEUE_TYPES)})", QUEUE_DECLARE)
    if type_args:
        _refuse_foreign(where, args)
    if qtype == "quorum":  # rabbit_quorum_queue:declare's checks, in its order
        for bad, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                          (not durable, "non-durable")):
            if bad:
                raise _ChanErr(406, f"PRECONDITION_FAILED - invalid property '{prop}' for "
                                    f"queue {where}", QUEUE_DECLARE)
        if quorum_semantics and "x-max-priority" in args:
            # rabbit_amqqueue:check_arguments_key (3.x and 4.x alike): not
            # a quorum queue's argument; its 32 levels need none (S28)
            raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for "
                                f"queue {where} of queue type rabbit_quorum_queue", QUEUE_DECLARE)


def _refuse_foreign(where: str, args: dict[str, Any]) -> None:
    foreign = _foreign_args(args)
    if foreign:
        qtype = args.get("x-queue-type", "classic")
        raise _ChanErr(406, f"PRECONDITION_FAILED - invalid arg '{foreign[0]}' for queue {where} "
                            f"of queue type {_TYPE_MODULE[qtype]}", QUEUE_DECLARE)
