"""The network model: when (and whether) a message of ``size`` bytes from node a reaches node b.

Contract
--------
* Nodes are dense indices ``0..n-1``. Each has an uplink and a downlink rate (bytes/s) and a
  region. A link's one-way latency is either ``regions[ra][rb]`` milliseconds (a region matrix)
  or drawn once per unordered pair from a latency distribution (so a link keeps its latency),
  plus a per-message jitter drawn uniformly in ``[0, jitter_ms]``: jitter is what reorders
  messages.
* Transfers are FIFO on both ends: a transfer occupies the sender's uplink and the receiver's
  downlink for ``size / min(up_a, down_b)`` seconds; it starts when the uplink is free and the
  first byte reaches b after the latency; b's downlink receives one transfer at a time. So one
  big transfer costs ``S/B`` plus the latency, not twice, and a node serving many peers at once
  shares its uplink among them. A small frame (``SMALL_MESSAGE_BYTES``) on a busy link does
  not wait for the queue: packets of many streams interleave on a real link.
* ``loss`` drops a message; ``duplicate`` delivers a second copy a little later. Partitions
  split the nodes into groups; no message crosses a group while the partition lasts.
* All randomness comes from the ``random.Random`` given to the constructor, drawn in the order
  the simulation asks, so a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass

from simulations.engine import US_PER_S

#: bytes/s of one Mbit/s
MBIT = 125_000
#: a distribution kind -> how to draw one latency in ms from (a, b)
LATENCY_KINDS = ("constant", "uniform", "lognormal")
#: a link's latency is never below this (ms), whatever the distribution draws
MIN_LATENCY_MS = 0.05
#: extra delay of a duplicated copy, as a multiple of the link latency (at least 1 ms)
DUPLICATE_DELAY_FACTOR = 0.5
#: frames up to this size do not queue behind bulk transfers on a busy link
SMALL_MESSAGE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """One-way link latency: a region matrix (ms) if ``regions`` is set, else a distribution.

    Distribution parameters: ``constant`` a ms; ``uniform`` in [a, b] ms; ``lognormal`` with
    median a ms and shape (sigma) b.
    """

    kind: str = "constant"
    a: float = 20.0
    b: float = 0.0
    jitter_ms: float = 0.0
    region_names: tuple[str, ...] = ()
    regions: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LATENCY_KINDS:
            raise ValueError(f"latency kind {self.kind!r} is not one of {LATENCY_KINDS}")
        if self.regions:
            size = len(self.region_names)
            if len(self.regions) != size or any(len(row) != size for row in self.regions):
                raise ValueError("the latency region matrix must be square, one row per region")


@dataclass(frozen=True, slots=True)
class LinkFaults:
    loss: float = 0.0
    duplicate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability, got {value}")


class NetworkModel:
    """Per-node bandwidth and region, per-link latency, loss, duplication, partitions."""

    def __init__(
        self,
        rng: random.Random,
        *,
        latency: LatencyModel,
        faults: LinkFaults | None = None,
    ) -> None:
        self.rng = rng
        self.latency = latency
        self.faults = faults or LinkFaults()
        self.up_bps: list[float] = []
        self.down_bps: list[float] = []
        self.region: list[int] = []
        #: when each node's uplink and downlink are free (compact: read for every copy sent)
        self._up_free_us: array[int] = array("q")
        self._down_free_us: array[int] = array("q")
        self._pair_latency_us: dict[int, int] = {}
        #: min(up, down) when every node has the same up and down rates, else None
        self._one_rate: float | None = None
        #: node index -> partition group, or -1 when no partition is in force
        self.group: list[int] = []
        self._partitioned = False
        self._loss = self.faults.loss
        self._duplicate = self.faults.duplicate
        self._jitter_us = int(latency.jitter_ms * 1000)
        self._constant_us = (
            int(max(latency.a, MIN_LATENCY_MS) * 1000)
            if latency.kind == "constant" and not latency.regions
            else None
        )

    def add_node(self, up_bps: float, down_bps: float, region: int = 0) -> int:
        if up_bps <= 0 or down_bps <= 0:
            raise ValueError("bandwidth must be positive")
        if self.latency.regions and not 0 <= region < len(self.latency.regions):
            raise ValueError(f"region {region} is not in the latency matrix")
        if not self.up_bps:
            self._one_rate = min(up_bps, down_bps)
        elif self._one_rate is not None and (up_bps, down_bps) != (self.up_bps[0], self.down_bps[0]):
            self._one_rate = None  # links differ: each transfer finds its own rate
        self.up_bps.append(up_bps)
        self.down_bps.append(down_bps)
        self.region.append(region)
        self._up_free_us.append(0)
        self._down_free_us.append(0)
        self.group.append(-1)
        return len(self.up_bps) - 1

    @property
    def jitter_us(self) -> int:
        """The most a message's latency is stretched by its jitter draw (exclusive)."""
        return self._jitter_us

    @property
    def one_rate(self) -> float | None:
        """min(up, down) in bytes/s when every node has the same rates, else None."""
        return self._one_rate

    # ------------------------------------------------------------------ latency

    def base_latency_us(self, a: int, b: int) -> int:
        if self._constant_us is not None:
            return self._constant_us
        lat = self.latency
        if lat.regions:
            return int(lat.regions[self.region[a]][self.region[b]] * 1000)
        key = a * 1_000_003 + b if a < b else b * 1_000_003 + a
        cached = self._pair_latency_us.get(key)
        if cached is not None:
            return cached
        if lat.kind == "constant":
            ms = lat.a
        else:
            # A pair's latency is a pure function of the pair, not of the order links are
            # first used, so adding a node never shifts the latencies of the others.
            pair_rng = random.Random(key)
            if lat.kind == "uniform":
                ms = pair_rng.uniform(lat.a, lat.b)
            else:
                ms = lat.a * math.exp(lat.b * pair_rng.gauss(0.0, 1.0))
        value = int(max(ms, MIN_LATENCY_MS) * 1000)
        self._pair_latency_us[key] = value
        return value

    def rtt_us(self, a: int, b: int) -> int:
        return 2 * self.base_latency_us(a, b)

    # ------------------------------------------------------------------ partitions

    def apply_partition(self, groups: list[list[int]]) -> None:
        for i in range(len(self.group)):
            self.group[i] = -2  # a node named in no group is cut off from everyone
        for g, members in enumerate(groups):
            for node in members:
                self.group[node] = g
        self._partitioned = True

    def heal(self) -> None:
        for i in range(len(self.group)):
            self.group[i] = -1
        self._partitioned = False

    def is_partitioned(self) -> bool:
        return self._partitioned

    def reachable(self, a: int, b: int) -> bool:
        if not self._partitioned:
            return True
        ga = self.group[a]
        return ga >= 0 and ga == self.group[b]

    # ------------------------------------------------------------------ transfers

    def transfer(self, a: int, b: int, size: int, now_us: int) -> tuple[int, ...]:
        """Arrival times (us) at b of a message of ``size`` bytes sent now: () if lost.

        Occupies a's uplink and b's downlink even when the message is then lost, as a real
        lost packet does.
        """
        end, latency = self._copy_end(a, b, size, now_us)
        return self._faults(end, latency)

    def _copy_end(self, a: int, b: int, size: int, now_us: int) -> tuple[int, int]:
        """When a copy of ``size`` bytes sent now by a ends at b, before faults, and the
        latency it met (jitter drawn); the links' queues advance as it takes them."""
        up = self.up_bps[a]
        down = self.down_bps[b]
        duration = int(size * US_PER_S / (up if up < down else down)) + 1
        latency = self._constant_us
        if latency is None:
            latency = self.base_latency_us(a, b)
        if self._jitter_us:
            latency += int(self.rng.random() * self._jitter_us)
        if size <= SMALL_MESSAGE_BYTES and (
            self._up_free_us[a] > now_us + duration or self._down_free_us[b] > now_us
        ):
            # a small frame interleaves with bulk transfers (packets, not whole messages,
            # share a link): it pays its own serialization, not the queue's
            return now_us + latency + duration, latency
        start = self._up_free_us[a]
        if start < now_us:
            start = now_us
        rx_start = start + latency
        down_free = self._down_free_us[b]
        if rx_start < down_free:
            rx_start = down_free
        end = rx_start + duration
        # backpressure: the sender's uplink stays committed until b has taken the bytes
        self._up_free_us[a] = rx_start - latency + duration
        self._down_free_us[b] = end
        return end, latency

    def flood_hop(
        self,
        a: int,
        mesh: list[int],
        skip: int,
        arrival: array[int],
        size: int,
        now_us: int,
        rx_bytes: array[int],
        rx_msgs: array[int],
    ) -> tuple[list[tuple[int, int]], int]:
        """One gossip hop: a sends ``size`` bytes now to every b of ``mesh`` but ``skip``.

        ``arrival[b]`` is 0 (nothing on its way to b), the earliest arrival + 1 of a copy on
        its way, or -1 (b has the message). Returns the copies that will arrive first, as
        ``(b, time)`` in mesh order (``arrival`` is updated for them), and how many copies will
        be dropped as duplicates: those count at once in b's ``rx_bytes`` and ``rx_msgs``
        (indexed by node), as they would on arrival. Each copy is ``transfer``: the
        same draws, the same link state; except that a small copy to a node that has the
        message already is not timed (too small to matter to the link's queue). Copies to a
        node cut off by a partition are neither.
        """
        faulty = self._partitioned or self._loss or self._duplicate
        first: list[tuple[int, int]] = []
        dups = 0
        small = size <= SMALL_MESSAGE_BYTES
        for b in mesh:
            if b == skip or (faulty and not self.reachable(a, b)):
                continue
            if small and arrival[b] == -1:
                dups += 1
                rx_bytes[b] += size
                rx_msgs[b] += 1
                continue
            if faulty:
                ends = self.transfer(a, b, size, now_us)
            else:  # a copy arrives once, and _faults would draw nothing
                ends = (self._copy_end(a, b, size, now_us)[0],)
            for at in ends:
                seen = arrival[b]
                if seen == -1 or 0 < seen <= at + 1:
                    dups += 1
                    rx_bytes[b] += size
                    rx_msgs[b] += 1
                else:
                    arrival[b] = at + 1
                    first.append((b, at))
        return first, dups

    def _faults(self, end: int, latency: int) -> tuple[int, ...]:
        if self._loss and self.rng.random() < self._loss:
            return ()
        if self._duplicate and self.rng.random() < self._duplicate:
            extra = max(1000, int(latency * DUPLICATE_DELAY_FACTOR))
            return (end, end + extra)
        return (end,)

    def up_free_us(self, a: int) -> int:
        """When node a's uplink has sent everything queued so far."""
        return self._up_free_us[a]

    def stream(self, a: int, b: int, size: int, now_us: int) -> tuple[int, ...]:
        """Arrival times (us) at b of ``size`` bytes on a bulk stream from a, sent now: () if
        lost.

        Unlike ``transfer``, a's uplink is held only for its own share (``size / up``) and b's
        downlink takes the bytes as a queue of its own: several senders streaming to one
        receiver share its downlink, as concurrent TCP streams do, instead of each holding
        its uplink idle until the receiver has taken the others' bytes whole.
        """
        up = self.up_bps[a]
        down = self.down_bps[b]
        send_us = int(size * US_PER_S / up) + 1
        start = self._up_free_us[a]
        if start < now_us:
            start = now_us
        self._up_free_us[a] = start + send_us
        latency = self._constant_us
        if latency is None:
            latency = self.base_latency_us(a, b)
        if self._jitter_us:
            latency += int(self.rng.random() * self._jitter_us)
        rx_start = start + latency
        take_us = int(size * US_PER_S / down) + 1
        down_free = self._down_free_us[b]
        end = max(rx_start + send_us, (down_free if down_free > rx_start else rx_start) + take_us)
        self._down_free_us[b] = end
        return self._faults(end, latency)

    def reset_node(self, a: int, now_us: int) -> None:
        """A restarted node starts with idle links."""
        self._up_free_us[a] = now_us
        self._down_free_us[a] = now_us
