import numpy as np
import pytest

from gpuscope.collectors.counters import increments, rate


def test_32_bit_wrap_is_unwrapped():
    v = np.array([4_294_000_000, 4_294_900_000, 200_000, 1_200_000], dtype=float)
    assert increments(v, 32).tolist() == [900_000, 2**32 - 4_294_900_000 + 200_000, 1_000_000]


def test_reset_is_skipped_not_counted():
    v = np.array([100.0, 200.0, 5.0, 25.0])
    inc = increments(v, None)
    assert np.isnan(inc[1]) and inc[0] == 100 and inc[2] == 20
    t = np.array([0.0, 1.0, 2.0, 3.0])
    assert rate(t, v, None) == pytest.approx(120 / 2)   # the reset interval is left out


def test_a_huge_drop_on_a_wrapping_counter_is_a_reset():
    v = np.array([1_000_000_000.0, 10.0, 20.0])   # "wrapping" would mean 3.3 GB moved
    assert np.isnan(increments(v, 32)[0])


def test_rate_needs_two_readings():
    assert rate(np.array([1.0]), np.array([5.0]), None) is None
    assert rate(np.array([1.0, 2.0]), np.array([np.nan, 5.0]), None) is None
