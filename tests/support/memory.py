"""A node's memory as the memory alarm sees it (its resident set), for tests
that set memory_high_watermark a little above an idle node's."""
from __future__ import annotations

from pathlib import Path

from harness.process import ClusterNode
from tests.broker_proc import NodeProcess, node_metric, wait_for


def rss(node: NodeProcess | ClusterNode) -> int:
    """The node process's VmRSS, in bytes."""
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def metric(node: NodeProcess, name: str) -> int:
    value = node_metric(node, name)
    assert value is not None
    return int(value)


def idle_rss(data_dir: Path) -> int:
    """The resident set of a fresh node with the default config (which also
    shows the memory alarm is on by default, and off while idle)."""
    probe = NodeProcess(data_dir)
    probe.start()
    try:
        limit = metric(probe, "mem_limit")
        assert limit > 0, "the memory alarm is off by default"
        # the gauge is read on the AMQP timer: wait for its first reading
        wait_for(lambda: metric(probe, "mem_used") > 0, timeout=10, what="mem_used")
        idle = max(rss(probe), metric(probe, "mem_used"))
        assert limit > idle and metric(probe, "mem_alarm") == 0
        return idle
    finally:
        probe.kill9()
