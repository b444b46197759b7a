"""The web console's files (node/http/static): `/` is index.html,
`/static/<path>` a file under the directory, nothing outside it."""
from __future__ import annotations

import mimetypes
from pathlib import Path

from node.http.errors import not_found
from node.http.server import Response


def static_file(root: Path | None, path: str) -> Response:
    if root is None or not root.is_dir():
        raise not_found()
    rel = "index.html" if path in ("/", "/index.html") else None
    if rel is None and path.startswith("/static/"):
        rel = path[len("/static/"):]
    if rel is None:
        raise not_found()
    from urllib.parse import unquote
    rel = unquote(rel)
    base = root.resolve()
    target = (base / rel).resolve()
    if base != target and base not in target.parents:
        raise not_found()
    if not target.is_file():
        raise not_found()
    ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype in ("application/javascript", "application/json"):
        ctype += "; charset=utf-8"
    return Response(200, target.read_bytes(), ctype)
