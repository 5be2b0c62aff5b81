"""`symphony bench verify`: what commitment-based verification costs and what it catches.

On the default model (SmolLM2-135M Q4_1: served with llama.cpp, fingerprinted and checked on
transformers fp32 from the same GGUF), for questions of the shipped evaluation set:

* ``verify_cost_ratio``: one verifier's check of ``CHUNKS_PER_CHECK`` sampled chunks (prompt
  rebuild, CoT/answer binding, one prefill up to the last sampled chunk, tolerant compare)
  over the executor's generation time for the same result, measured in the same run;
  ``verify_cost_per_token_ratio`` is the same per token (checked tokens vs generated tokens);
  ``network_cost_ratio`` scales it by the default sampling rate and verifier count;
  ``fingerprint_cost_ratio`` is the executor's own extra prefill to fingerprint its output.
* ``fingerprint_bytes_per_32_tokens``: the size of one full chunk's blob (a shorter last
  chunk is scaled up to 32 tokens).
* ``detection_rate_<adversary>``: fraction of checks that fail, over every question and
  several chunk samples each, for: ``tamper`` (one output token changed, its CoT text kept
  consistent), ``fabricated_cot`` (honest tokens, a made-up CoT), ``wrong_answer`` (honest
  tokens and CoT, another answer claimed), ``lower_precision`` (fingerprints from the same
  weights rounded to bfloat16: a cheaper model than advertised). ``detection_rate`` is the
  lowest. Per result the network catches an adversary with probability
  ``sample_rate * detection_rate``; tests/protocol/test_verification.py checks that rate.
* ``false_positive_rate``: honest checks that fail, across verifier thread counts.
* ``result_to_verdict_ms_p50``: wall time inside one process from the requester taking an
  executor's reveal to its decision (two verifiers, real checks, all protocol machines and
  signatures; network hops not included: ~6 ms each on loopback, see ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
import functools
import random
import statistics
import time
from collections import deque
from typing import Any

from node.verify_checks import CHUNK_TOKENS, CheckRunner, fingerprints_for
from protocol.tasks import Requirement, TaskSpec
from protocol.verification_rules import choose_chunks
from protocol.verification_state import DEFAULT_SAMPLE_RATE, DEFAULT_VERIFIERS
from protocol.verifier import StartCheck

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


def run(quick: bool) -> dict[str, float | int | str]:
    import torch

    from models.backend import load_backend
    from models.config import ModelConfig
    from models.cot import solve
    from models.evalset import load_evalset
    from models.fingerprint import fingerprint, fingerprint_backend

    n_questions, samples, max_tokens = (2, 2, 96) if quick else (6, 4, 256)
    t0 = time.perf_counter()
    serve = load_backend(ModelConfig())
    runner = CheckRunner(serve)
    fb = fingerprint_backend(serve)
    cheap = _bf16_copy(fb)
    load_s = time.perf_counter() - t0
    rng = random.Random(6)
    items = load_evalset()[:n_questions]
    gen_ms, gen_tokens, fp_ms, check_ms, checked_tokens, blob_sizes = [], [], [], [], [], []
    honest_fail = honest_total = 0
    caught = {a: 0 for a in ADVERSARIES}
    tried = {a: 0 for a in ADVERSARIES}
    solved: list[tuple[TaskSpec, Any, tuple[bytes, ...]]] = []
    for i, item in enumerate(items):
        problem = item.problem
        task = _task(problem.question, problem.answer_type.value, problem.choices, i)
        started = time.perf_counter()
        sol = solve(serve, problem, max_tokens=max_tokens)
        gen_ms.append((time.perf_counter() - started) * 1000)
        ids = list(sol.token_ids)
        gen_tokens.append(len(ids))
        started = time.perf_counter()
        prints = fingerprints_for(serve, sol.prompt_token_ids, ids)
        fp_ms.append((time.perf_counter() - started) * 1000)
        # a blob is 4 header bytes + 4 bytes per position and top-k entry: scale to 32 tokens
        blob_sizes += [4 + (len(b) - 4) * CHUNK_TOKENS // max(1, int.from_bytes(b[2:4], "little"))
                       for b in prints]
        solved.append((task, sol, prints))
        cheap_prints = tuple(fingerprint(cheap, sol.prompt_token_ids, ids, chunk=CHUNK_TOKENS))
        for s in range(samples):
            chunks = choose_chunks(rng.randbytes(32), "e", len(prints), CHUNKS_PER_CHECK)
            check = functools.partial(_check, runner, task, chunks)
            torch.set_num_threads(1 + s % 2)  # honest reruns on other thread counts
            started = time.perf_counter()
            ok = check(ids, sol.cot_text, sol.answer, prints)
            check_ms.append((time.perf_counter() - started) * 1000)
            assert runner.last is not None
            checked_tokens.append(runner.last.tokens)
            honest_total += 1
            honest_fail += not ok
            pos = rng.randrange(chunks[0] * CHUNK_TOKENS, min(len(ids), (chunks[0] + 1)
                                                              * CHUNK_TOKENS))
            tampered = list(ids)
            tampered[pos] = (tampered[pos] + 1 + rng.randrange(100)) % 49152
            cases = {
                "tamper": (tampered, serve.detokenize(tampered), sol.answer, prints),
                "fabricated_cot": (ids, sol.cot_text + " I double-checked it.", sol.answer,
                                   prints),
                "wrong_answer": (ids, sol.cot_text, sol.answer + "1", prints),
                "lower_precision": (ids, sol.cot_text, sol.answer, cheap_prints),
            }
            for name, args in cases.items():
                tried[name] += 1
                caught[name] += not check(*args)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    verdict_ms = _result_to_verdict_ms(runner, solved, 3 if quick else 6)
    ratio = statistics.mean(check_ms) / statistics.mean(gen_ms)
    per_token = (statistics.mean(check_ms) / statistics.mean(checked_tokens)) / \
        (statistics.mean(gen_ms) / max(1.0, statistics.mean(gen_tokens)))
    out: dict[str, float | int | str] = {
        "model": serve.info.name,
        "questions": len(items), "checks_per_question": samples,
        "load_s": round(load_s, 2),
        "generate_ms_mean": round(statistics.mean(gen_ms), 1),
        "generated_tokens_mean": round(statistics.mean(gen_tokens), 1),
        "check_ms_mean": round(statistics.mean(check_ms), 1),
        "checked_tokens_mean": round(statistics.mean(checked_tokens), 1),
        "verify_cost_ratio": round(ratio, 4),
        "verify_cost_per_token_ratio": round(per_token, 4),
        "network_cost_ratio": round(ratio * DEFAULT_SAMPLE_RATE * DEFAULT_VERIFIERS, 4),
        "fingerprint_cost_ratio": round(statistics.mean(fp_ms) / statistics.mean(gen_ms), 4),
        "fingerprint_bytes_per_32_tokens": max(blob_sizes) if blob_sizes else 0,
        "false_positive_rate": round(honest_fail / max(1, honest_total), 4),
        "result_to_verdict_ms_p50": round(statistics.median(verdict_ms), 1),
    }
    for name in ADVERSARIES:
        out[f"detection_rate_{name}"] = round(caught[name] / max(1, tried[name]), 4)
    out["detection_rate"] = min(float(out[f"detection_rate_{a}"]) for a in ADVERSARIES)
    return out


def _check(runner: CheckRunner, task: TaskSpec, chunks: tuple[int, ...], output: list[int],
           cot: str, answer: str, fps: tuple[bytes, ...]) -> bool:
    done = runner.run(StartCheck(
        check_id=bytes(32), task=task, model_hash=runner.model_hash, output_ids=tuple(output),
        answer=answer, cot=cot, chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
        fingerprints=tuple(fps[c] for c in chunks), deadline_at_ms=0))
    return done.passed


# ---------------------------------------------------------------- result to verdict, in-process


def _result_to_verdict_ms(runner: CheckRunner, solved: list[tuple[TaskSpec, Any,
                                                                   tuple[bytes, ...]]],
                          rounds: int) -> list[float]:
    """Run requester, executor and two verifiers' machines with the real checks, in-process."""
    from crypto.keys import Identity
    from protocol.auction import AuctionConfig, SubmitTask
    from protocol.executor import ExecutorConfig, ServedModel
    from protocol.selection import ScoreSelector
    from protocol.verification import VerifiedAuction, VerifyConfig
    from protocol.verification_executor import VerifiedExecutor
    from protocol.verifier import Verifier, VerifierConfig

    ids = {name: Identity.from_seed(bytes([n]) * 32) for n, name in enumerate(
        ("requester", "executor", "v1", "v2"), start=1)}
    model = ServedModel("smollm2", "smollm2", 8192, runner.model_hash, 50.0, 0.0)
    verifiers = [ids["v1"].peer_id, ids["v2"].peer_id]
    auction = VerifiedAuction(ids["requester"], ScoreSelector(), random.Random(1),
                              AuctionConfig(bid_window_ms=10, spare_bids=0),
                              verify=VerifyConfig(sample_rate=1.0, verifiers=2),
                              verifier_candidates=lambda h, now: verifiers)
    machines: dict[str, Any] = {
        ids["requester"].peer_id: auction,
        ids["executor"].peer_id: VerifiedExecutor(ids["executor"], ExecutorConfig(
            models=(model,), max_tokens=4096), random.Random(2)),
        **{p: Verifier(ids[n], VerifierConfig(frozenset({runner.model_hash})))
           for p, n in zip(verifiers, ("v1", "v2"), strict=True)},
    }
    loop = _Loop(machines, runner, ids["executor"].peer_id)
    for r in range(rounds):
        task, sol, prints = solved[r % len(solved)]
        loop.now = r * 1_000_000
        loop.solution = (sol, prints)
        loop.perform(ids["requester"].peer_id, auction.handle(SubmitTask(
            question=task.question, answer_type=task.answer_type, choices=task.choices,
            deadline_ms=600_000, k=1, max_tokens=256, task_id=bytes([r + 1]) * 32), loop.now))
        loop.run_until_decided()
    return loop.times or [float("nan")]


