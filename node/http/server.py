"""A small asyncio HTTP/1.1 server for the management API (issue 15).

Keep-alive, Content-Length bodies only (no chunked uploads: 411), bounded
request line, headers and body, per-request and idle timeouts, optional TLS.
A Router maps (method, path pattern) to handlers; `{name}` segments are
path parameters, percent-decoded per segment, so `%2F` in a vhost segment
is the vhost `/` as in RabbitMQ's API. Errors are RabbitMQ's JSON
`{"error": ..., "reason": ...}`; a handler that raises anything else gets
a 500 and the connection goes on (nothing a client sends stops the node).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, unquote

from node.amqp.log_limit import LogLimit, suppressed_note

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024  # request line and each header line
MAX_HEADERS = 100
MAX_HEAD = 64 * 1024  # request line and headers together, read before any credential
MAX_BODY = 64 * 1024 * 1024  # definitions files can be large: authenticated imports only
SMALL_BODY = 1024 * 1024  # any other request's body
REQUEST_TIMEOUT = 30.0  # to read a request's body once its headers came
IDLE_TIMEOUT = 10.0  # to get a request line and headers, first request or keep-alive
MAX_CONNECTIONS = 512  # open at once, all clients
MAX_PER_ADDRESS = 64  # open at once from one client address
MAX_LENGTH_DIGITS = 19  # a Content-Length longer than this is nonsense
# every response: no MIME sniffing, no framing (clickjacking), only the console's own files
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
}
HSTS = "max-age=31536000"  # HTTPS responses only (RFC 6797 ignores it over plain HTTP)
REASONS = {200: "OK", 201: "Created", 204: "No Content", 301: "Moved Permanently",
           400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 411: "Length Required",
           413: "Payload Too Large", 414: "URI Too Long", 415: "Unsupported Media Type",
           429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable"}


class HttpError(Exception):
    """An error answer: status, RabbitMQ's `error` word and `reason` text."""

    def __init__(self, status: int, error: str, reason: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}


@dataclass
class Request:
    method: str
    target: str  # as sent: path and query
    path: str  # raw (still percent-encoded) path
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    peer_host: str = ""
    # who the app's admit hook authenticated on the headers (before the body): the
    # handler takes it instead of checking the credentials a second time
    principal: Any = None
    # seconds the server withholds the answer, whatever it is (set by the admit hook
    # for a throttled login: the answer's timing must not tell a right password)
    hold: float = 0.0
    # what the app keeps for the rest of the connection (keep-alive requests)
    session: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        """The body as JSON (an empty body is {}); 400 when it is not JSON."""
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, "bad_request", f"failed to decode json: {exc}") from None
        except RecursionError:  # 100,000 '[': json's C decoder recurses
            raise HttpError(400, "bad_request", "failed to decode json: nested too deeply") \
                from None


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Python's json would take them)."""
    raise ValueError(f"{name} is not JSON")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, encode_json(value))


def error_response(err: HttpError) -> Response:
    resp = json_response({"error": err.error, "reason": err.reason}, err.status)
    resp.headers.update(err.headers)
    return resp


Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]


