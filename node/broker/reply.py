"""AMQP 0-9-1 reply codes and the class/method ids that errors name: one home
for the wire (node/amqp), the state machine and the management API. Pure
constants: the lowest layer, so that every layer may import them."""
from __future__ import annotations

REPLY_NAMES = {
    200: "OK", 311: "CONTENT_TOO_LARGE", 312: "NO_ROUTE", 313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED", 402: "INVALID_PATH", 403: "ACCESS_REFUSED", 404: "NOT_FOUND",
    405: "RESOURCE_LOCKED", 406: "PRECONDITION_FAILED", 501: "FRAME_ERROR",
    502: "SYNTAX_ERROR", 503: "COMMAND_INVALID", 504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME", 506: "RESOURCE_ERROR", 530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR",
}

# (class id, method id) of the methods that channel and connection errors name
CHANNEL_FLOW = (20, 20)
CHANNEL_CLOSE = (20, 40)
EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DELETE = (40, 20)
EXCHANGE_BIND = (40, 30)
EXCHANGE_UNBIND = (40, 40)
QUEUE_DECLARE = (50, 10)
QUEUE_BIND = (50, 20)
QUEUE_PURGE = (50, 30)
QUEUE_DELETE = (50, 40)
QUEUE_UNBIND = (50, 50)
BASIC_QOS = (60, 10)
BASIC_CONSUME = (60, 20)
BASIC_CANCEL = (60, 30)
BASIC_PUBLISH = (60, 40)
BASIC_GET = (60, 70)
BASIC_ACK = (60, 80)
BASIC_REJECT = (60, 90)
BASIC_RECOVER = (60, 110)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
TX_SELECT = (90, 10)
TX_COMMIT = (90, 20)
TX_ROLLBACK = (90, 30)
