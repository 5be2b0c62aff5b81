"""Distributed inference: what speculative decoding saves on a chain of block servers, over a
grid of stage counts N, per-hop latencies t1 and draft lengths k, against DSD's estimate.

Each grid point builds a model of ``n_blocks`` blocks served in N equal ranges, each range by
``replicas`` servers of different speeds, and plans the chain with the daemon's own routing
(protocol.inference.routing's ``plan_chain``, from the offers and the measured round trips).
A requester then generates ``tokens`` tokens through it on the simulator's event loop: it
drafts k tokens (``draft_ms`` each) and sends the pending token and the drafts through the
chain; every link costs t1 plus up to ``jitter_ms``, and every server computes its blocks for
the k + 1 positions (``ms_per_block * blocks * (1 + position_cost * k)``: a CPU runs extra
positions for a fraction of the first one's cost). ``topology = "pipeline"`` (the default)
is the daemon's chain with stage-to-stage forwarding: each server hands off to the next and the
last answers the requester, N + 1 links a step; ``"client"`` is its direct way: the requester
sends to each server in turn and gets its output back, 2 N links. Drafts match the target's choice with probability ``acceptance``
each; the requester verifies them with protocol.inference.speculative's greedy rule, and the
adaptive runs choose k with its AdaptiveK from the virtual times they measure. With
``overlap`` (models.lookahead), a second drafter drafts on at the same speed from the moment
a draft is sent: the bonus guess (right with probability ``acceptance``), then the next draft;
when every draft is kept and the guess is right, what it drafted by the verdict opens the
next draft and only the rest is drafted before sending.

Per point: ms per token without drafting (k = 0, the same loop) and with it, the measured
saving per token, DSD's estimate (N - 1) * t1 * (k - 1) / k, and this chain's own prediction
R(0) - R(k) / E(k), with R(k) the step time (links, drafting, compute for k + 1 positions) and
E(k) = (1 - a^(k+1)) / (1 - a) the expected tokens a step emits (with overlap, R(k) counts
protocol.inference.speculative.draft_wait_ms's drafting), at the acceptance the run
measured (kept drafts over examined ones: the kept ones and the first rejection). DSD's
estimate counts N - 1 links and k tokens a round; these chains pay N + 1 links a step (2 N
the direct way), and a step that keeps every draft emits k + 1 tokens, so the measured saving
at full acceptance exceeds it.

``[workload]``: ``tokens`` (256), ``n_blocks`` (30), ``replicas`` (2), ``ms_per_block`` (2.0),
``position_cost`` (0.125), ``draft_ms`` (14.0), ``jitter_ms`` (0.0), ``topology`` ("pipeline").
``[sweep]``: ``stages`` ([2, 4, 8]), ``hop_ms`` ([0, 10, 20, 50, 100]), ``k`` ([1, 2, 4, 8]),
``acceptance`` ([1.0, 0.8, 0.6]), ``overlap`` ([false, true]). ``--nodes N`` runs N stages only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

from protocol.inference.routing import Hop, Server, plan_chain
from protocol.inference.speculative import (
    AdaptiveK,
    accept_greedy,
    draft_wait_ms,
    expected_tokens,
)
from simulations.engine import US_PER_MS, EventLoop
from simulations.runner.report import Plot, Report, Series
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.workloads.common import Progress

QUESTION = (
    "How much time per token does speculative decoding save on a chain of N block servers, "
    "over per-hop latency t1 and draft length k, against DSD's estimate (N-1)*t1*(k-1)/k?"
)
MODEL = "sim-chain"
#: the drafted token that matches the target's choice, and one that does not
MATCH, MISS = 0, 1


@dataclass(frozen=True)
class ChainSpec:
    """One simulated chain: its links, servers' compute and the drafter."""

    hop_ms: float
    jitter_ms: float
    ms_per_block: float
    position_cost: float
    draft_ms: float
    acceptance: float
    tokens: int
    #: "pipeline": each server forwards to the next and the last answers the requester (the
    #: daemon's chain, N + 1 links a step); "client": the requester sends to each server in
    #: turn and gets its output back (the chain's direct way: 2 N links a step)
    topology: str = "pipeline"
    #: a second drafter drafts on while the chain verifies (models.lookahead): its guess of the
    #: bonus token, then the next draft; what it has drafted by the verdict opens the next
    #: draft when every draft and the guess hold (the requester has a core to spare)
    overlap: bool = False

    def links(self, hops: int) -> int:
        return 2 * hops if self.topology == "client" else hops + 1


