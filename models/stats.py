"""Intervals for measured proportions (an accuracy over n independent items).

:func:`wilson_interval` is the Wilson score interval: unlike ``p +- z sqrt(p (1 - p) / n)`` it
stays inside [0, 1] and does not shrink to zero width at p = 0 or 1 with few items.
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
