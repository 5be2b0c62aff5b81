"""The distributed-inference scenario: routed chains, speculative steps on the event loop, and
the measured saving against the closed forms."""

from __future__ import annotations

from typing import Any

import pytest

from simulations.runner.run import run_scenario
from simulations.scenario import ScenarioError, parse


def tiny(seed: int = 1, workload: dict[str, Any] | None = None,
         sweep: dict[str, Any] | None = None) -> Any:
    return parse(
        {
            "kind": "distributed",
            "seed": seed,
            "workload": {"tokens": 60, **(workload or {})},
            "sweep": {"stages": [2, 4], "hop_ms": [0, 20], "k": [1, 4],
                      "acceptance": [1.0, 0.7], **(sweep or {})},
        },
        "tiny",
        "tiny-distributed",
    )


def _rows(scenario: Any) -> list[dict[str, Any]]:
    report, _ = run_scenario(scenario)
    assert all(report.invariants.values()), report.invariants
    rows: list[dict[str, Any]] = report.results["points"]
    return rows


def test_full_acceptance_saves_the_links_of_k_out_of_k_plus_1_tokens() -> None:
    """Free drafting, flat compute, every draft kept: each step of N + 1 links and the compute
    emits k + 1 tokens, so the saving per token is R(0) * k / (k + 1) exactly."""
    rows = _rows(tiny(workload={"draft_ms": 0.0, "position_cost": 0.0},
                      sweep={"acceptance": [1.0]}))
    for r in rows:
        assert r["chain_hops"] == r["stages"]  # the routing used one server per range
        if r["k"] == "adaptive":
            continue
        k = r["k"]
        assert r["saving_ms"] == pytest.approx(r["ms_per_token_plain"] * k / (k + 1), abs=1e-3)
        if r["hop_ms"]:  # beyond DSD's estimate: N + 1 links, not N - 1, and k + 1 tokens
            assert r["saving_ms"] > r["dsd_estimate_ms"]


def test_speedup_grows_with_link_latency_and_adaptive_k_finds_a_good_length() -> None:
    rows = _rows(tiny())
    for n in (2, 4):
        for a in (1.0, 0.7):
            def speedup(hop: float, k: Any, n: int = n, a: float = a) -> float:
                return next(r["speedup"] for r in rows if r["stages"] == n and r["hop_ms"] == hop
                            and r["acceptance"] == a and r["k"] == k)
            assert speedup(20.0, 4) > speedup(0.0, 4)
            best = max(speedup(20.0, k) for k in (1, 4))
            assert speedup(20.0, "adaptive") > 0.85 * best
            assert speedup(20.0, 4) > 1.0


def test_the_report_is_reproducible_and_bad_sweeps_name_the_key() -> None:
    first, _ = run_scenario(tiny(seed=3, workload={"jitter_ms": 5.0}))
    again, _ = run_scenario(tiny(seed=3, workload={"jitter_ms": 5.0}))
    other, _ = run_scenario(tiny(seed=4, workload={"jitter_ms": 5.0}))
    assert first.to_json() == again.to_json() != other.to_json()
    with pytest.raises(ScenarioError, match=r"\[sweep\] hop_ms"):
        run_scenario(tiny(sweep={"hop_ms": ["fast"]}))
    with pytest.raises(ScenarioError, match="acceptance must lie"):
        run_scenario(tiny(sweep={"acceptance": [1.5]}))


def test_the_client_topology_pays_two_links_per_stage_the_pipeline_one() -> None:
    """The daemon's chains forward stage to stage (the default, "pipeline"); "client" is the
    direct way, N - 1 more links a step."""
    flat = {"draft_ms": 0.0, "position_cost": 0.0}
    sweep = {"acceptance": [1.0], "k": [1], "hop_ms": [20]}
    client = _rows(tiny(workload={**flat, "topology": "client"}, sweep=sweep))
    pipeline = _rows(tiny(workload=flat, sweep=sweep))
    for c, p in zip(client, pipeline, strict=True):
        n = c["stages"]
        assert c["ms_per_token_plain"] - p["ms_per_token_plain"] == pytest.approx((n - 1) * 20.0)
    with pytest.raises(ScenarioError, match="topology"):
        run_scenario(tiny(workload={"topology": "ring"}))


def test_drafting_ahead_while_the_chain_verifies_only_ever_saves() -> None:
    """The same drafts kept either way (fixed k): the lookahead only removes drafting from
    steps after a hit, every step's at full acceptance when the chain outlasts the drafts."""
    rows = _rows(tiny(workload={"draft_ms": 14.0}, sweep={"k": [4], "hop_ms": [20]}))
    for n in (2, 4):
        for a in (1.0, 0.7):
            off, on = (next(r for r in rows if r["stages"] == n and r["acceptance"] == a
                            and r["k"] == 4 and r["overlap"] is overlap)
                       for overlap in (False, True))
            assert on["measured_acceptance"] == off["measured_acceptance"]
            assert on["ms_per_token"] <= off["ms_per_token"]
            if a == 1.0:  # every draft kept and guessed: no step after the first drafts
                assert on["lookahead_hits"] == pytest.approx(1.0)
                steps = 60 / 5
                assert off["ms_per_token"] - on["ms_per_token"] == pytest.approx(
                    (steps - 1) * 4 * 14.0 / 60, rel=0.02)
    with pytest.raises(ScenarioError, match="overlap"):
        run_scenario(tiny(sweep={"overlap": ["yes"]}))