def servers_for(stages: int, n_blocks: int, replicas: int, ms_per_block: float) -> list[Server]:
    """``stages`` equal block ranges, each offered by ``replicas`` servers, the r-th of them
    (1 + 0.5 r) times slower than the fastest."""
    bounds = [round(i * n_blocks / stages) for i in range(stages + 1)]
    return [
        Server(peer=f"s{i:02d}r{r}", model=MODEL, start=bounds[i], end=bounds[i + 1],
               ms_per_block=ms_per_block * (1.0 + 0.5 * r), free_sessions=8, max_sessions=8,
               free_cache_bytes=1 << 30)
        for i in range(stages) for r in range(replicas)
    ]


class ChainRun:
    """One generation through ``hops`` on its own event loop: draft, the links, verify."""

    def __init__(self, spec: ChainSpec, hops: list[Hop], speeds: dict[str, float], k: int | None,
                 seed: int) -> None:
        self.spec, self.hops, self.speeds = spec, hops, speeds
        self.fixed_k = k
        self.adaptive = AdaptiveK(k_init=4) if k is None else None
        self.rng = random.Random(seed)
        #: the lookahead's guesses of the bonus token draw apart, so runs with and without
        #: overlap see the same drafts kept
        self.guess_rng = random.Random(seed + 1)
        self.loop = EventLoop()
        self.emitted = self.steps = self.drafted = self.accepted = self.examined = 0
        self.draft: list[int] = []
        self.step_started_us = self.drafted_at_us = 0
        self.end_us = -1
        #: the last step's lookahead: when it began, how many tokens it drafts, and how many
        #: of them open the next draft (the verdict left it holding)
        self.ahead_from_us: int | None = None
        self.ahead_limit = 0
        self.ready = 0
        self.hits = 0

    def run(self) -> ChainRun:
        self.loop.at(0, self._step)
        self.loop.run(10**15)
        if self.end_us < 0:
            raise RuntimeError("the simulated generation did not finish")
        return self

    def _link_us(self) -> int:
        jitter = self.rng.random() * self.spec.jitter_ms if self.spec.jitter_ms else 0.0
        return round((self.spec.hop_ms + jitter) * US_PER_MS)

    def _step(self) -> None:
        k = self.fixed_k if self.adaptive is None else self.adaptive.k
        k = min(k, self.spec.tokens - self.emitted - 1)
        self.draft = [MATCH if self.rng.random() < self.spec.acceptance else MISS
                      for _ in range(k)]
        self.step_started_us = self.loop.now_us
        self.loop.after(self._draft_wait_us(k), self._send, 0)

    def _draft_wait_us(self, k: int) -> int:
        """How long this step waits for its k drafts: those the last step's lookahead had
        not drafted by its verdict, or all of them."""
        ready, self.ready = min(k, self.ready), 0
        return round((k - ready) * self.spec.draft_ms * US_PER_MS)

    def _send(self, hop: int) -> None:
        if hop == 0:
            self.drafted_at_us = self.loop.now_us
            if self.spec.overlap and self.draft:
                self.ahead_from_us, self.ahead_limit = self.loop.now_us, len(self.draft) + 1
        if hop == len(self.hops):  # the last server answers the requester
            self.loop.after(self._link_us(), self._verify)
        else:
            self.loop.after(self._link_us(), self._compute, hop)

    def _compute(self, hop: int) -> None:
        h = self.hops[hop]
        positions = 1 + len(self.draft)
        ms = self.speeds[h.peer] * (h.end - h.start) * (1.0 + self.spec.position_cost * (positions - 1))
        if self.spec.topology == "client" and hop + 1 < len(self.hops):
            self.loop.after(round(ms * US_PER_MS), self._back_to_requester, hop + 1)
        else:
            self.loop.after(round(ms * US_PER_MS), self._send, hop + 1)

    def _back_to_requester(self, next_hop: int) -> None:
        self.loop.after(self._link_us(), self._send, next_hop)

    def _verify(self) -> None:
        verdict = accept_greedy(self.draft, [MATCH] * (len(self.draft) + 1))
        if self.spec.overlap and self.draft and self.spec.draft_ms > 0:
            d_us = self.spec.draft_ms * US_PER_MS
            assert self.ahead_from_us is not None
            drafted = min(self.ahead_limit,
                          math.floor((self.loop.now_us - self.ahead_from_us) / d_us))
            guessed = self.guess_rng.random() < self.spec.acceptance  # the bonus token
            if verdict.accepted == len(self.draft) and drafted >= 1 and guessed:
                self.ready, self.hits = drafted - 1, self.hits + 1
        self.steps += 1
        self.drafted += len(self.draft)
        self.accepted += verdict.accepted
        self.examined += min(verdict.accepted + 1, len(self.draft))
        self.emitted += len(verdict.tokens)
        if self.adaptive is not None and self.draft:
            now = self.loop.now_us
            self.adaptive.observe(
                drafted=len(self.draft), accepted=verdict.accepted,
                draft_ms=(self.drafted_at_us - self.step_started_us) / US_PER_MS,
                step_ms=(now - self.drafted_at_us) / US_PER_MS, positions=1 + len(self.draft))
        if self.emitted >= self.spec.tokens:
            self.end_us = self.loop.now_us
            self.loop.stop()
        else:
            self._step()

    @property
    def ms_per_token(self) -> float:
        return self.end_us / US_PER_MS / self.emitted


