"""`symphony bench scale` end to end on a handful of light daemons: the daemons start without
a model, the update is seen to converge at every node, the gossip counters move, and the
simulator's predictions come out beside the measured figures."""

from __future__ import annotations

import math

import pytest

from node.bench.scale.bench import PREDICTED, scale

pytestmark = pytest.mark.integration

NODES = 4


def test_bench_scale_measures_a_light_testnet_and_predicts_it() -> None:
    # settled past one ping interval, so that each link's round trip was measured once more
    figures = scale(NODES, updates=1, window_s=3.0, batch=NODES, settle_s=6.0)
    keys = {"converged_s", "gossip_bytes_per_node_min", "rss_mb_per_daemon", "peers_per_node",
            "sim_prediction_error"} | {f"sim_{k}" for k in PREDICTED}
    assert keys <= set(figures), sorted(keys - set(figures))
    assert figures["nodes"] == NODES and figures["updates"] == 1
    # the new record reached every other node (an arrival was read from each), in time
    assert 0 < figures["converged_s"] <= figures["window_s"]
    assert figures["gossip_copies_per_node"] >= 1
    assert figures["gossip_bytes_per_node_min"] > 0
    # every daemon found every other (target 8 > NODES - 1), and so did the simulated ones
    assert figures["peers_per_node"] == NODES - 1 == figures["sim_peers_per_node"]
    # a light daemon loads no model: far below a full daemon's resident memory
    assert 0 < figures["rss_mb_per_daemon"] <= 200
    assert figures["sim_converged_s"] > 0
    assert math.isfinite(figures["sim_prediction_error"])
