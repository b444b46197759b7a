"""The environment of a short chaos run (`chaos run` with ~1 minute experiments) and the
kill scenario shared by the e2e and the broken-build tests."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "chaos" / "experiments"


def short_env(**extra: str) -> dict[str, str]:
    """The environment for a short chaos run: durations for a ~1 minute experiment,
    netns only when usable (root), the caller's overrides on top."""
    from chaosmirrorq.netns import netns_unavailable_reason

    env = dict(os.environ)
    for k in [k for k in env if k.startswith(("CHAOS_", "MIRRORQ_UNSAFE_"))]:
        del env[k]
    env.update(CHAOS_RATE="150", CHAOS_WARMUP_SECONDS="2", CHAOS_FAULT_SECONDS="4",
               CHAOS_KILLS="1", CHAOS_DOWN_SECONDS="2", CHAOS_INTERVAL_SECONDS="2")
    if netns_unavailable_reason() is not None:
        env["CHAOS_NETNS"] = "false"
    env.update(extra)
    return env


# The kill scenario of the e2e test and of the broken-build test (identical but for the
# node flag): every publisher on the leader, the followers SIGSTOPped for 2 s while the
# leader keeps taking publishes, then the leader SIGKILLed. A correct build confirms none
# of what it could not replicate; MIRRORQ_UNSAFE_EARLY_CONFIRM=1 confirms it all.
# 100 msg/s per publisher of 1-256 KiB bodies (mean ~46 KiB): ~14 MB/s, above what the
# cluster sustains here (chaos/README.md, "Workload"), the bytes of the former 300 msg/s
# of 1-64 KiB bodies; more makes the broken build's killed leader replay so much that it
# does not restart within the action's 60 s.
KILL_UNDER_BACKLOG = {"CHAOS_PIN_PUBLISHERS": "leader", "CHAOS_STALL_FOLLOWERS": "2",
                      "CHAOS_RATE": "100", "CHAOS_WINDOW": "300"}
