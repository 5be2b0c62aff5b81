"""`symphony bench distributed`: the default model split by blocks across real daemons, with
and without speculative decoding, in one run on one set of daemons.

The model is SmolLM2-135M (30 blocks): the stages hold fp32 torch blocks dequantized from its
Q4_1 GGUF (models.blocks), one torch thread each; the requester daemons hold the embedding and
head and draft with llama.cpp on the same Q4_1 file. Hidden states travel as fp16. Seven block
servers serve the 2-stage ranges (0-15, 15-30) and the 4-stage ones (0-8, 8-15 twice: a spare,
15-23, 23-30); each requester daemon is told which of them it may use
(node.bench.distributed.testnet), and all start at once. Chains forward stage to stage (N + 1
links a step) unless named ``direct`` (the requester sends to each stage in turn: 2 N links).

* ``tokens_per_s_single``: greedy decoding of the whole model in this process (LocalTarget,
  one torch thread), the reference output every greedy chain output is compared with.
* ``overhead_ratio_2`` / ``overhead_ratio_4``: time per token through the 2- and the 4-stage
  chain on loopback (no link delay) over the single-process time per token (goal <= 1.3);
  the single-process runs are interleaved with the chains' so a busy spell hits all of them.
* ``dsd_speedup_20ms``: the 4-stage chain with every link held 20 ms (``[inference]
  link_delay_ms`` of its requester: its servers hold that session's frames too): tokens/s
  with speculative decoding (drafts of at most ``SPEC_K`` tokens, their length adapted step by
  step; greedy verification: the output must stay identical) over tokens/s without;
  ``mean_k`` is the mean draft length. ``mars_speedup_20ms`` is the same with MARS
  verification (not exact; theta 0.9). ``acceptance_rate``: drafts kept / drafted in the
  greedy speculative run; ``position_acceptance``: kept / examined (a step examines its kept
  drafts and the first rejected one); ``draft_ms_per_token``: the requester's drafter's time
  per token it drafted, beside the stages; ``draft_s``: the drafting the steps waited for;
  ``lookahead_hits``: steps whose draft a lookahead (drafting while the chain verified)
  began (each with a ``_mars`` twin).
* Without ``--quick`` the same chains also run the direct way: ``overhead_ratio_2_direct``,
  ``overhead_ratio_4_direct``, ``tokens_per_s_chain4_20ms_direct`` and
  ``dsd_speedup_20ms_direct`` (speculative over plain, both direct).
* ``stage_param_mb_max`` / ``whole_param_mb``: the largest 4-stage range's parameters vs the
  whole model's blocks; ``stage_rss_mb_max``: the largest peak RSS among the servers.
* ``recovery_s`` (run last): the server of blocks 8-15 in use by the 4-stage chain is
  SIGKILLed a third of the way into a generation; the time from the kill until the spare has
  taken the replayed history and served the step again (polled every 0.1 s).
  ``recovery_extra_wall_s``: the generation's wall time over the fastest one without the
  kill; ``recoveries`` counts the replans.
* ``identical``: every greedy output through a chain (plain, speculative, recovered) equals
  the single-process one. ``wall_s``: the whole bench.

Every timed generation runs ``REPEATS`` times (once with ``--quick``) and the fastest counts;
the loopback runs behind the overhead ratios ``LOOPBACK_REPEATS`` times in both modes (the
single process and the chains interleaved, a round at a time), since those ratios are the
goal and the load of a shared machine swings within a run. ``load_1m_start`` /
``load_1m_end``: the 1-minute load average when the bench started and ended.
``--quick`` generates 16 tokens instead of 64 and leaves out the direct-way chains.

``--link SPEC`` runs every daemon behind that link (node/p2p/link.py; ``link`` echoes it). The
chains' overhead ratios then hold the link's round trips, and the ``_20ms`` figures come from
the 4-stage requesters' chains at the link's round trip with no emulated delay on top
(``link_delay_ms`` 0; the ``r4-20ms`` requesters are not started): ``--link rtt=40ms`` holds
each hop 20 ms one way, as the emulation does, but in the TCP connection under libp2p.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from node.bench.distributed.testnet import (
    ChainTestnet,
    RequesterSpec,
    chain_testnet,
    elapsed,
    peak_rss_mb,
    split,
    wait_for_session,
)

PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg")
QUICK_TOKENS = 16
FULL_TOKENS = 64
LINK_DELAY_MS = 20.0
SPEC_K = 8
#: each timed generation runs this often (once with --quick) and the fastest counts: the
#: machine is shared
REPEATS = 2
#: the single-process and loopback chain runs (the overhead ratios) repeat this often, in
#: both modes: the fastest of each counts
LOOPBACK_REPEATS = 3
MIB = float(1 << 20)


class Reference:
    """The whole model in this process: greedy tokens and the best time per run."""

    def __init__(self, max_tokens: int) -> None:
        import llama_cpp
        import torch

        from models.blocks import LocalTarget
        from models.registry import resolve

        torch.set_num_threads(1)
        self.info = resolve(None)
        tok = llama_cpp.Llama(model_path=str(self.info.path), vocab_only=True, verbose=False)
        add_bos = tok.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
        self.ids = list(tok.tokenize(PROMPT.encode(), add_bos=add_bos, special=True))
        self.eos = int(tok.token_eos())
        self.target = LocalTarget.from_gguf(self.info.path)
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.wall = float("inf")

    def run(self) -> None:
        from models.blocks import greedy

        self.target.rollback(0)
        t0 = time.perf_counter()
        self.tokens = greedy(self.target, self.ids, self.max_tokens, [self.eos])
        self.wall = min(self.wall, time.perf_counter() - t0)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall

    def figures(self) -> dict[str, Any]:
        stage = self.target.stage
        return {"model": self.info.name, "tokens": len(self.tokens),
                "tokens_per_s_single": round(self.tokens_per_s, 3),
                "whole_param_mb": round(stage.param_bytes / MIB, 1),
                "stage_param_mb_max": round(max(
                    sum(p.nbytes for layer in stage.layers[a:b] for p in layer.parameters())
                    for a, b in split(stage.end, 4)) / MIB, 1)}


def _n_blocks() -> int:
    from models.gguf_reader import block_count
    from models.registry import resolve

    return block_count(resolve(None).path)


def _slow(way: str, shaped: bool) -> str:
    """The requester whose chains the ``_20ms`` figures (``way``: "" or "_direct") time: the
    one that emulates the delay, or behind a link (``shaped``) the loopback one."""
    return f"r4{'' if shaped else '-20ms'}{'-direct' if way else ''}"


def _layout(n_blocks: int, quick: bool, shaped: bool) -> tuple[dict[str, tuple[int, int]],
                                                               dict[str, RequesterSpec]]:
    two, four = split(n_blocks, 2), split(n_blocks, 4)
    servers = {"x0": two[0], "x1": two[1], "q0": four[0], "q1": four[1], "q1-spare": four[1],
               "q2": four[2], "q3": four[3]}
    pair, quad = ("x0", "x1"), ("q0", "q1", "q1-spare", "q2", "q3")
    requesters = {"r2": RequesterSpec(pair), "r4": RequesterSpec(quad)}
    if not quick:
        requesters.update({"r2-direct": RequesterSpec(pair, forwarding=False),
                           "r4-direct": RequesterSpec(quad, forwarding=False)})
    if not shaped:  # behind a link, the link delays every hop: no requester emulates it
        requesters[_slow("", shaped)] = RequesterSpec(quad, LINK_DELAY_MS)
        if not quick:
            requesters[_slow("_direct", shaped)] = RequesterSpec(quad, LINK_DELAY_MS,
                                                                 forwarding=False)
    return servers, requesters


def _tps(answer: dict[str, Any]) -> float:
    return len(answer["tokens"]) / answer["wall_s"]


def _best(answers: list[dict[str, Any]], reference: list[int], key: str,
          outputs: dict[str, bool]) -> dict[str, Any]:
    """The fastest of repeated generations; every one's tokens checked under ``key``."""
    outputs[key] = all(a["tokens"] == reference for a in answers)
    return max(answers, key=_tps)


