"""Metrics of one simulation run: counters, bytes by kind, time series, distributions.

Contract: everything recorded is a plain int/float/str, keyed by str, and ``to_dict`` returns
the same nested dict (sorted keys, floats rounded to ``FLOAT_DIGITS``) for the same sequence of
records, so report.json is byte-identical for the same scenario and seed.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

#: floats in reports are rounded to this many significant digits
FLOAT_DIGITS = 6


def clean(value: object) -> object:
    """A JSON-stable copy of ``value``: sorted dicts, rounded floats, lists for tuples."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{FLOAT_DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): clean(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    raise TypeError(f"cannot put a {type(value).__name__} in a report")


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


class Metrics:
    __slots__ = ("counters", "bytes_by_kind", "series")

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.bytes_by_kind: dict[str, int] = {}
        self.series: dict[str, list[tuple[float, float]]] = {}

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def add_bytes(self, kind: str, n: int) -> None:
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + n

    def point(self, name: str, x: float, y: float) -> None:
        self.series.setdefault(name, []).append((x, y))

    def to_dict(self) -> dict[str, object]:
        return {
            "counters": clean(self.counters),
            "bytes_by_kind": clean(self.bytes_by_kind),
            "series": clean({k: [list(p) for p in v] for k, v in self.series.items()}),
        }


class Traffic:
    """Bytes and messages sent and received, per node index (compact arrays: a big swarm's
    transport bumps the counters of many nodes per message)."""

    __slots__ = ("bytes_sent", "bytes_received", "msgs_sent", "msgs_received")

    def __init__(self) -> None:
        self.bytes_sent: array[int] = array("q")
        self.bytes_received: array[int] = array("q")
        self.msgs_sent: array[int] = array("q")
        self.msgs_received: array[int] = array("q")

    def add_node(self) -> None:
        for counter in (self.bytes_sent, self.bytes_received, self.msgs_sent, self.msgs_received):
            counter.append(0)


def summary(values: list[float]) -> dict[str, float]:
    """Mean, p50, p90, p99, max of a list (NaN-free: an empty list gives zeros)."""
    if not values:
        return {"n": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "n": len(values),
        "mean": sum(values) / len(values),
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }
