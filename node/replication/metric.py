"""Counters and a latency histogram for the node's Prometheus metrics (pure)."""
from __future__ import annotations

import bisect

# seconds; Prometheus' cumulative `le` buckets are derived when rendering
CONFIRM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = CONFIRM_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """`n` observations of `value` (a batch's confirms share one latency)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def snapshot(self) -> dict[str, object]:
        cumulative, total = [], 0
        for c in self.counts:
            total += c
            cumulative.append(total)
        return {"le": [*self.bounds, "+Inf"], "cumulative": cumulative, "sum": self.sum,
                "count": self.count}
