"""JSON over HTTPS to the tests' API server with a bearer token: what the node
agent, the hostPath provisioner, the cluster DNS and the kubelet harness call."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> {status}: {body[:300]}")
        self.status = status


class Api:
    """JSON over HTTPS to the API server with a bearer token (thread-safe)."""

    def __init__(self, server: str, token: str, ca_file: Path, timeout: float = 15.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=str(ca_file))
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ctx) as rsp:
                raw = rsp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(method, path, exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def merge(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, body, "application/merge-patch+json")
