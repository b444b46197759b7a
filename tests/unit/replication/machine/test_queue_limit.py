"""QueueDeclare.default_max_length, as older nodes wrote it (issue 7: their
default_queue_max_length): a queue declared by such a log entry and no
x-max-length gets that bound, and publishes past it are nacked instead of
dropping older (confirmed) messages. Today's nodes send 0 (issue 27: queues
are unbounded), but replay and a rolling upgrade's mixed cluster must apply
the old entries exactly as before."""
from __future__ import annotations

from node.replication.command import QueueDeclare
from node.replication.effect import Confirm
from tests.support.machine import Harness, chan, get, pub


def _decl(name: str, args: dict[str, object] | None = None, default: int = 2) -> QueueDeclare:
    return QueueDeclare(chan(1), name, False, True, False, False, dict(args or {}), False, default)


def _confirms(h: Harness, q: str, n: int) -> list[bool]:
    out = []
    for i in range(1, n + 1):
        out += [e.ack for e in h.run(pub(chan(1), q, b"%d" % i, seq=i)) if isinstance(e, Confirm)]
    return out


def test_default_max_length_nacks_publishes_past_it() -> None:
    h = Harness()
    h.open(chan(1))
    h.run(_decl("q"))
    assert _confirms(h, "q", 3) == [True, True, False]
    assert h.state.queues["q"].ready_count() == 2
    h.run(get(chan(1), "q", no_ack=True))  # room again: the next one is taken
    assert _confirms(h, "q", 1) == [True]


def test_queue_arguments_override_the_default() -> None:
    h = Harness()
    h.open(chan(1))
    h.run(_decl("own", {"x-max-length": 5}))
    assert _confirms(h, "own", 5) == [True] * 5
    h.run(_decl("head", {"x-overflow": "drop-head"}))
    assert _confirms(h, "head", 3) == [True] * 3  # the user chose drop-head explicitly
    assert h.state.queues["head"].ready_count() == 2
    h.run(_decl("free", default=0))
    assert _confirms(h, "free", 10) == [True] * 10


def test_the_default_is_not_an_argument_so_redeclares_stay_equivalent() -> None:
    h = Harness()
    h.open(chan(1))
    h.run(_decl("q", default=2))
    fx = h.run(_decl("q", default=7))  # another node with another config
    assert not [e for e in fx if type(e).__name__ == "ChannelError"]
    assert h.state.queues["q"].arguments == {}
