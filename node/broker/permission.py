"""Per-vhost permissions as RabbitMQ has them (pure): a user's configure,
write and read regular expressions, matched against resource names.

The patterns run on RE2 (node/broker/pattern.py), linear in the name, as
every other user-given pattern does: Python's backtracking `re` let an
administrator-set pattern such as ^(a+)+$ stall the node's event loop for
seconds on one 28-character queue name. A pattern RE2 refuses (a
backreference, lookaround) or one over 1,000 characters is refused when set
(400); one stored by an older build permits nothing."""
from __future__ import annotations

from node.broker.pattern import PatternError, compile_pattern, searches

CONFIGURE, WRITE, READ = 0, 1, 2
KIND_NAMES = ("configure", "write", "read")
FULL = (".*", ".*", ".*")


def permitted(patterns: tuple[str, str, str], kind: int, name: str) -> bool:
    """RabbitMQ's rule: the pattern may match anywhere in the name (unanchored
    search), and the empty pattern permits nothing, like "^$"."""
    pattern = patterns[kind]
    if not pattern:
        return False
    return searches(pattern, name)  # RE2, compiled once per pattern (an LRU cache)


def check_patterns(configure: str, write: str, read: str) -> str | None:
    """Why the patterns cannot be used, or None."""
    for what, pattern in zip(KIND_NAMES, (configure, write, read), strict=True):
        try:
            compile_pattern(pattern)
        except PatternError as exc:
            return f"{what} pattern {pattern!r} is not a regular expression RE2 accepts: {exc}"
    return None
