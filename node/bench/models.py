"""`symphony bench models`: the default model's load time, speed, fingerprint cost, accuracy.

``verify_cost_ratio`` = time to check one chunk the way verifiers do by default (re-running
layer 1 over every position and two sampled layers up to the chunk on the committed layer
states, models.layer_states) / time to generate the whole output it belongs to (llama.cpp,
the serving path); ``prefill_check_cost_ratio`` is the same for the whole-prefill check of
the chunk's fingerprint (models.fingerprint, TOPLOC), and ``fingerprint_cost_ratio`` the
executor's one prefill that produces both fingerprints and layer states. All run with the
same thread count; means over every chunk position and, for layers, several layer draws. Accuracy runs greedy on the shipped evaluation set
(quick mode: the first QUICK_EVAL_ITEMS items) with and without chain of thought.
"""

from __future__ import annotations

import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUICK_EVAL_ITEMS = 10
#: Tokens generated for the cost figures (a typical short chain of thought).
COST_TOKENS = 128
COT_BUDGET = 160


def run(quick: bool) -> dict[str, Any]:
    from models.backend import measure_throughput
    from models.config import TRANSFORMERS, ModelConfig, default_threads
    from models.loader import load_backend

    threads = default_threads()
    figures: dict[str, Any] = {"threads": threads}
    t = time.perf_counter()
    llama = load_backend(ModelConfig(n_threads=threads))
    figures["load_s_llama_cpp"] = time.perf_counter() - t
    t = time.perf_counter()
    hf = load_backend(ModelConfig(n_threads=threads, backend=TRANSFORMERS))
    figures["load_s_transformers"] = time.perf_counter() - t
    figures["model"] = llama.info.name
    figures["tokens_per_s_llama_cpp"] = measure_throughput(llama, n_tokens=32)
    figures["tokens_per_s_transformers"] = measure_throughput(hf, n_tokens=8 if quick else 32)
    figures.update(_verification_costs(llama, hf))
    figures.update(_accuracy(llama, quick))
    llama.close()
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}


def _verification_costs(llama: Any, hf: Any) -> dict[str, Any]:
    """Generate COST_TOKENS with llama.cpp, then time on transformers the executor's
    fingerprint prefill, the whole-prefill check of each chunk and the layer-state check."""
    from models import fingerprint as fp
    from models.backend import SamplingParams
    from models.cot import Problem, build_messages
    from protocol.answers import AnswerType

    problem = Problem("A shop sells 7 boxes with 6 pencils each. How many pencils?", AnswerType.NUMBER)
    gen = llama.generate(build_messages(problem), SamplingParams(max_tokens=COST_TOKENS, ignore_eos=True))
    generate_s = (gen.prompt_ms + gen.generate_ms) / 1000.0
    figures: dict[str, Any] = {}
    t = time.perf_counter()
    blobs = fp.fingerprint(hf, gen.prompt_token_ids, gen.token_ids)
    figures["fingerprint_s"] = time.perf_counter() - t
    figures["fingerprint_bytes_per_32_tokens"] = len(blobs[0])
    checks = []
    for c in range(len(blobs)):  # each chunk once: the mean over where a sampled chunk can fall
        t = time.perf_counter()
        result = fp.check_fingerprint(hf, gen.prompt_token_ids, gen.token_ids, blobs, chunks=[c])
        checks.append(time.perf_counter() - t)
        if not result.ok:
            raise RuntimeError(f"honest fingerprint check failed: {result}")
    figures["layer_states_s"], layer_checks = layer_check_times(hf, gen, len(blobs))
    figures["generate_s"] = generate_s
    figures["generated_tokens"] = len(gen.token_ids)
    figures["check_chunk_s"] = sum(layer_checks) / len(layer_checks)
    figures["check_chunk_s_worst"] = max(layer_checks)
    figures["verify_cost_ratio"] = figures["check_chunk_s"] / generate_s
    figures["check_chunk_prefill_s"] = sum(checks) / len(checks)
    figures["prefill_check_cost_ratio"] = figures["check_chunk_prefill_s"] / generate_s
    figures["fingerprint_cost_ratio"] = figures["fingerprint_s"] / generate_s
    return figures


def layer_check_times(hf: Any, gen: Any, n_chunks: int) -> tuple[float, list[float]]:
    """The executor's layer-state pass, then the check of each chunk for three layer draws:
    (layer states time, one time per check)."""
    from models import fingerprint as fp
    from models import layer_states as ls

    ids = list(gen.prompt_token_ids) + list(gen.token_ids)
    t = time.perf_counter()
    states, _ = ls.layer_states(hf, ids)
    layer_states_s = time.perf_counter() - t
    L = states.shape[0]
    fetched = ls.blocks_of(states)
    times = []
    for c in range(n_chunks):
        for draw in range(3):
            layers = (2 + (c * 7 + draw * 11) % (L - 1), 2 + (c * 13 + draw * 5 + 3) % (L - 1))
            plan = ls.plan_check(len(gen.prompt_token_ids), len(gen.token_ids), [c],
                                 fp.DEFAULT_CHUNK, layers)
            t = time.perf_counter()
            verdicts = ls.check_layers(hf, ids, plan, fetched)
            times.append(time.perf_counter() - t)
            if not all(v.ok for v in verdicts):
                raise RuntimeError(f"honest layer check failed: {verdicts}")
    return layer_states_s, times


def _accuracy(llama: Any, quick: bool) -> dict[str, Any]:
    """Greedy accuracy on the shipped evaluation set, with and without chain of thought."""
    from models.evalset import evaluate, load_evalset

    items = load_evalset()
    if quick:
        items = items[:QUICK_EVAL_ITEMS]
    figures: dict[str, Any] = {"eval_items": len(items)}
    for cot, key in ((True, "accuracy_cot"), (False, "accuracy_direct")):
        t = time.perf_counter()
        report = evaluate(llama, items, cot=cot, max_tokens=COT_BUDGET if cot else None)
        figures[key] = report.accuracy
        figures[f"{key}_unparsed"] = report.unparsed
        figures[f"{key}_s"] = time.perf_counter() - t
    return figures
