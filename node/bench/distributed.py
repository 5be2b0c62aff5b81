"""`symphony bench distributed`: the default model split by blocks across real daemons, with
and without speculative decoding, in one run.

The model is SmolLM2-135M (30 blocks): the stages hold fp32 torch blocks dequantized from its
Q4_1 GGUF (models.blocks), one torch thread each; the requester daemon holds the embedding and
head and drafts with llama.cpp on the same Q4_1 file. Hidden states travel as fp16.

* ``tokens_per_s_single``: greedy decoding of the whole model in this process (LocalTarget,
  one torch thread), the reference output every greedy chain output is compared with.
* ``overhead_ratio_2`` / ``overhead_ratio_4``: time per token through a 2- and a 4-stage chain
  of daemons on loopback (no link delay) over the single-process time per token (goal <= 1.3).
* ``dsd_speedup_20ms``: a 4-stage chain with every daemon holding each outgoing session frame
  20 ms (``[inference] link_delay_ms``; the requester talks to each stage in turn, so a step
  crosses 2 links per stage): tokens/s with speculative decoding (drafts of at most ``SPEC_K``
  tokens, their length adapted step by step; greedy verification: the output must stay
  identical) over tokens/s without; ``mean_k`` is the mean draft length.
  ``mars_speedup_20ms`` is the same with MARS verification (not exact; theta 0.9).
  ``acceptance_rate``: drafts kept / drafted in the greedy speculative run.
* ``stage_param_mb_max`` / ``whole_param_mb``: the largest stage's parameters vs the whole
  model's blocks; ``stage_rss_mb_max``: the largest peak RSS among the 4-stage servers.
* ``recovery_s``: a 4-stage chain with a spare server for blocks [8, 15): the one in use is
  SIGKILLed a third of the way into a generation; the time from the kill until the spare has
  taken the replayed history and served the step again (polled every 0.1 s).
  ``recovery_extra_wall_s``: the whole generation's wall time over the same one without the
  kill; ``recoveries`` counts the replans.
* ``identical``: every greedy output through a chain (plain, speculative, recovered) equals
  the single-process one.

Every timed generation runs ``REPEATS`` times (once with ``--quick``; the 20 ms runs
interleaved) and the fastest counts. ``--quick`` generates 16 tokens instead of 64; it still
starts three testnets (14 daemons), several minutes on two shared cores.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from node.bench.distributed_net import (
    ChainNet,
    chain_net,
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
MIB = float(1 << 20)


def _reference(max_tokens: int, repeats: int) -> tuple[dict[str, Any], list[int], Any]:
    """Single-process greedy decoding: (figures, tokens, the loaded model info)."""
    import llama_cpp
    import torch

    from models.blocks import LocalTarget, greedy
    from models.registry import resolve

    torch.set_num_threads(1)
    info = resolve(None)
    tok = llama_cpp.Llama(model_path=str(info.path), vocab_only=True, verbose=False)
    add_bos = tok.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    ids = list(tok.tokenize(PROMPT.encode(), add_bos=add_bos, special=True))
    target = LocalTarget.from_gguf(info.path)
    greedy(target, ids[:4], 2)  # warm-up
    target.rollback(0)
    wall = float("inf")
    for _ in range(repeats):
        target.rollback(0)
        t0 = time.perf_counter()
        tokens = greedy(target, ids, max_tokens, [int(tok.token_eos())])
        wall = min(wall, time.perf_counter() - t0)
    stage = target.stage
    figures = {"model": info.name, "tokens": len(tokens),
               "tokens_per_s_single": round(len(tokens) / wall, 3),
               "whole_param_mb": round(stage.param_bytes / MIB, 1),
               "stage_param_mb_max": round(max(
                   sum(p.nbytes for layer in stage.layers[a:b] for p in layer.parameters())
                   for a, b in split(stage.end, 4)) / MIB, 1)}
    return figures, tokens, stage.end


def _tps(answer: dict[str, Any]) -> float:
    return len(answer["tokens"]) / answer["wall_s"]


def _best(answers: list[dict[str, Any]], reference: list[int], key: str,
          outputs: dict[str, bool]) -> dict[str, Any]:
    """The fastest of repeated generations; every one's tokens checked under ``key``."""
    outputs[key] = all(a["tokens"] == reference for a in answers)
    return max(answers, key=_tps)


def _chain_figures(chain: ChainNet, max_tokens: int, reference: list[int], key: str,
                   outputs: dict[str, bool], repeats: int) -> float:
    """Plain greedy through ``chain``: the best tokens/s of ``repeats`` runs."""
    runs = [chain.generate(PROMPT, max_tokens) for _ in range(repeats)]
    return round(_tps(_best(runs, reference, key, outputs)), 3)


