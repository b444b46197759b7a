"""What the management-API integration tests share: a request as a user
(guest by default), a user with tags and full permissions on "/", and an AMQP
connection as a user, against one NodeProcess."""
from __future__ import annotations

from typing import Any

import pika
import requests

from tests.broker_proc import NodeProcess, uniq

GUEST = ("guest", "guest")
T = 15.0


def api(node: NodeProcess, method: str, path: str, auth: Any = GUEST, **kw: Any) -> Any:
    kw.setdefault("timeout", T)
    return requests.request(method, f"http://127.0.0.1:{node.http_port}{path}",  # type: ignore[attr-defined]
                            auth=auth, **kw)


def user(node: NodeProcess, tags: str) -> tuple[str, str]:
    name = uniq("u")
    assert api(node, "PUT", f"/api/users/{name}",
               json={"password": "pw", "tags": tags}).status_code == 201
    assert api(node, "PUT", f"/api/permissions/%2F/{name}",
               json={"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    return name, "pw"


def amqp(node: NodeProcess, auth: tuple[str, str] = GUEST) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(
        f"amqp://{auth[0]}:{auth[1]}@127.0.0.1:{node.amqp_port}/%2F"))
