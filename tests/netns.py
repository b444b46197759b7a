"""Re-export of chaosmirrorq.netns (chaos/chaosmirrorq/netns.py): network namespaces
+ bridge + iptables partitions for tests and chaos experiments on one machine."""
from __future__ import annotations

from chaosmirrorq import netns as _impl
from chaosmirrorq.netns import *  # noqa: F403

globals().update({k: v for k, v in vars(_impl).items()
                  if not k.startswith("__") and k not in globals()})
