"""The measure records: their invariants and message trimming."""

import math

import pytest

from tilecraft.measure import BuildResult, MeasureErrorKind, MeasureResult
from tilecraft.measure.result import MAX_MESSAGE_CHARS


def test_long_messages_keep_their_start_and_end():
    message = "gcc: error at line 1\n" + "x" * 10_000 + "\nthe source is kept at /tmp/k.c"
    result = MeasureResult((), MeasureErrorKind.COMPILE, message, 1.0, 0.0)
    assert len(result.error_msg) < MAX_MESSAGE_CHARS + 100
    assert result.error_msg.startswith("gcc: error at line 1") and result.error_msg.endswith("/tmp/k.c")
    assert "characters trimmed" in result.error_msg


def test_mean_cost_is_infinite_for_a_failed_candidate():
    assert MeasureResult((1.0, 3.0), MeasureErrorKind.NONE, "", 5.0, 0.0).mean_cost == 2.0
    failed = MeasureResult((), MeasureErrorKind.RUN_TIMEOUT, "slow", 5.0, 0.0)
    assert math.isinf(failed.mean_cost) and not failed.is_valid


def test_costs_exist_exactly_without_error():
    with pytest.raises(ValueError, match="costs exactly when"):
        MeasureResult((), MeasureErrorKind.NONE, "", 0.0, 0.0)
    with pytest.raises(ValueError, match="lib_path exactly when"):
        BuildResult(None, "", "f", (), (), MeasureErrorKind.NONE, "", 0.0)


def test_error_kinds_are_their_strings():
    assert MeasureErrorKind("wrong_answer") is MeasureErrorKind.WRONG_ANSWER
    assert MeasureErrorKind.WORKER_CRASH == "worker_crash"
