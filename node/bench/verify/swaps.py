"""Precision swaps in `symphony bench verify`: an executor that declares the shipped Q4_1 model
but serves another precision of it.

* ``precision_swap_detection``: per coarser quantization (:data:`SWAPS`, made from the shipped
  GGUF by models.requantize), the fraction of checks that fail when the cheater answers each
  question with the coarser model on llama.cpp (its own tokens, CoT and answer, the states
  its generation captured) and commits to that under the declared model's hash. Each result
  is checked as a verifier does (node.bench.verify.verdict.check_result), on several draws of
  chunks and layers.
* ``bf16_separation``: the update errors (models.layer_states.update_error) of every layer at
  every output position, recomputed by the fp32 verifier, for honest executors (llama.cpp with
  state capture at 1 and 2 threads, and the fp32 prefill commitment of a non-capturing backend
  at torch's 1 and 2 threads) against two executors whose weights are the declared ones
  rounded to bfloat16 (the fp32 prefill on rounded weights, and llama.cpp on a BF16 GGUF).
  Quantiles of the per-position errors and of the per-layer means, per executor; the bf16
  executors separate from the honest ones when their smallest layer mean exceeds the largest
  honest one (the check's mean rule could then sit between). ``tolerances`` puts the honest
  and coarser extremes beside models.layer_states.MAX_LAYER_ERR and MEAN_LAYER_ERR.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.commitments import commitments_for
from node.bench.verify.verdict import check_result
from protocol.market.messages import TaskSpec
from protocol.verification.rules import choose_chunks, choose_layers
from protocol.verification.verifier import LAYERS_PER_CHECK

#: the coarser quantizations a cheater serves in place of the declared Q4_1 (models.requantize)
SWAPS = ("Q4_0", "Q3_K", "Q2_K")
CHUNKS_PER_CHECK = 2


@dataclass(frozen=True, slots=True)
class Solved:
    """One question answered by one executor: its task, tokens, CoT, answer, states."""

    task: TaskSpec
    prompt_ids: list[int]
    output_ids: list[int]
    cot: str
    answer: str


def capturing(info: Any, path: Path, threads: int) -> Any:
    """The model ``info`` names, its weights from ``path``, on llama.cpp at ``threads``
    threads with state capture on."""
    import dataclasses

    from models.config import ModelConfig
    from models.llama_backend import LlamaCppBackend

    backend = LlamaCppBackend(dataclasses.replace(info, path=path), ModelConfig(n_threads=threads))
    backend.enable_state_capture()
    return backend


def solve_with(backend: Any, task: TaskSpec, problem: Any, max_tokens: int,
               seed: int = 0, temperature: float = 0.0) -> Solved:
    from models.cot import solve

    sol = solve(backend, problem, max_tokens=max_tokens, seed=seed, temperature=temperature)
    return Solved(task, list(sol.prompt_token_ids), list(sol.token_ids), sol.cot_text,
                  sol.answer)


def detection(runner: Any, store: Any, cheats: dict[str, Any],
              questions: list[tuple[TaskSpec, Any]], samples: int, rng: random.Random,
              max_tokens: int) -> dict[str, float]:
    """``precision_swap_detection``: per cheater backend, the fraction of checks failed."""
    out = {}
    for name, cheat in cheats.items():
        caught = tried = 0
        for task, problem in questions:
            solved = solve_with(cheat, task, problem, max_tokens)
            made = commitments_for(cheat, solved.prompt_ids, solved.output_ids, store,
                                   task.task_id)
            for _ in range(samples):
                seed = rng.randbytes(32)
                chunks = choose_chunks(seed, "e", len(made.fingerprints), CHUNKS_PER_CHECK)
                layers = choose_layers(seed, "e", made.state_layers, LAYERS_PER_CHECK)
                tried += 1
                caught += not check_result(runner, store, chunks, layers, None, task, made,
                                           solved.output_ids, solved.cot, solved.answer)
        out[name] = round(caught / max(1, tried), 4)
    return out


def layer_errors(verifier: Any, ids: list[int], states: np.ndarray, first: int,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(per-position errors (L, n), per-layer means (L,)) of committed ``states`` (L, T, C)
    over ``ids``, at output positions ``first``..T-1, each layer recomputed by the fp32
    ``verifier`` on the committed input (layer 1: the embeddings)."""
    from models.layer_states import embeddings, recompute_layer, update_error

    rows = list(range(first, len(ids)))
    inputs = embeddings(verifier, ids)
    errs = []
    for layer in range(1, states.shape[0] + 1):
        got = recompute_layer(verifier, layer, inputs, rows)
        errs.append(update_error(got, states[layer - 1, rows], inputs[rows]))
        inputs = states[layer - 1]
    per_position = np.stack(errs)  # (L, n)
    return per_position, per_position.mean(axis=1)


