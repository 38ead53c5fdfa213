import pytest

from tilecraft.runtime import ProfileResult, time_callable
from tilecraft.runtime import timer


class FakeClock:
    """``perf_counter`` that moves only when the timed function or the flush says so."""

    def __init__(self):
        self.now_secs = 0.0
        self.calls = 0

    def __call__(self):
        return self.now_secs

    def kernel(self, cost_secs=1e-3):
        def run():
            self.calls += 1
            self.now_secs += cost_secs
        return run


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timer, "perf_counter", fake)
    return fake


def test_results_are_seconds_per_call_one_per_repeat(clock):
    result = time_callable(clock.kernel(2e-3), number=4, repeat=3)
    assert result.results == pytest.approx((2e-3,) * 3)
    assert clock.calls == 1 + 4 * 3  # one untimed warm-up


def test_min_repeat_ms_adds_calls_until_the_target(clock):
    result = time_callable(clock.kernel(1e-3), number=1, repeat=2, min_repeat_ms=10)
    assert result.results == pytest.approx((1e-3, 1e-3))
    # 1 ms is too short: 10 more calls make 11 ms; the second repeat starts at 11 calls.
    assert clock.calls == 1 + (1 + 10) + 11


def test_a_short_first_batch_is_kept_not_thrown_away(clock):
    result = time_callable(clock.kernel(1e-3), number=4, repeat=1, min_repeat_ms=5.5)
    assert clock.calls == 1 + 4 + 2 and result.results == pytest.approx((1e-3,))


def test_warmup_can_be_skipped(clock):
    time_callable(clock.kernel(1e-3), number=3, repeat=1, warmup=False)
    assert clock.calls == 3


def test_flush_runs_before_every_call_and_is_not_timed(clock):
    flushes = []

    def flush():
        flushes.append(clock.calls)
        clock.now_secs += 0.5

    result = time_callable(clock.kernel(1e-3), number=3, repeat=2, flush=flush)
    assert result.results == pytest.approx((1e-3, 1e-3))
    assert len(flushes) == 6


def test_real_clock_gives_positive_times():
    result = time_callable(lambda: sum(range(100)), number=3, repeat=2, min_repeat_ms=1)
    assert len(result.results) == 2 and all(t > 0 for t in result.results)


@pytest.mark.parametrize("kwargs, named", [
    ({"number": 0}, "number=0"), ({"repeat": 0}, "repeat=0"), ({"min_repeat_ms": -1}, "min_repeat_ms=-1"),
])
def test_invalid_settings_name_the_parameter(kwargs, named):
    with pytest.raises(ValueError, match=named):
        time_callable(lambda: None, **kwargs)


def test_profile_result_statistics():
    result = ProfileResult((1.0, 2.0, 4.0))
    assert (result.mean, result.median, result.min, result.max) == (pytest.approx(7 / 3), 2.0, 1.0, 4.0)
    assert result.std == pytest.approx(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) ** 0.5 / 3 ** 0.5)
    assert ProfileResult((3.0,)).std == 0.0


def test_empty_profile_result_is_rejected():
    with pytest.raises(ValueError, match="repeat >= 1"):
        ProfileResult(())


def _slowing(clock, fast_calls, fast_secs, slow_secs):
    """A kernel that runs ``fast_secs`` a call ``fast_calls`` times, then ``slow_secs`` (a slow spell)."""
    def run():
        clock.calls += 1
        clock.now_secs += fast_secs if clock.calls <= fast_calls else slow_secs
    return run


def test_a_slow_spell_in_a_grown_batch_ends_the_repeat_at_its_deadline(clock):
    # 3 calls of 6 us grow the batch to ~16,700 calls for 100 ms; then each call takes 8 ms.
    result = time_callable(_slowing(clock, 4, 6e-6, 8e-3), number=3, repeat=1, min_repeat_ms=100)
    limit = timer.DEADLINE_FACTOR * 0.1 + timer._CHECK_EVERY * 8e-3  # the deadline, plus calls between looks
    assert clock.now_secs <= limit + 8e-3  # (the warm-up call was fast)
    assert clock.calls < 200 and result.results[0] > 1e-3  # a slow reading, not two minutes of calls


def test_the_first_number_calls_run_whatever_the_time(clock):
    result = time_callable(clock.kernel(2.0), number=3, repeat=1, min_repeat_ms=100, warmup=False)
    assert clock.calls == 3 and result.results == (2.0,)


def test_a_slow_spell_with_a_flush_also_ends_at_the_deadline(clock):
    flushes = []
    result = time_callable(_slowing(clock, 4, 6e-6, 8e-3), number=3, repeat=1, min_repeat_ms=100,
                           flush=lambda: flushes.append(1))
    assert clock.now_secs <= timer.DEADLINE_FACTOR * 0.1 + 2 * 8e-3 and result.results[0] > 1e-3
    assert len(flushes) == clock.calls - 1  # one before every timed call, none before the warm-up