class Router:
    """Routes by method and path pattern; 404 for an unknown path, 405 (with
    Allow) for a known path with another method."""

    def __init__(self) -> None:
        self._routes: list[tuple[tuple[str, ...], dict[str, Handler]]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        parts = tuple(p for p in pattern.strip("/").split("/"))
        for existing, handlers in self._routes:
            if existing == parts:
                handlers[method] = handler
                return
        self._routes.append((parts, {method: handler}))

    @staticmethod
    def _match(parts: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
        if len(parts) != len(segments):
            return None
        params: dict[str, str] = {}
        for p, s in zip(parts, segments, strict=True):
            if p.startswith("{") and p.endswith("}"):
                params[p[1:-1]] = s
            elif p != s:
                return None
        return params

    def resolve(self, method: str, raw_path: str) -> tuple[Handler, dict[str, str]]:
        # split before decoding: %2F inside a segment stays part of that segment
        segments = [unquote(s) for s in raw_path.strip("/").split("/")]
        allowed: list[str] = []
        for parts, handlers in self._routes:
            params = self._match(parts, segments)
            if params is None:
                continue
            handler = handlers.get(method) or (handlers.get("GET") if method == "HEAD" else None)
            if handler is not None:
                return handler, params
            allowed.extend(handlers)
        if allowed:
            raise HttpError(405, "method_not_allowed", f"{method} is not allowed here",
                            {"Allow": ", ".join(sorted(set(allowed)))})
        raise HttpError(404, "not_found", "Not Found")


App = Callable[[Request], Awaitable[Response]]
# called with a request's line and headers before its body is read: raises (401...) or
# answers the largest body this request may send
Admit = Callable[[Request], int]


def content_length(text: str) -> int:
    """The Content-Length header's value; 400 unless ASCII digits of sane length
    (str.isdigit takes '²', int() then fails)."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_LENGTH_DIGITS:
        raise HttpError(400, "bad_request", "bad Content-Length")
    return int(text)


def check_target(target: str) -> None:
    """400 for a request target with control characters (NUL...), raw or
    percent-encoded: no path or file name holds one."""
    from urllib.parse import unquote_to_bytes
    raw = unquote_to_bytes(target)
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise HttpError(400, "bad_request", "control character in the request target")


def over_limit(total: int, from_address: int, max_total: int, max_per_address: int) -> bool:
    """Whether one more connection (after `total` open, `from_address` of them
    from its address) goes over the caps."""
    return total >= max_total or from_address >= max_per_address


class HttpServer:
    """Serves `app(request) -> Response` on a port (plain or TLS)."""

    def __init__(self, app: App, tls: ssl.SSLContext | None = None,
                 request_timeout: float = REQUEST_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT,
                 max_body: int = MAX_BODY, admit: Admit | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 max_per_address: int = MAX_PER_ADDRESS) -> None:
        self.app = app
        self.tls = tls
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.max_body = max_body
        # without an admit hook every request may send up to max_body
        self.admit: Admit = admit or (lambda _req: max_body)
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._per_address: dict[str, int] = {}
        self._refusal_log = LogLimit()  # the refusals' WARNING lines, per cause

    async def start(self, host: str, port: int) -> None:
        # TLS is started by _client once the socket is counted: a handshake in
        # asyncio's listener came before any cap, so idle sockets escaped them all
        self._server = await asyncio.start_server(self._client, host, port,
                                                  limit=MAX_LINE, reuse_address=True)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.tls is not None:  # the ClientHello waits for start_tls (which resumes)
            writer.transport.pause_reading()  # type: ignore[attr-defined]
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        peer = writer.get_extra_info("peername")
        peer_host = str(peer[0]) if peer else ""
        from_address = self._per_address.get(peer_host, 0)
        if over_limit(len(self._clients) - 1, from_address, self.max_connections,
                      self.max_per_address):
            # one line per cause per 10 s, not one per refused socket (issue 42)
            cause = "total" if len(self._clients) - 1 >= self.max_connections else "per-address"
            left_out = self._refusal_log.admit(cause, time.monotonic())
            if left_out is not None:
                log.warning("HTTP connection from %s refused: %d open from it, %d in all%s",
                            peer_host, from_address, len(self._clients) - 1,
                            suppressed_note(left_out))
            if self.tls is None:  # a TLS client gets no answer before a handshake it may not have
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send(writer, error_response(HttpError(
                        503, "service_unavailable", "too many connections")), False), 2.0)
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._clients.discard(task)
            return
        self._per_address[peer_host] = from_address + 1
        session: dict[str, Any] = {}
        try:
            if self.tls is not None and not await self._start_tls(writer):
                return
            while True:
                try:
                    # request line and headers within idle_timeout: an idle or trickling
                    # socket is closed (first request and between keep-alive requests)
                    head = await asyncio.wait_for(self._read_head(reader, peer_host),
                                                  self.idle_timeout)
                except HttpError as err:
                    await self._send(writer, error_response(err), False)
                    return
                except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    return
                if head is None:
                    return
                req, keep, length = head
                req.session = session
                try:
                    try:
                        limit = self.admit(req)  # authenticates on the headers: 401 unread
                    finally:
                        if req.hold > 0:  # a throttled login: the answer waits, the loop not
                            await asyncio.sleep(req.hold)
                    if length > limit:
                        raise HttpError(413, "bad_request", f"body over {limit} bytes")
                except HttpError as err:
                    # the connection goes on only when no unread body is left on it
                    keep = keep and not length
                    await self._send(writer, error_response(err), keep,
                                     head=req.method == "HEAD")
                    if keep:
                        continue
                    return
                try:
                    if length:
                        req.body = await asyncio.wait_for(reader.readexactly(length),
                                                          self.request_timeout)
                except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    return
                resp = await self._dispatch(req)
                await self._send(writer, resp, keep, head=req.method == "HEAD")
                if not keep:
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # never let one client take the node down
            log.exception("HTTP connection from %s failed", peer_host)
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._clients.discard(task)
            left = self._per_address.get(peer_host, 1) - 1
            if left > 0:
                self._per_address[peer_host] = left
            else:
                self._per_address.pop(peer_host, None)

    async def _start_tls(self, writer: asyncio.StreamWriter) -> bool:
        """The TLS handshake of a counted socket, within idle_timeout; whether it
        completed (a failed or late one is closed by the caller)."""
        assert self.tls is not None
        try:
            # awaited directly: a wait_for task would let the loop read the ClientHello
            # into the plain stream first (the handshake timeout bounds it instead)
            await writer.start_tls(self.tls, ssl_handshake_timeout=self.idle_timeout)
        except (OSError, ssl.SSLError, TimeoutError, AttributeError):
            return False  # AttributeError: the socket went mid-handshake (asyncio has none left)
        return True

    async def _read_head(self, reader: asyncio.StreamReader,
                         peer_host: str) -> tuple[Request, bool, int] | None:
        """The next request without its body, whether to keep the connection
        and the body's length; None at end of stream."""
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise HttpError(414, "bad_request", "request line too long") from None
            if not line:
                return None
            if line.strip():
                break  # tolerate blank lines between requests
        try:
            method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ")
        except ValueError:
            raise HttpError(400, "bad_request", "malformed request line") from None
        if not version.startswith("HTTP/1."):
            raise HttpError(400, "bad_request", "unsupported HTTP version")
        headers: dict[str, str] = {}
        size = len(line)
        for _ in range(MAX_HEADERS + 1):
            try:
                raw = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise HttpError(431, "bad_request", "header line too long") from None
            if not raw:
                raise ConnectionError("eof in headers")
            size += len(raw)
            if size > MAX_HEAD:  # 100 lines of 16 KiB each would be 1.6 MiB per socket
                raise HttpError(431, "bad_request", f"headers over {MAX_HEAD} bytes")
            text = raw.decode("latin-1").rstrip("\r\n")
            if not text:
                break
            name, sep, value = text.partition(":")
            if not sep:
                raise HttpError(400, "bad_request", "malformed header line")
            headers[name.strip().lower()] = value.strip()
        else:
            raise HttpError(431, "bad_request", "too many headers")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(411, "bad_request", "chunked bodies are not supported; "
                                                "send Content-Length")
        length = content_length(headers.get("content-length", ""))
        if length > self.max_body:
            raise HttpError(413, "bad_request", f"body over {self.max_body} bytes")
        check_target(target)
        path, _, query = target.partition("?")
        conn_hdr = headers.get("connection", "").lower()
        keep = ("close" not in conn_hdr) if version == "HTTP/1.1" else ("keep-alive" in conn_hdr)
        q = dict(parse_qsl(query, keep_blank_values=True))
        return (Request(method.upper(), target, path or "/", q, headers, b"", peer_host), keep,
                length)

    async def _dispatch(self, req: Request) -> Response:
        try:
            return await self.app(req)
        except HttpError as err:
            return error_response(err)
        except Exception as exc:
            log.exception("HTTP %s %s failed", req.method, req.path)
            return error_response(HttpError(500, "internal_server_error", str(exc) or repr(exc)))

    async def _send(self, writer: asyncio.StreamWriter, resp: Response, keep: bool,
                    head: bool = False) -> None:
        status = resp.status
        body = b"" if status in (204, 304) else resp.body
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
                 f"Date: {formatdate(usegmt=True)}", "Server: mirrorq",
                 f"Content-Length: {len(body)}",
                 "Connection: " + ("keep-alive" if keep else "close"),
                 "Cache-Control: no-cache"]
        lines += [f"{name}: {value}" for name, value in SECURITY_HEADERS.items()]
        if self.tls is not None:  # browsers that met HTTPS here never fall back to plain
            lines.append(f"Strict-Transport-Security: {HSTS}")
        if body or status not in (204, 304):
            lines.append(f"Content-Type: {resp.content_type}")
        for name, value in resp.headers.items():
            lines.append(f"{name}: {value}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
        await writer.drain()
