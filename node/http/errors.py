"""Errors as the management API answers them: RabbitMQ's `error` word and
`reason` text, and what an AMQP error on the in-process session becomes."""
from __future__ import annotations

from node.http.server import HttpError

# AMQP reply code -> HTTP status (RabbitMQ's management API answers the same way)
AMQP_TO_HTTP = {404: 404, 406: 400, 403: 403, 405: 409, 530: 403, 503: 400, 540: 400, 502: 400,
                320: 503, 541: 500}


def not_found() -> HttpError:
    return HttpError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> HttpError:
    return HttpError(400, "bad_request", reason)


def amqp_error(code: int, text: str) -> HttpError:
    """An AMQP channel or connection error (reply code, text) as RabbitMQ's
    management API answers it: the HTTP status and word, the text without
    its reply-name prefix."""
    status = AMQP_TO_HTTP.get(code, 500)
    for prefix in ("PRECONDITION_FAILED - ", "NOT_FOUND - ", "ACCESS_REFUSED - ",
                   "RESOURCE_LOCKED - ", "NOT_ALLOWED - ", "INTERNAL_ERROR - ",
                   "COMMAND_INVALID - ", "NOT_IMPLEMENTED - ", "SYNTAX_ERROR - "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    word = {400: "bad_request", 404: "not_found", 403: "not_authorised",
            409: "resource_locked"}.get(status, "internal_server_error")
    return HttpError(status, word, text)
