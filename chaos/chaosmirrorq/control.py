"""chaostoolkit control: start the cluster before the experiment (so the steady-state
hypothesis "before" has a cluster to probe) and stop it after everything (rollbacks
included). The provider's arguments are start_cluster's:

    "controls": [{"name": "mirrorq-cluster",
                  "provider": {"type": "python", "module": "chaosmirrorq.control",
                               "arguments": {"nodes": 3, "netns": true, "experiment": "..."}}}]
"""
from __future__ import annotations

import logging
from typing import Any

from chaosmirrorq import actions, fault

logger = logging.getLogger("chaostoolkit")


def before_experiment_control(context: Any, **kwargs: Any) -> None:
    try:
        res = actions.start_cluster(**kwargs)
        logger.info(f"mirrorq cluster up: {res}")
    except Exception as exc:
        logger.error(f"mirrorq: start_cluster failed: {exc!r}")
        fault.STATE["start_error"] = repr(exc)
        raise


def after_experiment_control(context: Any, state: Any = None, **kwargs: Any) -> None:
    res = actions.stop_cluster()
    logger.info(f"mirrorq cluster stopped: {res}")
