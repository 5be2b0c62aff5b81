"""`symphony bench verify`: what commitment-based verification costs and what it catches.

On the default model (SmolLM2-135M Q4_1: served with llama.cpp, its commitments computed and
checked on transformers fp32 from the same GGUF), for questions of the shipped evaluation set:

* ``verify_cost_ratio``: one verifier's whole check of a committed result, as daemons run it
  (node/verification/service.py): prompt rebuild, CoT/answer binding, the leaves of the executor's
  layer states it needs (served from a real models.state_store.StateStore, each Merkle proof
  checked and decoded; the network hop itself is left out), layer 1 over every position and
  ``LAYERS_PER_CHECK`` layers drawn from the seed over ``CHUNKS_PER_CHECK`` sampled chunks
  (models.layer_states), over the executor's generation time for the same result, measured
  in the same run; ``verify_cost_ratio_cpu`` is the same on the CPU time of the thread doing
  the work (both run single-threaded at the default policy on two cores, so it is what other
  jobs on a shared machine change least). ``verify_cost_per_token_ratio`` is the same figure: a check covers the
  whole output at layer 1. ``state_bytes_fetched_per_check`` is what a check fetches.
  ``prefill_check_cost_ratio`` is the same chunks checked by one whole prefill
  (models.fingerprint, TOPLOC), the check for results committed without layer states.
  ``network_cost_ratio`` scales ``verify_cost_ratio`` by the default sampling rate and
  verifier count; ``commit_cost_ratio`` is the executor's own extra prefill (fingerprints
  and layer states, hashed and written to its store).
* ``fingerprint_bytes_per_32_tokens``: the size of one full chunk's blob (a shorter last
  chunk is scaled up to 32 tokens).
* ``detection_rate_<adversary>``: fraction of checks that fail, over every question and
  several chunk samples each, for: ``tamper`` (one output token changed, its CoT text kept
  consistent), ``fabricated_cot`` (honest tokens, a made-up CoT), ``wrong_answer`` (honest
  tokens and CoT, another answer claimed), ``lower_precision`` (commitments from the same
  weights rounded to bfloat16: a cheaper model than advertised). The tampered token may sit
  anywhere in the output, checked chunk or not. ``detection_rate`` is the
  lowest. Per result the network catches an adversary with probability
  ``sample_rate * detection_rate``; tests/protocol/test_verification.py checks that rate.
* ``false_positive_rate``: honest checks that fail; each honest check runs twice, timed at the
  verifier's thread count (``threads``, the serving policy: half the logical CPUs) and again
  at another.
* ``result_to_verdict_ms_p50``: wall time inside one process from the requester taking an
  executor's reveal to its decision (two verifiers, real checks, all protocol machines and
  signatures; network hops not included: ~6 ms each on loopback, see ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.checks import CheckRunner, LayerJob
from models.commitments import CHUNK_TOKENS, Commitments, commitments_for
from node.bench.verify_verdict import fetch_states, result_to_verdict_ms
from protocol.market.messages import Requirement, TaskSpec
from protocol.verification.rules import choose_chunks, choose_layers
from protocol.verification.state import DEFAULT_SAMPLE_RATE, DEFAULT_VERIFIERS
from protocol.verification.verifier import LAYERS_PER_CHECK, StartCheck

CHUNKS_PER_CHECK = 2
ADVERSARIES = ("tamper", "fabricated_cot", "wrong_answer", "lower_precision")


def _task(question: str, answer_type: str, choices: tuple[str, ...], i: int) -> TaskSpec:
    return TaskSpec(task_id=i.to_bytes(32, "big"), requester="bench", question=question,
                    answer_type=answer_type, choices=choices,
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=0.0, max_tokens=256)


def _bf16_copy(fb: Any) -> Any:
    """The fingerprinting backend with its weights rounded to bfloat16 (a cheaper model)."""
    import torch

    cheap = copy.copy(fb)
    cheap.model = copy.deepcopy(fb.model)
    with torch.no_grad():
        for p in cheap.model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return cheap


@dataclass
class _Bench:
    """What one run measures with: the serving model, its checker, the same weights rounded to
    bfloat16 (an adversary's cheaper model), the executor's state store, the thread counts."""

    serve: Any
    runner: CheckRunner
    cheap: Any
    store: Any
    threads: int
    other_threads: int


@dataclass
class _Tally:
    """Per-question and per-check measurements, summed up by :func:`_report`."""

    gen_ms: list[float] = field(default_factory=list)
    gen_cpu_ms: list[float] = field(default_factory=list)
    gen_tokens: list[int] = field(default_factory=list)
    fp_ms: list[float] = field(default_factory=list)
    check_ms: list[float] = field(default_factory=list)
    check_cpu_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    blob_sizes: list[int] = field(default_factory=list)
    leaf_bytes: list[int] = field(default_factory=list)
    honest_fail: int = 0
    honest_total: int = 0
    caught: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ADVERSARIES, 0))
    tried: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ADVERSARIES, 0))
    solved: list[tuple[TaskSpec, Any, Commitments]] = field(default_factory=list)


def run(quick: bool) -> dict[str, float | int | str]:
    import tempfile

    from models.evalset import load_evalset
    from models.state_store import StateStore

    n_questions, samples, max_tokens = (2, 2, 96) if quick else (6, 4, 256)
    with tempfile.TemporaryDirectory(prefix="symphony-bench-states-") as tmp:
        store = StateStore(Path(tmp))
        t0 = time.perf_counter()
        bench = _load(store)
        load_s = time.perf_counter() - t0
        rng = random.Random(6)
        items = load_evalset()[:n_questions]
        tally = _Tally()
        for i, item in enumerate(items):
            honest, cheap = _solve_and_commit(bench, tally, i, item.problem, max_tokens)
            for s in range(samples):
                _check_sample(bench, tally, rng, honest, cheap, with_prefill=s == 0)
        verdict_ms = result_to_verdict_ms(bench.runner, store, tally.solved, 3 if quick else 6)
    return _report(bench, tally, load_s, verdict_ms, questions=len(items), samples=samples)


def _load(store: Any) -> _Bench:
    import torch

    from models.config import ModelConfig
    from models.fingerprint import fingerprint_backend
    from models.loader import load_backend

    serve = load_backend(ModelConfig())
    runner = CheckRunner(serve)
    cheap = _bf16_copy(fingerprint_backend(serve))
    threads = torch.get_num_threads()  # what fingerprint_backend set: the serving policy
    return _Bench(serve, runner, cheap, store, threads, 2 if threads == 1 else 1)


def _solve_and_commit(bench: _Bench, tally: _Tally, i: int, problem: Any, max_tokens: int,
                      ) -> tuple[tuple[TaskSpec, Any, Commitments], tuple[TaskSpec, Commitments]]:
    """Generate an answer to ``problem`` and commit to it, honestly and with the cheap model:
    ((task, solution, commitments), (cheap task, cheap commitments))."""
    from models.cot import solve

    task = _task(problem.question, problem.answer_type.value, problem.choices, i)
    started, cpu = time.perf_counter(), time.thread_time()
    sol = solve(bench.serve, problem, max_tokens=max_tokens)
    tally.gen_ms.append((time.perf_counter() - started) * 1000)
    tally.gen_cpu_ms.append((time.thread_time() - cpu) * 1000)
    ids = list(sol.token_ids)
    tally.gen_tokens.append(len(ids))
    started = time.perf_counter()
    made = commitments_for(bench.serve, sol.prompt_token_ids, ids, bench.store, task.task_id)
    tally.fp_ms.append((time.perf_counter() - started) * 1000)
    # a blob is 4 header bytes + 4 bytes per position and top-k entry: scale to 32 tokens
    tally.blob_sizes += [4 + (len(b) - 4) * CHUNK_TOKENS
                         // max(1, int.from_bytes(b[2:4], "little")) for b in made.fingerprints]
    tally.solved.append((task, sol, made))
    cheap_task = dataclasses.replace(task, task_id=b"\xcc" + task.task_id[1:])
    cheap_made = commitments_for(bench.cheap, sol.prompt_token_ids, ids, bench.store,
                                 cheap_task.task_id)
    return (task, sol, made), (cheap_task, cheap_made)


def _check_sample(bench: _Bench, tally: _Tally, rng: random.Random,
                  honest: tuple[TaskSpec, Any, Commitments],
                  cheap: tuple[TaskSpec, Commitments], *, with_prefill: bool) -> None:
    """One draw of chunks and layers: the honest result checked at two thread counts (and by
    a whole prefill when ``with_prefill``), then each adversary's result."""
    import torch

    task, sol, made = honest
    ids = list(sol.token_ids)
    seed = rng.randbytes(32)
    chunks = choose_chunks(seed, "e", len(made.fingerprints), CHUNKS_PER_CHECK)
    layers = choose_layers(seed, "e", made.state_layers, LAYERS_PER_CHECK)
    check = functools.partial(_check, bench.runner, bench.store, chunks, layers,
                              tally.leaf_bytes)
    started, cpu = time.perf_counter(), time.thread_time()  # the verifier's threads
    ok = check(task, made, ids, sol.cot_text, sol.answer)
    tally.check_ms.append((time.perf_counter() - started) * 1000)
    tally.check_cpu_ms.append((time.thread_time() - cpu) * 1000)
    torch.set_num_threads(bench.other_threads)  # and honest again on another thread count
    ok = ok and check(task, made, ids, sol.cot_text, sol.answer)
    torch.set_num_threads(bench.threads)
    tally.honest_total += 1
    tally.honest_fail += not ok
    if with_prefill:  # the whole-prefill check of the same chunks, for comparison
        started = time.perf_counter()
        tally.honest_fail += not _prefill_check(bench.runner, task, chunks, ids, sol,
                                                made.fingerprints)
        tally.prefill_ms.append((time.perf_counter() - started) * 1000)
        tally.honest_total += 1
    for name, args in _adversaries(bench, rng, honest, cheap).items():
        tally.tried[name] += 1
        tally.caught[name] += not check(*args)


def _adversaries(bench: _Bench, rng: random.Random, honest: tuple[TaskSpec, Any, Commitments],
                 cheap: tuple[TaskSpec, Commitments]) -> dict[str, tuple[Any, ...]]:
    """Each adversary's claimed result, as ``_check``'s arguments after the sample's."""
    task, sol, made = honest
    ids = list(sol.token_ids)
    pos = rng.randrange(len(ids))  # anywhere in the output
    tampered = list(ids)
    tampered[pos] = (tampered[pos] + 1 + rng.randrange(100)) % 49152
    return {
        "tamper": (task, made, tampered, bench.serve.detokenize(tampered), sol.answer),
        "fabricated_cot": (task, made, ids, sol.cot_text + " I double-checked it.", sol.answer),
        "wrong_answer": (task, made, ids, sol.cot_text, sol.answer + "1"),
        "lower_precision": (*cheap, ids, sol.cot_text, sol.answer),
    }


def _report(bench: _Bench, tally: _Tally, load_s: float, verdict_ms: list[float], *,
            questions: int, samples: int) -> dict[str, float | int | str]:
    gen_ms = statistics.mean(tally.gen_ms)
    ratio = statistics.mean(tally.check_ms) / gen_ms
    per_token = ratio  # a check covers the whole output (layer 1) and a sampled part of it
    out: dict[str, float | int | str] = {
        "model": bench.serve.info.name,
        "questions": questions, "checks_per_question": samples, "threads": bench.threads,
        "load_s": round(load_s, 2),
        "generate_ms_mean": round(gen_ms, 1),
        "generated_tokens_mean": round(statistics.mean(tally.gen_tokens), 1),
        "check_ms_mean": round(statistics.mean(tally.check_ms), 1),
        "layers_per_check": 1 + LAYERS_PER_CHECK,
        "state_bytes_fetched_per_check": round(statistics.mean(tally.leaf_bytes)),
        "verify_cost_ratio": round(ratio, 4),
        "verify_cost_ratio_cpu": round(statistics.mean(tally.check_cpu_ms)
                                       / statistics.mean(tally.gen_cpu_ms), 4),
        "verify_cost_per_token_ratio": round(per_token, 4),
        "prefill_check_ms_mean": round(statistics.mean(tally.prefill_ms), 1),
        "prefill_check_cost_ratio": round(statistics.mean(tally.prefill_ms) / gen_ms, 4),
        "network_cost_ratio": round(ratio * DEFAULT_SAMPLE_RATE * DEFAULT_VERIFIERS, 4),
        "commit_cost_ratio": round(statistics.mean(tally.fp_ms) / gen_ms, 4),
        "fingerprint_bytes_per_32_tokens": max(tally.blob_sizes) if tally.blob_sizes else 0,
        "false_positive_rate": round(tally.honest_fail / max(1, tally.honest_total), 4),
        "result_to_verdict_ms_p50": round(statistics.median(verdict_ms), 1),
    }
    for name in ADVERSARIES:
        out[f"detection_rate_{name}"] = round(tally.caught[name] / max(1, tally.tried[name]), 4)
    out["detection_rate"] = min(float(out[f"detection_rate_{a}"]) for a in ADVERSARIES)
    return out


def _start(runner: CheckRunner, task: TaskSpec, made: Commitments, chunks: tuple[int, ...],
           layers: tuple[int, ...], output: list[int], cot: str, answer: str) -> StartCheck:
    return StartCheck(
        check_id=bytes(32), task=task, model_hash=runner.model_hash, output_ids=tuple(output),
        answer=answer, cot=cot, chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
        fingerprints=tuple(made.fingerprints[c] for c in chunks), deadline_at_ms=0,
        executor="e", states_root=made.states_root, state_layers=made.state_layers,
        layers=layers)


def _check(runner: CheckRunner, store: Any, chunks: tuple[int, ...], layers: tuple[int, ...],
           sizes: list[int], task: TaskSpec, made: Commitments, output: list[int], cot: str,
           answer: str) -> bool:
    """One verifier's whole check of committed layer states: binding, fetch, re-run."""
    e = _start(runner, task, made, chunks, layers, output, cot, answer)
    job = runner.prepare(e)
    if not isinstance(job, LayerJob):
        return job.passed
    return runner.run_layers(e, job, fetch_states(store, e, job, sizes)).passed


def _prefill_check(runner: CheckRunner, task: TaskSpec, chunks: tuple[int, ...],
                   output: list[int], sol: Any, prints: tuple[bytes, ...]) -> bool:
    return runner.run(StartCheck(
        check_id=bytes(32), task=task, model_hash=runner.model_hash, output_ids=tuple(output),
        answer=sol.answer, cot=sol.cot_text, chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
        fingerprints=tuple(prints[c] for c in chunks), deadline_at_ms=0)).passed
