"""The memory high-watermark's default and forms (issue 26 item 6): on by
default at 0.4 of the memory the node may use (cgroup limit or RAM), a
fraction or a number of bytes in node.toml, 0 = off."""
from __future__ import annotations

from pathlib import Path

import pytest

from node.app.config import ConfigError, NodeConfig
from node.app.config_file import apply_file
from node.app.memory import ProcessMemory, resident_bytes, resolve_watermark, total_memory


def cfg_from(tmp_path: Path, text: str) -> NodeConfig:
    path = tmp_path / "node.toml"
    path.write_text(text)
    cfg = NodeConfig(node_id="n1", data_dir=str(tmp_path / "d"))
    apply_file(cfg, str(path))
    return cfg


def test_default_is_relative_and_on() -> None:
    cfg = NodeConfig(node_id="n1", data_dir="d")
    assert cfg.memory_high_watermark_relative == 0.4
    total = total_memory()
    assert total is not None and total > 0
    assert resolve_watermark(0.4, 0) == int(total * 0.4)


def test_fraction_bytes_and_off(tmp_path: Path) -> None:
    assert cfg_from(tmp_path, "memory_high_watermark = 0.5\n").memory_high_watermark_relative == 0.5
    cfg = cfg_from(tmp_path, "memory_high_watermark = 50000000\n")
    assert cfg.memory_high_watermark_relative is None and cfg.wire.memory_high_watermark == 50_000_000
    assert resolve_watermark(cfg.memory_high_watermark_relative, 50_000_000) == 50_000_000
    cfg = cfg_from(tmp_path, "memory_high_watermark = 0\n")
    assert resolve_watermark(cfg.memory_high_watermark_relative, 0) == 0
    cfg = cfg_from(tmp_path, "max_connection_buffer = 1000\n")
    assert cfg.wire.connection_buffer_limit() == 1000


@pytest.mark.parametrize("text", ["memory_high_watermark = 1.5\n", "memory_high_watermark = -1\n",
                                  "memory_high_watermark = 0.0\n", "max_connection_buffer = -1\n"])
def test_bad_values(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError):
        cfg_from(tmp_path, text)


def test_cgroup_limit_caps_ram(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25000000 kB\nMemFree: 1 kB\n")
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("1073741824\n")
    assert total_memory((str(v2),), str(meminfo)) == 1073741824
    v2.write_text("max\n")  # no limit: RAM
    assert total_memory((str(v2),), str(meminfo)) == 25000000 * 1024
    v1.write_text("9223372036854771712\n")  # v1's "unlimited": RAM is smaller
    assert total_memory((str(v2), str(v1)), str(meminfo)) == 25000000 * 1024
    assert total_memory((str(tmp_path / "none"),), str(tmp_path / "nomeminfo")) is None


def test_default_queue_max_length_is_accepted_and_ignored(tmp_path: Path) -> None:
    """Issue 27: a node.toml from before still starts (rolling upgrades), with
    one deprecation line; the value goes nowhere (queues are unbounded)."""
    cfg = cfg_from(tmp_path, "default_queue_max_length = 3\n")
    assert len(cfg.deprecations) == 1 and "default_queue_max_length" in cfg.deprecations[0]
    assert not hasattr(cfg.wire, "default_queue_max_length")
    assert cfg_from(tmp_path, "heartbeat = 30\n").deprecations == []


def test_the_gauge_reads_this_process_and_trims_while_over() -> None:
    """ProcessMemory: this process's resident set (as /proc/self/status says),
    read at most once per interval; over the watermark it trims malloc's free
    pages (at most once per trim_interval), under it once per idle_trim_interval."""
    with open("/proc/self/status") as f:
        vmrss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    used = resident_bytes()
    assert used is not None and 0.5 * vmrss < used < 2 * vmrss
    under = ProcessMemory(watermark=2**50, interval=0.0)
    assert under() > 0 and under.trims == 0
    over = ProcessMemory(watermark=1, interval=0.0, trim_interval=3600.0)
    assert over() > 1 and over() > 1
    assert over.trims == 1  # glibc here: trimmed once, not again within the hour
    cached = ProcessMemory(watermark=0, interval=3600.0)
    first = cached()
    _grow = bytearray(64 * 1024 * 1024)
    assert cached() == first  # not read again within the interval
    del _grow
    idle = ProcessMemory(watermark=0, interval=0.0, idle_trim_interval=0.0)
    assert idle() > 0 and idle.trims == 1  # under no watermark: freed pages still go back
