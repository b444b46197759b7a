"""RabbitMQ's list query parameters: the `name` (+ `use_regex`) filter,
`sort` / `sort_reverse`, `columns` and pagination (`page`, `page_size`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.broker.pattern import PatternError, compile_pattern
from node.http.errors import bad_request
from node.http.server import Request, Response, json_response


def pick_columns(r: Mapping[str, Any], columns: str) -> dict[str, Any]:
    """RabbitMQ's `columns=a,b.c`: only those fields (dotted: nested)."""
    out: dict[str, Any] = {}
    for c in (c.strip() for c in columns.split(",")):
        if not c:
            continue
        v: Any = r
        for part in c.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None or c in r:
            cur = out
            parts = c.split(".")
            for part in parts[:-1]:
                cur = cur.setdefault(part, {})
            cur[parts[-1]] = v
    return out


def compile_filter(pattern: str) -> Any:
    """A user's `name` pattern compiled by RE2 (node/broker/pattern.py): 400
    for a pattern over MAX_REGEX characters or one RE2 refuses."""
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise bad_request(str(exc)) from None


def filter_sort_page(req: Request, rows: list[dict[str, Any]]) -> Response:
    """RabbitMQ's `name` + `use_regex` filter, `columns` selection and
    sorting (`sort`, `sort_reverse`); pagination (`page`) as RabbitMQ."""
    name = req.query.get("name")
    if name:
        if req.query.get("use_regex") == "true":
            rx = compile_filter(name)
            rows = [r for r in rows if rx.search(str(r.get("name", "")))]
        else:
            rows = [r for r in rows if name in str(r.get("name", ""))]
    sort = req.query.get("sort")
    if sort:
        def key(r: dict[str, Any]) -> Any:
            v: Any = r
            for part in sort.split("."):
                v = v.get(part) if isinstance(v, dict) else None
            return (v is None, str(v) if not isinstance(v, int | float) else v)
        rows = sorted(rows, key=key, reverse=req.query.get("sort_reverse") == "true")
    cols = req.query.get("columns")
    if cols:
        rows = [pick_columns(r, cols) for r in rows]
    page = req.query.get("page")
    if page:
        if not page.isdigit() or int(page) < 1:
            raise bad_request("page must be a positive integer")
        size_text = req.query.get("page_size", "100")
        if not size_text.isdigit() or not 1 <= int(size_text) <= 500:
            raise bad_request("page_size must be 1..500")
        n, size = int(page), int(size_text)
        total = len(rows)
        items = rows[(n - 1) * size:n * size]
        return json_response({"filtered_count": total, "item_count": len(items),
                              "items": items, "page": n,
                              "page_count": max(1, -(-total // size)), "page_size": size,
                              "total_count": total})
    return json_response(rows)