def step_ms(spec: ChainSpec, hops: list[Hop], speeds: dict[str, float], k: int,
            acceptance: float) -> float:
    """R(k): one step's expected time with k drafts (no jitter: its mean is added per link):
    the chain's links and compute, and the drafting left on the critical path
    (protocol.inference.speculative.draft_wait_ms)."""
    links = spec.links(len(hops)) * (spec.hop_ms + spec.jitter_ms / 2)
    compute = sum(speeds[h.peer] * (h.end - h.start) for h in hops) * (1 + spec.position_cost * k)
    verify = links + compute
    return verify + draft_wait_ms(k, acceptance, spec.draft_ms, verify, overlap=spec.overlap)


def _point(scenario: Scenario, stages: int, spec: ChainSpec, ks: list[int],
           overlaps: list[bool], seed: int) -> list[dict[str, Any]]:
    n_blocks = int(workload_value(scenario, "n_blocks", 30))
    replicas = int(workload_value(scenario, "replicas", 2))
    servers = servers_for(stages, n_blocks, replicas, spec.ms_per_block)
    rtt = {s.peer: 2 * spec.hop_ms for s in servers}
    hops = plan_chain(servers, MODEL, 0, n_blocks, rtt_ms=rtt)
    speeds = {s.peer: s.ms_per_block for s in servers}
    plain = ChainRun(spec, hops, speeds, 0, seed).run().ms_per_token
    rows = []
    for overlap, k in itertools.product(overlaps, [*ks, None]):
        spec = dataclasses.replace(spec, overlap=overlap)
        run = ChainRun(spec, hops, speeds, k, seed).run()
        row: dict[str, Any] = {
            "stages": stages, "hop_ms": spec.hop_ms, "acceptance": spec.acceptance,
            "k": "adaptive" if k is None else k, "overlap": overlap, "chain_hops": len(hops),
            "ms_per_token_plain": plain, "ms_per_token": run.ms_per_token,
            "speedup": plain / run.ms_per_token, "saving_ms": plain - run.ms_per_token,
            "measured_acceptance": run.accepted / run.examined if run.examined else 0.0,
            "mean_k": run.drafted / run.steps, "lookahead_hits": run.hits / run.steps,
        }
        if k is not None and k > 0:
            row["dsd_estimate_ms"] = (stages - 1) * spec.hop_ms * (k - 1) / k
            a = row["measured_acceptance"]
            row["predicted_saving_ms"] = (step_ms(spec, hops, speeds, 0, a)
                                          - step_ms(spec, hops, speeds, k, a)
                                          / expected_tokens(a, k))
        rows.append(row)
    return rows


def _floats(scenario: Scenario, key: str, default: list[float]) -> list[float]:
    raw = scenario.sweep.get(key, default)
    if not isinstance(raw, list) or not raw or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in raw):
        raise ScenarioError(f"{scenario.name} [sweep] {key}: expected a list of numbers >= 0, "
                            f"got {raw!r}")
    return [float(v) for v in raw]


def _topology(scenario: Scenario) -> str:
    topology = str(workload_value(scenario, "topology", "pipeline"))
    if topology not in ("client", "pipeline"):
        raise ScenarioError(f"{scenario.name} [workload] topology: 'client' or 'pipeline', "
                            f"got {topology!r}")
    return topology


def _grid(scenario: Scenario) -> tuple[list[int], list[float], list[int], list[float]]:
    stages = [scenario.nodes] if scenario.nodes_overridden else [
        int(v) for v in _floats(scenario, "stages", [2, 4, 8])]
    ks = [int(v) for v in _floats(scenario, "k", [1, 2, 4, 8])]
    acceptance = _floats(scenario, "acceptance", [1.0, 0.8, 0.6])
    if any(a > 1.0 for a in acceptance) or any(k < 1 for k in ks) or any(n < 1 for n in stages):
        raise ScenarioError(f"{scenario.name} [sweep]: acceptance must lie in [0, 1], k and "
                            "stages be >= 1")
    return stages, _floats(scenario, "hop_ms", [0, 10, 20, 50, 100]), ks, acceptance


def _overlaps(scenario: Scenario) -> list[bool]:
    raw = scenario.sweep.get("overlap", [False, True])
    if not isinstance(raw, list) or not raw or not all(isinstance(v, bool) for v in raw):
        raise ScenarioError(f"{scenario.name} [sweep] overlap: expected a list of true/false, "
                            f"got {raw!r}")
    return list(dict.fromkeys(raw))


