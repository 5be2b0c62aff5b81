"""models.stats: the one-sided exact (Clopper-Pearson) upper bound the benches report."""

from __future__ import annotations

import math

import pytest

from models.stats import binomial_cdf, upper_bound


@pytest.mark.parametrize(("failures", "trials", "bound"), [
    (1, 10, 0.39416),  # published one-sided 95% Clopper-Pearson bounds
    (5, 100, 0.10225),
    (2, 2000, 0.0031445),
])
def test_the_bound_matches_published_clopper_pearson_values(failures: int, trials: int,
                                                           bound: float) -> None:
    assert upper_bound(failures, trials) == pytest.approx(bound, rel=1e-4)


@pytest.mark.parametrize(("failures", "trials"), [(1, 10), (3, 57), (12, 2000), (40, 41)])
def test_the_bound_is_where_seeing_that_few_failures_has_probability_five_percent(
        failures: int, trials: int) -> None:
    p = upper_bound(failures, trials)
    assert failures / trials < p < 1.0
    assert binomial_cdf(failures, trials, p) == pytest.approx(0.05, abs=1e-9)


@pytest.mark.parametrize("trials", [1, 20, 300, 2000, 10_000])
def test_no_failures_give_the_exact_bound_just_under_the_rule_of_three(trials: int) -> None:
    p = upper_bound(0, trials)
    assert p == pytest.approx(1 - 0.05 ** (1 / trials))
    assert p <= 3 / trials
    if trials >= 300:
        assert p == pytest.approx(3 / trials, rel=0.01)
    assert math.isclose(binomial_cdf(0, trials, p), 0.05)


def test_more_trials_tighten_the_bound_and_other_confidences_are_taken() -> None:
    assert upper_bound(0, 2000) < upper_bound(0, 1000) < upper_bound(1, 1000)
    assert upper_bound(1, 100, confidence=0.99) > upper_bound(1, 100)
    assert upper_bound(7, 7) == 1.0


@pytest.mark.parametrize(("failures", "trials", "confidence"), [
    (0, 0, 0.95), (-1, 10, 0.95), (11, 10, 0.95), (1, 10, 1.0), (1, 10, 0.0)])
def test_impossible_counts_and_confidences_are_errors(failures: int, trials: int,
                                                      confidence: float) -> None:
    with pytest.raises(ValueError):
        upper_bound(failures, trials, confidence)
