import math

import pytest

from perfsdk.stats import percentile, rms, summarize, weighted_median


def test_summarize_exact_values():
    st = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert st.count == 5
    assert st.mean == 3.0
    assert st.min == 1.0 and st.max == 5.0
    assert st.p50 == 3.0
    assert abs(st.p90 - 4.6) < 1e-12  # (5-1)*0.9 = 3.6 -> 4 + 0.6*(5-4)
    assert abs(st.std - (2.5 ** 0.5)) < 1e-12  # sample std
    assert st.low_sample_count is True


def test_summarize_empty_and_single():
    assert summarize([]).count == 0 and summarize([]).mean is None
    one = summarize([7])
    assert one.p99 == 7 and one.std == 0.0


def test_percentile_matches_numpy_linear():
    import numpy as np

    vals = sorted([0.3, 1.7, 2.2, 9.1, 4.4, 5.0, 0.01, 3.3, 8.8, 7.7, 6.6])
    for q in (0, 10, 50, 90, 95, 99, 100):
        assert abs(percentile(vals, q) - float(np.percentile(vals, q))) < 1e-12


def test_enough_samples_not_flagged():
    assert summarize(range(100)).low_sample_count is False


def test_rms_is_about_zero_not_the_mean() -> None:
    assert rms([3.0, -4.0]) == pytest.approx(math.sqrt(12.5))
    assert rms([2.0, 2.0, 2.0]) == 2.0  # a constant's rms is itself; its spread about the mean would be 0
    with pytest.raises(ValueError, match="empty"):
        rms([])


def test_weighted_median_is_where_half_the_weight_is_reached() -> None:
    assert weighted_median([25.0, 15.0, 20.0], [3.0, 1.0, 1.0]) == 25.0
    assert weighted_median([25.0, 15.0, 20.0], [1.0, 1.0, 1.0]) == 20.0
    assert weighted_median([1.0, 2.0], [1.0, 1.0]) == 1.0  # the lower of two halves
    assert weighted_median([5.0, 9.0, 7.0], [0.0, -2.0, 4.0]) == 7.0  # no weight, no say
    with pytest.raises(ValueError, match="no positive weight"):
        weighted_median([1.0], [0.0])
    with pytest.raises(ValueError, match="no positive weight"):
        weighted_median([], [])
