"""chaosmirrorq: network namespaces for a mirrorq cluster (netns) and a chaostoolkit
extension (actions, probes, workload) plus the suite runner (suite); the process
harness itself is the `harness` package.

Activities of one experiment run in one Python process (`chaos run`), so the
running cluster, network lab and workload live in module state (fault.STATE).
"""
__version__ = "0.1.0"


def discover(discover_system: bool = True) -> dict:
    """chaostoolkit discovery: the activities of this extension."""
    from chaoslib.discovery.discover import (
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    result = initialize_discovery_result("chaosmirrorq", __version__, "mirrorq")
    result["activities"].extend(discover_actions("chaosmirrorq.actions"))
    result["activities"].extend(discover_probes("chaosmirrorq.probes"))
    return result
