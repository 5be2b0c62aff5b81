"""Start-up work of the executors a `bench tasks` network waits out before it measures.

Each executor embeds its agent cards (loading the embedder, a model of its own) and bids with
them once published, and loads the verifier's check model in the background (importing
transformers and dequantizing the weights: seconds of CPU). Measured asks that ran beside
that work would time start-up, not serving, and on shared cores slow the model's own thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def wait_settled(net: Any, execs: Sequence[Any], timeout_s: float) -> None:
    """Wait until every executor of ``execs`` (node.testnet.NodeProcess) bids with its agent
    cards and has loaded its check model (or failed to); TestnetError after ``timeout_s``."""
    def settled() -> bool:
        return all(e.status()["services"]["executor"]["agents"] and (
            e.log_events("verify.warmed") or e.log_events("verify.warm_failed"))
            for e in execs)

    net.wait_until(settled, "the executors' agent cards and check models", timeout_s)
