"""Token buckets by key, pure: the one rate limiter that protocol machines and the daemon's
stream guards share."""

from __future__ import annotations

from collections import OrderedDict

#: keys tracked by default (the least recently seen forgotten first)
MAX_TRACKED_KEYS = 4096


class KeyedBuckets:
    """Token buckets by key (a peer, a peer and protocol): ``rate`` per second, bursts of up to
    ``burst``; at most ``max_keys`` keys, the least recently seen forgotten first (a
    forgotten key starts again with a full bucket, which is the worst an attacker gains)."""

    def __init__(self, rate: float, burst: float, max_keys: int = MAX_TRACKED_KEYS) -> None:
        self._rate, self._burst, self._max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[object, tuple[float, int]] = OrderedDict()

    def take(self, key: object, now_ms: int) -> bool:
        """Spend one token of ``key``'s bucket; False (nothing spent) when it is empty."""
        tokens, updated = self._buckets.pop(key, (self._burst, now_ms))
        tokens = min(self._burst, tokens + max(0, now_ms - updated) / 1000 * self._rate)
        if len(self._buckets) >= self._max_keys:
            self._buckets.popitem(last=False)
        ok = tokens >= 1
        self._buckets[key] = (tokens - 1 if ok else tokens, now_ms)
        return ok
