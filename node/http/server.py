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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, unquote

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024  # request line and each header line
MAX_HEADERS = 100
MAX_BODY = 64 * 1024 * 1024  # definitions files can be large
REQUEST_TIMEOUT = 30.0  # to read one request once its first byte came
IDLE_TIMEOUT = 60.0  # keep-alive connection without a request
REASONS = {200: "OK", 201: "Created", 204: "No Content", 301: "Moved Permanently",
           400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 411: "Length Required",
           413: "Payload Too Large", 414: "URI Too Long", 415: "Unsupported Media Type",
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

    def json(self) -> Any:
        """The body as JSON (an empty body is {}); 400 when it is not JSON."""
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, "bad_request", f"failed to decode json: {exc}") from None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":"), default=str).encode())


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


class HttpServer:
    """Serves `app(request) -> Response` on a port (plain or TLS)."""

    def __init__(self, app: App, tls: ssl.SSLContext | None = None,
                 request_timeout: float = REQUEST_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT,
                 max_body: int = MAX_BODY) -> None:
        self.app = app
        self.tls = tls
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.max_body = max_body
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._client, host, port, ssl=self.tls,
                                                  limit=MAX_LINE, reuse_address=True,
                                                  ssl_handshake_timeout=10.0 if self.tls else None)

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
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        peer = writer.get_extra_info("peername")
        peer_host = str(peer[0]) if peer else ""
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), self.idle_timeout)
                except (TimeoutError, ConnectionError):
                    return
                except (ValueError, asyncio.LimitOverrunError):
                    await self._send(writer, error_response(
                        HttpError(414, "bad_request", "request line too long")), False)
                    return
                if not line:
                    return
                if not line.strip():
                    continue  # tolerate blank lines between requests
                try:
                    req, keep = await asyncio.wait_for(self._read(reader, line, peer_host),
                                                       self.request_timeout)
                except HttpError as err:
                    await self._send(writer, error_response(err), False)
                    return
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

    async def _read(self, reader: asyncio.StreamReader, line: bytes,
                    peer_host: str) -> tuple[Request, bool]:
        try:
            method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ")
        except ValueError:
            raise HttpError(400, "bad_request", "malformed request line") from None
        if not version.startswith("HTTP/1."):
            raise HttpError(400, "bad_request", "unsupported HTTP version")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            try:
                raw = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise HttpError(431, "bad_request", "header line too long") from None
            if not raw:
                raise ConnectionError("eof in headers")
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
        length_text = headers.get("content-length", "0") or "0"
        if not length_text.isdigit():
            raise HttpError(400, "bad_request", "bad Content-Length")
        length = int(length_text)
        if length > self.max_body:
            raise HttpError(413, "bad_request", f"body over {self.max_body} bytes")
        body = await reader.readexactly(length) if length else b""
        path, _, query = target.partition("?")
        conn_hdr = headers.get("connection", "").lower()
        keep = ("close" not in conn_hdr) if version == "HTTP/1.1" else ("keep-alive" in conn_hdr)
        q = dict(parse_qsl(query, keep_blank_values=True))
        return Request(method.upper(), target, path or "/", q, headers, body, peer_host), keep

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
        if body or status not in (204, 304):
            lines.append(f"Content-Type: {resp.content_type}")
        for name, value in resp.headers.items():
            lines.append(f"{name}: {value}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))
        await writer.drain()
