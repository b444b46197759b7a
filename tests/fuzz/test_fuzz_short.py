"""The short fuzz run of `make test` (the long one is `make fuzz`, docs/fuzzing.md).

Fixed seeds, so a failure here is reproducible with
`python -m tests.fuzz.fuzz_amqp --target T --seed S --replay I` (printed in the
assertion message). The self-checks at the end prove the fuzzer can fail: each
injects a crash, a hang, an unbounded buffer or a 541 and expects a finding.
"""
from __future__ import annotations

import gc
import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.amqp import frame
from node.amqp.channel import ConnectionException, WireChannel
from node.replication.command import QueueDeclare
from node.replication.machine import handler
from tests.fuzz import fuzz_amqp as fz

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pamqp Basic.RecoverAsync

FRAME_INPUTS = 16_000
CONN_INPUTS = 4_000
TIME_LIMIT = 5.0  # CPU seconds per input; generous: an input takes milliseconds
HYPO = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(autouse=True)
def _no_gc_in_deep_recursion() -> Iterator[None]:
    """Inputs nest tables thousands deep on purpose. A garbage collection that
    starts down there runs finalizers of objects left by earlier tests (sockets,
    transports) at the recursion limit; they fail as "unraisable" exceptions and
    pytest cannot even format their tracebacks. Collect before, not during."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _report(st_: fz.Stats) -> str:
    return st_.line() + "".join(
        f"\n  {f.kind} at {f.where}: {f.detail}\n    python -m tests.fuzz.fuzz_amqp "
        f"--target {f.target} --seed {f.seed} --replay {f.index}" for f in st_.findings.values())


# ------------------------------------------------------------------ seeded runs


@pytest.mark.parametrize("seed", [1, 2])
def test_frame_reader_fuzz_seeded(seed: int) -> None:
    result = fz.fuzz("frame", seed, 0, FRAME_INPUTS // 2, TIME_LIMIT)
    assert result.inputs == FRAME_INPUTS // 2
    assert result.crashes == 0, _report(result)


@pytest.mark.parametrize("seed", [1, 2])
def test_connection_and_channel_fuzz_seeded(seed: int) -> None:
    result = fz.fuzz("conn", seed, 0, CONN_INPUTS // 2, TIME_LIMIT)
    assert result.inputs == CONN_INPUTS // 2
    assert result.crashes == 0, _report(result)


# ------------------------------------------------------------------ hypothesis


@HYPO
@given(st.binary(max_size=3000), st.lists(st.integers(1, 200), max_size=40),
       st.sampled_from(fz.FRAME_MAXES))
def test_frame_reader_arbitrary_bytes_any_chunking(data: bytes, cuts: list[int],
                                                   frame_max: int) -> None:
    chunks, pos = [], 0
    for n in cuts:
        chunks.append(data[pos:pos + n])
        pos += n
    chunks.append(data[pos:])
    fz.read_frames(chunks, frame_max)


@HYPO
@given(st.lists(st.tuples(st.sampled_from(fz.CORPUS.all_valid), st.integers(0, 65535)),
                min_size=1, max_size=8),
       st.lists(st.integers(1, 64), max_size=30))
def test_frame_reader_valid_frames_any_chunking(items: list[tuple[tuple[int, bytes], int]],
                                                cuts: list[int]) -> None:
    frames = [(ftype, chan, payload) for (ftype, payload), chan in items]
    data = fz.encode_frames(frames)
    chunks, pos = [], 0
    for n in cuts:
        chunks.append(data[pos:pos + n])
        pos += n
    chunks.append(data[pos:])
    fz.read_frames(chunks, 131072, expected=frames)


@HYPO
@given(st.randoms(use_true_random=False))
def test_frame_reader_generated_inputs(rng: random.Random) -> None:
    fz.run_frame_input(rng)


@HYPO
@given(st.randoms(use_true_random=False))
def test_connection_and_channel_generated_sessions(rng: random.Random) -> None:
    fz.run_conn_input(rng)


_METHODS = [p for ps in fz.CORPUS.methods.values() for p in ps] + fz.CORPUS.raw_args


@HYPO
@given(st.lists(st.one_of(
    st.tuples(st.just(frame.FRAME_METHOD), st.sampled_from((1, 1, 2, 0)),
              st.sampled_from(_METHODS)),
    st.tuples(st.just(frame.FRAME_HEADER), st.just(1), st.sampled_from(fz.CORPUS.headers)),
    st.tuples(st.just(frame.FRAME_BODY), st.just(1), st.binary(max_size=16)),
), max_size=20))
def test_connection_and_channel_method_sequences(frames: fz.Frames) -> None:
    s = fz.Session()
    s.feed([fz.HANDSHAKES[0]])
    s.feed([fz.encode_frames([(frame.FRAME_METHOD, 1, fz.CORPUS.methods["Channel.Open"][0]),
                              *frames])])
    s.finish()


# ------------------------------------------------------------------ self-checks


def _kinds(result: fz.Stats) -> set[str]:
    return {f.kind for f in result.findings.values()}


def test_self_check_injected_crash_in_a_channel_handler_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: WireChannel, m: frame.Method) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(WireChannel, "on_basic_qos", boom)
    result = fz.fuzz("conn", 3, 0, 400, TIME_LIMIT)
    assert result.crashes > 0 and "RuntimeError" in _kinds(result)


def test_self_check_injected_crash_in_apply_batch_is_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: object, cmd: QueueDeclare) -> None:
        raise KeyError("injected")

    monkeypatch.setitem(handler.HANDLERS, QueueDeclare, boom)
    result = fz.fuzz("conn", 3, 0, 200, TIME_LIMIT)
    assert "KeyError" in _kinds(result)


def test_self_check_internal_error_reply_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def internal(self: WireChannel, m: frame.Method) -> None:
        raise ConnectionException(541, "INTERNAL_ERROR - injected")

    monkeypatch.setattr(WireChannel, "on_basic_qos", internal)
    result = fz.fuzz("conn", 3, 0, 400, TIME_LIMIT)
    assert any("541" in f.detail for f in result.findings.values()), _report(result)


def test_self_check_frame_decoder_crash_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(payload: bytes) -> object:
        raise OverflowError("injected")

    monkeypatch.setattr(frame, "decode_header", boom)
    result = fz.fuzz("frame", 3, 0, 300, TIME_LIMIT)
    assert "OverflowError" in _kinds(result)


def test_self_check_unbounded_frame_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # the reader's size check compares against frame.FRAME_OVERHEAD: switch it off
    monkeypatch.setattr(frame, "FRAME_OVERHEAD", -(2**40))
    result = fz.fuzz("frame", 3, 0, 500, TIME_LIMIT)
    assert any(f.kind == "Violation" and ("buffered" in f.detail or "yielded" in f.detail
                                          or "oversized" in f.detail)
               for f in result.findings.values()), _report(result)


def test_self_check_hang_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def spin(payload: bytes) -> object:
        while True:
            pass

    monkeypatch.setattr(frame, "decode_method", spin)
    result = fz.fuzz("frame", 3, 0, 5, time_limit=0.2)
    assert "Hang" in _kinds(result)
