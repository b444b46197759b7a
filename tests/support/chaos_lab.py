"""A 3-node cluster in network namespaces started through chaosmirrorq.actions, and
its NetLab (root + `ip netns` needed; skipped otherwise)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from chaosmirrorq import actions
from chaosmirrorq.netns import NetLab, require_netns


def start_netns_cluster(tmp_path: Path, **kw: Any) -> None:
    require_netns()
    actions.start_cluster(nodes=3, netns=True, base_dir=str(tmp_path / "chaos"), experiment="test",
                          baseline=False, **kw)


def netns_lab() -> NetLab:
    lab = actions._STATE["lab"]
    assert isinstance(lab, NetLab)
    return lab