def _loopback(net: ChainTestnet, ref: Reference, names: list[str], max_tokens: int,
              outputs: dict[str, bool], repeats: int) -> dict[str, Any]:
    """Single-process and chain runs interleaved: the chains' overhead ratios."""
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in names}
    for _ in range(repeats):
        ref.run()
        for r in names:
            runs[r].append(net.generate(r, PROMPT, max_tokens))
    figures: dict[str, Any] = {}
    for r in names:
        stages, way = r[1], "_direct" if r.endswith("direct") else ""
        tps = _tps(_best(runs[r], ref.tokens, f"chain{stages}{way}", outputs))
        figures[f"tokens_per_s_chain{stages}{way}"] = round(tps, 3)
        figures[f"overhead_ratio_{stages}{way}"] = round(ref.tokens_per_s / tps, 3)
    return figures


def _latency_runs(net: ChainTestnet, reference: list[int], max_tokens: int,
                  outputs: dict[str, bool], repeats: int, quick: bool,
                  shaped: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    plans = [("", ("", "_spec", "_mars"))]
    if not quick:
        plans.append(("_direct", ("", "_spec")))
    for way, kinds in plans:
        requester = _slow(way, shaped)
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for _ in range(repeats):  # interleaved, so a busy spell of the machine hits all
            for kind in kinds:
                extra: dict[str, Any] = {"speculative": SPEC_K} if kind else {}
                if kind == "_mars":
                    extra["rule"] = "mars"
                runs[kind].append(net.generate(requester, PROMPT, max_tokens, **extra))
        best = {k: (max(v, key=_tps) if k == "_mars" else
                    _best(v, reference, f"chain4_20ms{way}{k}", outputs))
                for k, v in runs.items()}
        for kind, answer in best.items():
            figures[f"tokens_per_s_chain4_20ms{way}{kind}"] = round(_tps(answer), 3)
        base = figures[f"tokens_per_s_chain4_20ms{way}"]
        figures[f"dsd_speedup_20ms{way}"] = round(
            figures[f"tokens_per_s_chain4_20ms{way}_spec"] / base, 3)
        if "_mars" in best:
            figures["mars_speedup_20ms"] = round(figures["tokens_per_s_chain4_20ms_mars"]
                                                 / base, 3)
            figures["acceptance_rate_mars"] = best["_mars"].get("acceptance_rate")
            figures["mean_k_mars"] = best["_mars"].get("mean_k")
            figures.update(_drafting(best["_mars"], "_mars"))
            figures["mars_tokens_equal_greedy"] = all(a["tokens"] == reference
                                                      for a in runs["_mars"])
        if not way:
            figures["acceptance_rate"] = best["_spec"].get("acceptance_rate")
            figures["mean_k"] = best["_spec"].get("mean_k")
            figures.update(_drafting(best["_spec"], ""))
    return figures


def _drafting(answer: dict[str, Any], suffix: str) -> dict[str, Any]:
    """How a speculative run drafted: drafts kept given the ones before them were, the
    drafter's time per token beside the stages, the drafting the steps waited for, and the
    steps the lookahead (drafting during verification) began."""
    return {f"{key}{suffix}": answer.get(key) for key in (
        "position_acceptance", "draft_ms_per_token", "draft_s", "lookahead_hits")}


def _recovery(net: ChainTestnet, reference: list[int], max_tokens: int,
              outputs: dict[str, bool], calm_wall_s: float) -> dict[str, Any]:
    """Kill the 4-stage chain's server of blocks 8-15 mid-generation (see the docstring)."""
    spares = [net.servers[s][0] for s in ("q1", "q1-spare")]
    result: dict[str, Any] = {}

    def generate() -> None:
        try:
            result["answer"] = net.generate("r4", PROMPT, max_tokens)
        except Exception as exc:  # reported below as a failed recovery
            result["error"] = repr(exc)

    before = {n.name: net.inference_status(n)["forwards"] for n in spares}
    worker = threading.Thread(target=generate)
    worker.start()
    in_use = _serving_session(net, spares)
    wait_for_session(net, in_use, forwards=before[in_use.name] + max(2, max_tokens // 3))
    in_use.kill()
    killed_at = time.perf_counter()
    # recovered: the spare has taken the replayed history and served the step again
    spare = next(n for n in spares if n is not in_use)
    wait_for_session(net, spare, forwards=before[spare.name] + 2)
    figures: dict[str, Any] = {"recovery_s": elapsed(killed_at)}
    worker.join()
    if "answer" not in result:
        raise RuntimeError(f"the generation did not survive a killed stage: {result['error']}")
    answer = result["answer"]
    outputs["chain4_recovered"] = answer["tokens"] == reference
    figures["recovery_extra_wall_s"] = round(answer["wall_s"] - calm_wall_s, 3)
    figures["recoveries"] = answer.get("recoveries", 0)
    return figures


def _serving_session(net: ChainTestnet, candidates: list[Any]) -> Any:
    from node.testnet import wait_until

    def find() -> Any:
        for node in candidates:
            if net.inference_status(node)["sessions"] >= 1:
                return node
        return None

    found: Any = wait_until(find, "a session on the spare range", timeout_s=300)
    return found


def run(quick: bool, link: str = "") -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    max_tokens = QUICK_TOKENS if quick else FULL_TOKENS
    repeats = 1 if quick else REPEATS
    servers, requesters = _layout(_n_blocks(), quick, shaped=bool(link))
    outputs: dict[str, bool] = {}
    with chain_testnet(servers, requesters, link=link) as net:
        ref = Reference(max_tokens)  # loads while the daemons start
        net.wait()
        ref.run()  # warm-up, and the reference tokens
        for r in requesters:  # warm-up: each requester loads its head and tokenizer
            net.generate(r, PROMPT, 2)
        names = [r for r in ("r2", "r4", "r2-direct", "r4-direct") if r in requesters]
        figures = ref.figures()
        figures.update(_loopback(net, ref, names, max_tokens, outputs, LOOPBACK_REPEATS))
        figures["tokens_per_s_single"] = round(ref.tokens_per_s, 3)
        figures.update(_latency_runs(net, ref.tokens, max_tokens, outputs, repeats, quick,
                                     shaped=bool(link)))
        figures["stage_rss_mb_max"] = round(max(peak_rss_mb(n) for n, _ in
                                                net.servers.values()), 1)
        calm = len(ref.tokens) / figures["tokens_per_s_chain4"]
        figures.update(_recovery(net, ref.tokens, max_tokens, outputs, calm))
    figures["identical"] = all(outputs.values())
    figures["not_identical"] = ",".join(k for k, same in outputs.items() if not same) or "-"
    figures["link"] = link
    figures["link_delay_ms"] = 0.0 if link else LINK_DELAY_MS
    figures["speculative_k_max"] = SPEC_K
    figures["wall_s"] = elapsed(started)
    figures["load_1m_start"] = round(load_start, 2)
    figures["load_1m_end"] = round(os.getloadavg()[0], 2)
    return figures