def _latency_runs(n_blocks: int, max_tokens: int, reference: list[int],
                  outputs: dict[str, bool], repeats: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with chain_net(split(n_blocks, 4), link_delay_ms=LINK_DELAY_MS, name="chain4-20ms") as chain:
        chain.generate(PROMPT, 2)  # warm-up: the requester loads its head and tokenizer
        runs: dict[str, list[dict[str, Any]]] = {"": [], "_spec": [], "_mars": []}
        for _ in range(repeats):  # interleaved, so a busy spell of the machine hits all three
            runs[""].append(chain.generate(PROMPT, max_tokens))
            runs["_spec"].append(chain.generate(PROMPT, max_tokens, speculative=SPEC_K))
            runs["_mars"].append(chain.generate(PROMPT, max_tokens, speculative=SPEC_K,
                                                rule="mars"))
        plain = _best(runs[""], reference, "chain4_20ms", outputs)
        spec = _best(runs["_spec"], reference, "chain4_20ms_speculative", outputs)
        mars = max(runs["_mars"], key=_tps)
        for name, answer in (("", plain), ("_spec", spec), ("_mars", mars)):
            figures[f"tokens_per_s_chain4_20ms{name}"] = round(_tps(answer), 3)
        base = figures["tokens_per_s_chain4_20ms"]
        figures["dsd_speedup_20ms"] = round(figures["tokens_per_s_chain4_20ms_spec"] / base, 3)
        figures["mars_speedup_20ms"] = round(figures["tokens_per_s_chain4_20ms_mars"] / base, 3)
        figures["acceptance_rate"] = spec.get("acceptance_rate")
        figures["acceptance_rate_mars"] = mars.get("acceptance_rate")
        figures["mean_k"] = spec.get("mean_k")
        figures["mean_k_mars"] = mars.get("mean_k")
        figures["mars_tokens_equal_greedy"] = all(a["tokens"] == reference for a in runs["_mars"])
    return figures


def _recovery(n_blocks: int, max_tokens: int, reference: list[int],
              outputs: dict[str, bool], repeats: int) -> dict[str, Any]:
    ranges = split(n_blocks, 4)
    with chain_net([*ranges, ranges[1]], name="chain4-spare") as chain:
        chain.generate(PROMPT, 2)
        calm = _best([chain.generate(PROMPT, max_tokens) for _ in range(repeats)], reference,
                     "chain4", outputs)
        figures: dict[str, Any] = {
            "tokens_per_s_chain4": round(_tps(calm), 3),
            "stage_rss_mb_max": round(max(peak_rss_mb(n) for n, _ in chain.servers), 1)}
        spares = [n for n, r in chain.servers if r == ranges[1]]
        result: dict[str, Any] = {}

        def generate() -> None:
            try:
                result["answer"] = chain.generate(PROMPT, max_tokens)
            except Exception as exc:  # reported below as a failed recovery
                result["error"] = repr(exc)

        before = {n.name: chain.inference_status(n)["forwards"] for n in spares}
        worker = threading.Thread(target=generate)
        worker.start()
        in_use = _serving_session(chain, spares)
        wait_for_session(chain, in_use, forwards=before[in_use.name] + max(2, max_tokens // 3))
        in_use.kill()
        killed_at = time.perf_counter()
        # recovered: the spare has taken the replayed history and served the step again
        spare = next(n for n in spares if n is not in_use)
        wait_for_session(chain, spare, forwards=before[spare.name] + 2)
        figures["recovery_s"] = elapsed(killed_at)
        worker.join()
        if "answer" not in result:
            raise RuntimeError(f"the generation did not survive a killed stage: {result['error']}")
        answer = result["answer"]
        outputs["chain4_recovered"] = answer["tokens"] == reference
        figures["recovery_extra_wall_s"] = round(answer["wall_s"] - calm["wall_s"], 3)
        figures["recoveries"] = answer.get("recoveries", 0)
    return figures


def _serving_session(chain: ChainNet, candidates: list[Any]) -> Any:
    from node.testnet import wait_until

    def find() -> Any:
        for node in candidates:
            if chain.inference_status(node)["sessions"] >= 1:
                return node
        return None

    found: Any = wait_until(find, "a session on the spare range", timeout_s=300)
    return found


def run(quick: bool) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    max_tokens = QUICK_TOKENS if quick else FULL_TOKENS
    repeats = 1 if quick else REPEATS
    figures, reference, n_blocks = _reference(max_tokens, repeats)
    single_tps = figures["tokens_per_s_single"]
    outputs: dict[str, bool] = {}
    for stages in (2,):
        with chain_net(split(n_blocks, stages), name=f"chain{stages}") as chain:
            chain.generate(PROMPT, 2)
            tps = _chain_figures(chain, max_tokens, reference, f"chain{stages}", outputs,
                                 repeats)
        figures[f"tokens_per_s_chain{stages}"] = tps
    figures.update(_recovery(n_blocks, max_tokens, reference, outputs, repeats))
    figures["overhead_ratio_2"] = round(single_tps / figures["tokens_per_s_chain2"], 3)
    figures["overhead_ratio_4"] = round(single_tps / figures["tokens_per_s_chain4"], 3)
    figures.update(_latency_runs(n_blocks, max_tokens, reference, outputs, repeats))
    figures["identical"] = all(outputs.values())
    figures["not_identical"] = ",".join(k for k, same in outputs.items() if not same) or "-"
    figures["link_delay_ms"] = LINK_DELAY_MS
    figures["speculative_k_max"] = SPEC_K
    return figures