def bf16_rounded(verifier: Any) -> Any:
    """A torch model holder like ``verifier`` whose weights are rounded to bfloat16 (kept in
    fp32: the rounding is the swap, the arithmetic stays the verifier's)."""
    import copy
    from types import SimpleNamespace

    import torch

    model = copy.deepcopy(verifier.model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return SimpleNamespace(model=model)


class ErrorTally:
    """Per executor name: its per-position errors and per-layer means, pooled over runs."""

    def __init__(self) -> None:
        self.positions: dict[str, list[np.ndarray]] = {}
        self.means: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, errors: tuple[np.ndarray, np.ndarray]) -> None:
        self.positions.setdefault(name, []).append(errors[0].ravel())
        self.means.setdefault(name, []).append(errors[1])

    def summary(self, name: str) -> dict[str, float]:
        pos = np.concatenate(self.positions[name])
        means = np.concatenate(self.means[name])
        q = np.quantile
        return {"position_p50": _sig(q(pos, 0.5)), "position_p99": _sig(q(pos, 0.99)),
                "position_max": _sig(pos.max()), "layer_mean_min": _sig(means.min()),
                "layer_mean_p50": _sig(q(means, 0.5)), "layer_mean_max": _sig(means.max())}


def _sig(x: Any) -> float:
    return float(f"{float(x):.3g}")


def separation(tally: ErrorTally, honest: tuple[str, ...], swapped: tuple[str, ...],
               ) -> dict[str, Any]:
    """``bf16_separation``: each executor's quantiles and whether the swapped ones separate
    from the honest ones (all of them pooled: a verifier does not know an executor's
    backend), and from each honest one alone."""
    figures: dict[str, Any] = {name: tally.summary(name) for name in honest + swapped}
    honest_max = max(figures[h]["layer_mean_max"] for h in honest)
    swapped_min = min(figures[s]["layer_mean_min"] for s in swapped)
    figures["separated"] = bool(swapped_min > honest_max)
    figures["gap"] = _sig(swapped_min / honest_max)  # > 1: a mean rule could sit between
    figures["separated_from"] = {h: bool(swapped_min > figures[h]["layer_mean_max"])
                                 for h in honest}
    return figures


def tolerances(tally: ErrorTally, honest: tuple[str, ...], coarser: tuple[str, ...],
               ) -> dict[str, float]:
    """The calibration: honest extremes, the coarser models' smallest layer mean, the rules."""
    from models.layer_states import MAX_LAYER_ERR, MEAN_LAYER_ERR

    def cat(store: dict[str, list[np.ndarray]], names: tuple[str, ...]) -> np.ndarray:
        return np.concatenate([a for n in names for a in store[n]])

    return {"honest_position_max": _sig(cat(tally.positions, honest).max()),
            "honest_layer_mean_max": _sig(cat(tally.means, honest).max()),
            "coarser_layer_mean_min": _sig(cat(tally.means, coarser).min()),
            "max_layer_err": MAX_LAYER_ERR, "mean_layer_err": MEAN_LAYER_ERR}



def measure(runner: Any, store: Any, folder: Path, questions: list[tuple[TaskSpec, Any]],
            samples: int, rng: random.Random, max_tokens: int) -> dict[str, Any]:
    """Every figure of this module (see its docstring) on ``questions``."""
    import torch

    from models.fingerprint import fingerprint_backend
    from models.layer_states import layer_states
    from models.requantize import requantize

    serve = runner.backend
    info, verifier = serve.info, fingerprint_backend(serve)
    coarser = {k: capturing(info, requantize(info.path, folder, k), 1) for k in SWAPS}
    out: dict[str, Any] = {"precision_swap_detection": detection(
        runner, store, coarser, questions, samples, rng, max_tokens)}
    llama = {f"llama_cpp_t{t}": capturing(info, info.path, t) for t in (1, 2)}
    bf16_llama = capturing(info, requantize(info.path, folder, "BF16"), 1)
    rounded = bf16_rounded(verifier)
    tally = ErrorTally()
    threads = torch.get_num_threads()
    for task, problem in questions:
        honest_ids, prompt = [], 0
        for name, backend in (*llama.items(), ("bf16_llama_cpp", bf16_llama),
                              *coarser.items()):
            s = solve_with(backend, task, problem, max_tokens)
            ids = s.prompt_ids + s.output_ids
            honest_ids, prompt = (ids, len(s.prompt_ids)) if not honest_ids else (honest_ids,
                                                                                   prompt)
            states, _ = backend.captured_states(ids, copy=False)
            tally.add(name, layer_errors(verifier, ids, states, len(s.prompt_ids)))
        for t in (1, 2):  # the fp32 prefill commitment on the honest tokens, at t threads
            torch.set_num_threads(t)
            committed = layer_states(verifier, honest_ids)[0]
            torch.set_num_threads(threads)  # and the verifier at its own
            tally.add(f"torch_t{t}", layer_errors(verifier, honest_ids, committed, prompt))
        tally.add("bf16_torch", layer_errors(verifier, honest_ids,
                                             layer_states(rounded, honest_ids)[0], prompt))
    honest = (*llama, "torch_t1", "torch_t2")
    out["bf16_separation"] = separation(tally, honest, ("bf16_torch", "bf16_llama_cpp"))
    out["precision_tolerances"] = tolerances(tally, honest, tuple(coarser))
    return out
