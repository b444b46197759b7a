"""Rate-limited log lines (issue 42): a listener that refuses sockets logs at
most one WARNING per cause per interval, and the next line of that cause
says how many it left out, so a flood of refused sockets costs a few lines,
not one per socket. Pure: the caller passes the time and does the logging.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LOG_INTERVAL = 10.0  # seconds between two lines of one cause


@dataclass
class LogLimit:
    """One per cause (a fixed word such as "per-address", never a client's
    address: the causes stay few whoever connects)."""

    interval: float = LOG_INTERVAL
    _last: dict[str, float] = field(default_factory=dict)
    _suppressed: dict[str, int] = field(default_factory=dict)

    def admit(self, cause: str, now: float) -> int | None:
        """None: leave this line out (counted); else log it, with the number
        of lines of its cause left out since the last one."""
        last = self._last.get(cause)
        if last is not None and now - last < self.interval:
            self._suppressed[cause] = self._suppressed.get(cause, 0) + 1
            return None
        self._last[cause] = now
        return self._suppressed.pop(cause, 0)


def suppressed_note(n: int) -> str:
    """What a line appends about the lines of its cause left out before it."""
    return f" ({n} more like this in the last interval not logged)" if n else ""