def run(scenario: Scenario, progress: Progress) -> Report:
    stages_list, hop_list, ks, acceptance_list = _grid(scenario)
    overlaps = _overlaps(scenario)
    rows: list[dict[str, Any]] = []
    total = len(stages_list) * len(hop_list) * len(acceptance_list)
    for n_stages in stages_list:
        for hop_ms in hop_list:
            for a in acceptance_list:
                spec = ChainSpec(
                    hop_ms=hop_ms, jitter_ms=float(workload_value(scenario, "jitter_ms", 0.0)),
                    ms_per_block=float(workload_value(scenario, "ms_per_block", 2.0)),
                    position_cost=float(workload_value(scenario, "position_cost", 0.125)),
                    draft_ms=float(workload_value(scenario, "draft_ms", 14.0)),
                    acceptance=a, tokens=int(workload_value(scenario, "tokens", 256)),
                    topology=_topology(scenario))
                rows.extend(_point(scenario, n_stages, spec, ks, overlaps, scenario.seed))
                progress(len(rows) / (total * (len(ks) + 1) * len(overlaps)),
                         f"N={n_stages} t1={hop_ms:g} ms")
    return _report(scenario, rows)


def _report(scenario: Scenario, rows: list[dict[str, Any]]) -> Report:
    fixed = [r for r in rows if r["k"] != "adaptive" and r["hop_ms"] > 0]
    full = [r for r in fixed if r["acceptance"] == 1.0 and r["k"] > 1 and not r["overlap"]]
    headline: dict[str, Any] = {
        "points": len(rows),
        # the largest gap between measured and predicted saving, as a share of plain decoding's
        # time per token
        "prediction_error_max": max((abs(r["saving_ms"] - r["predicted_saving_ms"])
                                     / r["ms_per_token_plain"] for r in fixed), default=0.0),
        "saving_over_dsd_median_a1": statistics.median(
            r["saving_ms"] / r["dsd_estimate_ms"] for r in full if r["dsd_estimate_ms"] > 0
        ) if any(r["dsd_estimate_ms"] > 0 for r in full) else 0.0,
    }
    for r in rows:
        if r["stages"] == 4 and r["hop_ms"] == 20 and r["acceptance"] == 0.8:
            key = f"speedup_n4_20ms_a08_k{r['k']}" + ("_overlap" if r["overlap"] else "")
            headline[key] = r["speedup"]
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=headline,
        results={"points": rows},
        plots=_plots(rows),
        invariants={
            "every_run_finished": True,
            "saving_matches_prediction": headline["prediction_error_max"] <= 0.05,
        },
        notes=[
            "DSD's estimate counts N-1 links and k tokens per round; the daemon's chain forwards "
            "stage to stage (N+1 links a step; 2N with topology = 'client', its direct way) "
            "and a step that keeps every draft emits k+1 tokens.",
            "Compute grows with the positions a step verifies (position_cost): at t1 = 0 drafting "
            "only costs, which the adaptive k sees and answers with its shortest draft.",
        ],
    )


def _plots(rows: list[dict[str, Any]]) -> list[Plot]:
    plots = []
    mid = sorted({r["stages"] for r in rows})[len({r["stages"] for r in rows}) // 2]
    a_mid = sorted({r["acceptance"] for r in rows})[len({r["acceptance"] for r in rows}) // 2]
    series = []
    for overlap, hop in itertools.product(sorted({r["overlap"] for r in rows}),
                                          sorted({r["hop_ms"] for r in rows})):
        pts = [r for r in rows if r["stages"] == mid and r["acceptance"] == a_mid
               and r["hop_ms"] == hop and r["k"] != "adaptive" and r["overlap"] == overlap]
        series.append(Series(f"t1 = {hop:g} ms" + (", overlap" if overlap else ""),
                             [float(r["k"]) for r in pts], [r["speedup"] for r in pts]))
    plots.append(Plot("speedup_vs_k", f"Speed-up over plain decoding, N = {mid}, acceptance "
                      f"{a_mid:g}", "drafted tokens k", "speed-up", series, hlines=[("1x", 1.0)]))
    scatter = []
    for n in sorted({r["stages"] for r in rows}):
        pts = sorted((r["dsd_estimate_ms"], r["saving_ms"]) for r in rows
                     if r["stages"] == n and r["acceptance"] == 1.0 and "dsd_estimate_ms" in r
                     and not r["overlap"])
        scatter.append(Series(f"N = {n}, a = 1", [p[0] for p in pts], [p[1] for p in pts]))
    top = max((s for ser in scatter for s in ser.x), default=1.0)
    scatter.append(Series("measured = DSD estimate", [0.0, top], [0.0, top]))
    plots.append(Plot("saving_vs_dsd", "Measured saving per token vs DSD's (N-1) t1 (k-1)/k",
                      "DSD estimate (ms)", "measured saving (ms per token)", scatter))
    return plots
