"""User-given regular expressions compiled by RE2 (pure): linear time in the
text, so no pattern can stall a node (Python's `re` backtracks: ^(a+)+$ took
seconds over a 28-character name). Shared by the management API's
`use_regex` filter and policy patterns, which every node matches while
applying the log."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

MAX_REGEX = 1000  # characters of a pattern


class PatternError(ValueError):
    """A pattern RE2 refuses (backreferences, lookaround) or one too long."""


def compile_pattern(pattern: str) -> Any:
    """The compiled pattern, or PatternError naming why not."""
    if len(pattern) > MAX_REGEX:
        raise PatternError(f"regex longer than {MAX_REGEX} characters")
    options = re2.Options()
    options.max_mem = 8 << 20  # bounds the compiled program too
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PatternError(f"bad regex: {detail}") from None


@lru_cache(maxsize=1024)
def _cached(pattern: str) -> Any:
    try:
        return compile_pattern(pattern)
    except PatternError:
        return None


def searches(pattern: str, text: str) -> bool:
    """RabbitMQ's rabbit_re:run: the pattern matches anywhere in `text`. A
    pattern RE2 refuses matches nothing (they are refused before proposing;
    deterministic on every node either way)."""
    rx = _cached(pattern)
    return rx is not None and rx.search(text) is not None
