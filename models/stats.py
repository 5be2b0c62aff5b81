"""Intervals for measured proportions (an accuracy over n independent items).

:func:`wilson_interval` is the Wilson score interval: unlike ``p +- z sqrt(p (1 - p) / n)`` it
stays inside [0, 1] and does not shrink to zero width at p = 0 or 1 with few items.

:func:`upper_bound` is the exact one-sided Clopper-Pearson upper bound of a binomial rate
(a false-positive rate): the largest rate p for which seeing ``failures`` or fewer in
``trials`` still has probability at least ``1 - confidence``. With no failures it is
``1 - (1 - confidence) ** (1 / trials)``, which the "rule of three" (3 / trials at 95%)
approximates from above.
"""

from __future__ import annotations

import math

#: the normal quantile of a two-sided 95% interval
Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of ``successes`` out of ``n`` (a float count
    is allowed: a mean over items times n). ``ValueError`` when n < 1 or the count is
    outside [0, n]."""
    if n < 1:
        raise ValueError(f"an interval needs at least one item, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _log_pmf(k: int, n: int, p: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def upper_bound(failures: int, trials: int, confidence: float = 0.95) -> float:
    """The one-sided exact (Clopper-Pearson) upper confidence bound of a rate seen as
    ``failures`` in ``trials``."""
    if not 0 <= failures <= trials or trials == 0:
        raise ValueError(f"{failures} failures in {trials} trials")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is not in (0, 1)")
    alpha = 1.0 - confidence
    if failures == trials:
        return 1.0
    if failures == 0:
        return float(1.0 - alpha ** (1.0 / trials))
    lo, hi = failures / trials, 1.0  # the CDF falls as p grows: bisect for CDF == alpha
    for _ in range(100):
        mid = (lo + hi) / 2
        if binomial_cdf(failures, trials, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi
