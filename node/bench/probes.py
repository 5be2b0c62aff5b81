"""What the robustness benches measure on a daemon from outside: /status latency, memory, fds.

:class:`StatusPoller` asks ``GET /status`` every ``every_s`` in a thread while an attack or a
load runs (a request that fails counts as its timeout); :func:`rss_mib` and :func:`fd_count`
read a process's resident memory and open file descriptors from /proc (Linux).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

STATUS_EVERY_S = 0.1
STATUS_TIMEOUT_S = 10.0


class StatusPoller:
    """Asks GET /status every ``every_s`` in a thread and keeps each latency (ms)."""

    def __init__(self, api_url: str, every_s: float = STATUS_EVERY_S) -> None:
        self.api_url = api_url
        self.every_s = every_s
        self.latencies_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> StatusPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def p99_ms(self) -> float:
        return round(pct(self.latencies_ms, 0.99), 1)

    def _loop(self) -> None:
        with httpx.Client(timeout=STATUS_TIMEOUT_S) as client:
            while not self._stop.wait(self.every_s):
                t0 = time.perf_counter()
                try:
                    client.get(self.api_url + "/status").raise_for_status()
                    self.latencies_ms.append((time.perf_counter() - t0) * 1000)
                except httpx.HTTPError:
                    self.latencies_ms.append(STATUS_TIMEOUT_S * 1000)


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def fd_count(pid: int) -> int:
    """Open file descriptors of process ``pid``."""
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
