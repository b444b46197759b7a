"""Re-export of chaosmirrorq.cluster (chaos/chaosmirrorq/cluster.py), where the
multi-process cluster harness lives so that the chaos experiments can install and
import it. Private helpers the tests use are re-exported too."""
from __future__ import annotations

from chaosmirrorq import cluster as _impl
from chaosmirrorq.cluster import *  # noqa: F403
from chaosmirrorq.cluster import (  # noqa: F401
    _LIVE,
    FRAME_END,
    REPO,
    _frame,
    _kill_leftovers,
)

globals().update({k: v for k, v in vars(_impl).items()
                  if not k.startswith("__") and k not in globals()})
