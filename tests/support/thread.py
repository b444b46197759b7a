"""Running an action in a thread while the test watches it take effect."""
from __future__ import annotations

import threading
from typing import Any


def in_thread(fn: Any, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(**kw)
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out
