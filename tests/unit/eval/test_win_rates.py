import math

import pytest

from rlhf.eval.win_rates import bootstrap_interval, compare, outcomes, win_rate


def test_ties_count_half():
    assert outcomes([1.0, 0.5, 0.2], [0.5, 0.5, 0.7]) == [1.0, 0.5, 0.0]
    assert win_rate([1.0, 0.5, 0.2], [0.5, 0.5, 0.7]) == 0.5
    assert win_rate([0.3] * 5, [0.3] * 5) == 0.5


def test_empty_and_unpaired_sets_are_refused():
    with pytest.raises(ValueError, match="empty set"):
        win_rate([], [])
    with pytest.raises(ValueError, match="paired scores, got 2 and 1"):
        win_rate([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="empty set"):
        bootstrap_interval([], [], resamples=100, seed=0)
    with pytest.raises(ValueError, match="3 values but 2 group labels"):
        bootstrap_interval([1.0, 0.0, 1.0], [0, 1], resamples=100, seed=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([1.0], [0], resamples=100, seed=0, level=1.0)


def test_bootstrap_of_two_values_spans_both():
    """Resampling {0, 1} gives means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 2.5%
    and 97.5% percentiles are exactly 0 and 1."""
    assert bootstrap_interval([0.0, 1.0], [0, 1], resamples=4000, seed=0) == (0.0, 1.0)


def test_bootstrap_of_a_constant_is_that_constant():
    assert bootstrap_interval([0.7] * 50, list(range(50)), resamples=500, seed=3) == pytest.approx(
        (0.7, 0.7)
    )


def test_bootstrap_matches_the_normal_interval_of_a_proportion():
    """400 independent prompts, half won: 0.5 ± 1.96 * sqrt(0.25 / 400) = 0.5 ± 0.049."""
    values = [1.0, 0.0] * 200
    low, high = bootstrap_interval(values, list(range(400)), resamples=8000, seed=1)
    half_width = 1.96 * math.sqrt(0.25 / 400)
    assert low == pytest.approx(0.5 - half_width, abs=0.006)
    assert high == pytest.approx(0.5 + half_width, abs=0.006)


def test_bootstrap_resamples_prompts_not_answers():
    """400 answers to only two prompts, one always won and one always lost: the evidence is
    two prompts, so the interval is as wide as for two values."""
    values = [1.0] * 200 + [0.0] * 200
    groups = [0] * 200 + [1] * 200
    assert bootstrap_interval(values, groups, resamples=4000, seed=0) == (0.0, 1.0)


def test_bootstrap_averages_answers_and_is_seeded():
    """Prompt 0 has three answers (all won), prompt 1 one (lost). Half the resamples draw both
    prompts, and their mean is 3/4 (over answers), not 1/2: the central 40% is exactly 3/4."""
    values, groups = [1.0, 1.0, 1.0, 0.0], [0, 0, 0, 1]
    central = bootstrap_interval(values, groups, resamples=1000, seed=5, level=0.4)
    assert central == (0.75, 0.75)
    assert central == bootstrap_interval(values, groups, resamples=1000, seed=5, level=0.4)
    rate = compare([1.0, 0.9, 0.2, 0.2], [0.0, 0.9, 0.5, 0.2], [0, 0, 1, 1], resamples=500, seed=0)
    assert rate.rate == 0.5 and rate.low <= rate.rate <= rate.high


def test_decisive_win_rate_leaves_ties_out_and_resamples_the_same_prompts():
    """Prompt 0: a win and a tie; prompt 1: a loss and a tie; prompt 2: two ties."""
    scores, baseline = [1.0, 0.5, 0.0, 0.3, 0.2, 0.2], [0.0, 0.5, 1.0, 0.3, 0.2, 0.2]
    rate = compare(scores, baseline, [0, 0, 1, 1, 2, 2], resamples=2000, seed=0)
    assert rate.rate == 0.5 and rate.tie_rate == pytest.approx(4 / 6)
    assert rate.decisive == 0.5  # one win, one loss
    # resampling prompts 0 and 1 only ever gives 0, 1/2 or 1 decisive win rate
    assert (rate.decisive_low, rate.decisive_high) == (0.0, 1.0)
    all_tied = compare([0.5] * 4, [0.5] * 4, [0, 0, 1, 1], resamples=100, seed=0)
    assert all_tied.tie_rate == 1.0 and all_tied.decisive is None
    assert (all_tied.decisive_low, all_tied.decisive_high) == (None, None)


def test_bootstrap_of_a_ratio_weights_each_resample_by_its_denominator():
    """sum(values) / sum(weights): prompt 0 has 3 decisive pairs (all won), prompt 1 one (lost);
    a resample with both is 3/4, not the mean of the per-prompt rates, 1/2."""
    values, weights, groups = [1.0, 1.0, 1.0, 0.0, 0.0], [1, 1, 1, 1, 0], [0, 0, 0, 1, 1]
    central = bootstrap_interval(values, groups, resamples=1000, seed=5, level=0.4, weights=weights)
    assert central == (0.75, 0.75)