class _Loop:
    """A FIFO of (machine, event) with virtual time; checks and solutions are real."""

    def __init__(self, machines: dict[str, Any], runner: CheckRunner, executor: str) -> None:
        self.machines, self.runner, self.executor = machines, runner, executor
        self.queue: deque[tuple[str, object]] = deque()
        self.now = 0
        self.solution: tuple[Any, tuple[bytes, ...]] | None = None
        self.revealed_at = 0.0
        self.times: list[float] = []

    def perform(self, src: str, effects: list[object]) -> None:
        from protocol.executor import StartCompute
        from protocol.machine import Emit, Publish, Received, Send
        from protocol.task_events import ComputeDone
        from protocol.verification_messages import Reveal

        for e in effects:
            if isinstance(e, Send):
                if isinstance(e.message, Reveal):
                    self.revealed_at = time.perf_counter()
                self.queue.append((e.peer, Received(src, e.message)))
            elif isinstance(e, Publish):
                self.queue.append((self.executor, Received(src, e.message, e.topic)))
            elif isinstance(e, StartCompute) and self.solution is not None:
                sol, prints = self.solution
                self.queue.append((src, ComputeDone(
                    e.task.task_id, e.attempt, sol.answer, sol.cot_text, sol.confidence,
                    len(sol.token_ids), 1, self.runner.model_hash, prints, b"",
                    tuple(sol.token_ids))))
            elif isinstance(e, StartCheck):
                self.queue.append((src, self.runner.run(e)))
            elif isinstance(e, Emit) and e.event == "verify.decided":
                self.times.append((time.perf_counter() - self.revealed_at) * 1000)

    def run_until_decided(self) -> None:
        from protocol.machine import Tick

        before = len(self.times)
        while len(self.times) == before:
            if self.queue:
                dest, event = self.queue.popleft()
                self.perform(dest, self.machines[dest].handle(event, self.now))
                continue
            deadlines = [(d, p) for p, m in self.machines.items()
                         if (d := m.next_deadline()) is not None]
            if not deadlines:
                return
            at, peer = min(deadlines)
            self.now = max(self.now, at)
            self.perform(peer, self.machines[peer].handle(Tick(), self.now))
