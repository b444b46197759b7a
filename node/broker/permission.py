"""Per-vhost permissions as RabbitMQ has them (pure): a user's configure,
write and read regular expressions, matched against resource names."""
from __future__ import annotations

import re

CONFIGURE, WRITE, READ = 0, 1, 2
KIND_NAMES = ("configure", "write", "read")
FULL = (".*", ".*", ".*")


def permitted(patterns: tuple[str, str, str], kind: int, name: str) -> bool:
    """RabbitMQ's rule: the pattern may match anywhere in the name (unanchored
    search), and the empty pattern permits nothing, like "^$"."""
    pattern = patterns[kind]
    if not pattern:
        return False
    return re.search(pattern, name) is not None  # re caches compiled patterns


def check_patterns(configure: str, write: str, read: str) -> str | None:
    """Why the patterns cannot be used, or None."""
    for what, pattern in zip(KIND_NAMES, (configure, write, read), strict=True):
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"{what} pattern {pattern!r} is not a regular expression: {exc}"
    return None
