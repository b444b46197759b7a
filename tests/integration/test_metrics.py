"""/metrics of a real node keeps Prometheus' naming: one family per metric,
counters named `_total` (each counter used to appear twice: also as a gauge
without `_total`)."""
from __future__ import annotations

import re
import urllib.request

import pytest

from tests.broker_proc import Broker, NodeProcess
from tests.support.pika_session import Amqp

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def _scrape(node: NodeProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def _families(text: str) -> dict[str, str]:
    """family name -> TYPE ("untyped" for samples without a TYPE line), from a small
    parser of the text format that fails on a second TYPE line for one name."""
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"family {name} declared twice"
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            float(m.group(3))
            name = m.group(1)
            if name not in types and re.sub(r"_(bucket|sum|count)$", "", name) not in types:
                types[name] = "untyped"
    return types


def test_metrics_every_family_once_and_counters_end_in_total(broker: Broker, amqp: Amqp) -> None:
    if not isinstance(broker, NodeProcess):
        pytest.skip("needs a mirrorq node's metrics port")
    amqp.publish(amqp.queue(), [b"counted"])  # counters above zero
    text = _scrape(broker)
    types = _families(text)
    counters = [n for n, t in types.items() if t == "counter"]
    assert counters and all(n.endswith("_total") for n in counters), counters
    # a counter's family is its name without `_total`: no other metric may use that name
    bases = {n.removesuffix("_total") for n in counters}
    assert not bases & set(types), f"counters also exported as: {sorted(bases & set(types))}"
    assert {"mirrorq_published_total", "mirrorq_confirmed_total",
            "mirrorq_journal_flushes_total"} <= set(counters)
    assert types["mirrorq_term"] == "gauge" and types["mirrorq_is_leader"] == "gauge"
    assert types["mirrorq_confirm_latency_seconds"] == "histogram"
    assert "untyped" not in types.values(), [n for n, t in types.items() if t == "untyped"]
    try:  # the reference parser, where it is installed
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)), names
