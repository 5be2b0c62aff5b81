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
from collections import deque
from pathlib import Path
from typing import Any

from models.checks import CheckRunner, LayerJob
from models.commitments import CHUNK_TOKENS, Commitments, commitments_for
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


def run(quick: bool) -> dict[str, float | int | str]:
    import tempfile

    import torch

    from models.config import ModelConfig
    from models.cot import solve
    from models.evalset import load_evalset
    from models.fingerprint import fingerprint_backend
    from models.loader import load_backend
    from models.state_store import StateStore

    n_questions, samples, max_tokens = (2, 2, 96) if quick else (6, 4, 256)
    t0 = time.perf_counter()
    serve = load_backend(ModelConfig())
    runner = CheckRunner(serve)
    fb = fingerprint_backend(serve)
    cheap = _bf16_copy(fb)
    load_s = time.perf_counter() - t0
    threads = torch.get_num_threads()  # what fingerprint_backend set: the serving policy
    other_threads = 2 if threads == 1 else 1
    rng = random.Random(6)
    items = load_evalset()[:n_questions]
    tmp = tempfile.TemporaryDirectory(prefix="symphony-bench-states-")
    store = StateStore(Path(tmp.name))
    gen_ms, gen_tokens, fp_ms, check_ms, prefill_ms, blob_sizes = [], [], [], [], [], []
    leaf_bytes: list[int] = []
    gen_cpu_ms: list[float] = []
    check_cpu_ms: list[float] = []
    honest_fail = honest_total = 0
    caught = {a: 0 for a in ADVERSARIES}
    tried = {a: 0 for a in ADVERSARIES}
    solved: list[tuple[TaskSpec, Any, Commitments]] = []
    for i, item in enumerate(items):
        problem = item.problem
        task = _task(problem.question, problem.answer_type.value, problem.choices, i)
        started, cpu = time.perf_counter(), time.thread_time()
        sol = solve(serve, problem, max_tokens=max_tokens)
        gen_ms.append((time.perf_counter() - started) * 1000)
        gen_cpu_ms.append((time.thread_time() - cpu) * 1000)
        ids = list(sol.token_ids)
        gen_tokens.append(len(ids))
        started = time.perf_counter()
        made = commitments_for(serve, sol.prompt_token_ids, ids, store, task.task_id)
        fp_ms.append((time.perf_counter() - started) * 1000)
        prints = made.fingerprints
        # a blob is 4 header bytes + 4 bytes per position and top-k entry: scale to 32 tokens
        blob_sizes += [4 + (len(b) - 4) * CHUNK_TOKENS // max(1, int.from_bytes(b[2:4], "little"))
                       for b in prints]
        solved.append((task, sol, made))
        cheap_task = dataclasses.replace(task, task_id=b"\xcc" + task.task_id[1:])
        cheap_made = commitments_for(cheap, sol.prompt_token_ids, ids, store, cheap_task.task_id)
        for s in range(samples):
            seed = rng.randbytes(32)
            chunks = choose_chunks(seed, "e", len(prints), CHUNKS_PER_CHECK)
            layers = choose_layers(seed, "e", made.state_layers, LAYERS_PER_CHECK)
            check = functools.partial(_check, runner, store, chunks, layers, leaf_bytes)
            started, cpu = time.perf_counter(), time.thread_time()  # the verifier's threads
            ok = check(task, made, ids, sol.cot_text, sol.answer)
            check_ms.append((time.perf_counter() - started) * 1000)
            check_cpu_ms.append((time.thread_time() - cpu) * 1000)
            torch.set_num_threads(other_threads)  # and honest again on another thread count
            ok = ok and check(task, made, ids, sol.cot_text, sol.answer)
            torch.set_num_threads(threads)
            honest_total += 1
            honest_fail += not ok
            if s == 0:  # the whole-prefill check of the same chunks, for comparison
                started = time.perf_counter()
                honest_fail += not _prefill_check(runner, task, chunks, ids, sol, prints)
                prefill_ms.append((time.perf_counter() - started) * 1000)
                honest_total += 1
            pos = rng.randrange(len(ids))  # anywhere in the output
            tampered = list(ids)
            tampered[pos] = (tampered[pos] + 1 + rng.randrange(100)) % 49152
            cases = {
                "tamper": (task, made, tampered, serve.detokenize(tampered), sol.answer),
                "fabricated_cot": (task, made, ids, sol.cot_text + " I double-checked it.",
                                   sol.answer),
                "wrong_answer": (task, made, ids, sol.cot_text, sol.answer + "1"),
                "lower_precision": (cheap_task, cheap_made, ids, sol.cot_text, sol.answer),
            }
            for name, args in cases.items():
                tried[name] += 1
                caught[name] += not check(*args)
    verdict_ms = _result_to_verdict_ms(runner, store, solved, 3 if quick else 6)
    tmp.cleanup()
    ratio = statistics.mean(check_ms) / statistics.mean(gen_ms)
    per_token = ratio  # a check covers the whole output (layer 1) and a sampled part of it
    out: dict[str, float | int | str] = {
        "model": serve.info.name,
        "questions": len(items), "checks_per_question": samples, "threads": threads,
        "load_s": round(load_s, 2),
        "generate_ms_mean": round(statistics.mean(gen_ms), 1),
        "generated_tokens_mean": round(statistics.mean(gen_tokens), 1),
        "check_ms_mean": round(statistics.mean(check_ms), 1),
        "layers_per_check": 1 + LAYERS_PER_CHECK,
        "state_bytes_fetched_per_check": round(statistics.mean(leaf_bytes)),
        "verify_cost_ratio": round(ratio, 4),
        "verify_cost_ratio_cpu": round(statistics.mean(check_cpu_ms)
                                       / statistics.mean(gen_cpu_ms), 4),
        "verify_cost_per_token_ratio": round(per_token, 4),
        "prefill_check_ms_mean": round(statistics.mean(prefill_ms), 1),
        "prefill_check_cost_ratio": round(statistics.mean(prefill_ms) / statistics.mean(gen_ms),
                                          4),
        "network_cost_ratio": round(ratio * DEFAULT_SAMPLE_RATE * DEFAULT_VERIFIERS, 4),
        "commit_cost_ratio": round(statistics.mean(fp_ms) / statistics.mean(gen_ms), 4),
        "fingerprint_bytes_per_32_tokens": max(blob_sizes) if blob_sizes else 0,
        "false_positive_rate": round(honest_fail / max(1, honest_total), 4),
        "result_to_verdict_ms_p50": round(statistics.median(verdict_ms), 1),
    }
    for name in ADVERSARIES:
        out[f"detection_rate_{name}"] = round(caught[name] / max(1, tried[name]), 4)
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


def _fetch(store: Any, e: StartCheck, job: LayerJob, sizes: list[int] | None = None,
           task_id: bytes | None = None) -> dict:
    """What node/state_streams.fetch_leaves does, minus the network: serve, prove, decode."""
    from models.layer_states import leaf_index, n_blocks
    from node.verification.state_streams import open_leaf

    blocks = n_blocks(job.plan.total_tokens)
    wanted = {leaf_index(la, b, blocks): (la, b) for la, b in job.wanted}
    got = {}
    total = 0
    for index, leaf, proof in store.leaves(task_id or e.task.task_id, e.states_root,
                                           sorted(wanted)):
        got[wanted[index]] = open_leaf(e.states_root, e.state_layers * blocks, index,
                                       wanted[index], leaf, proof)
        total += len(leaf) + len(proof)
    if sizes is not None:
        sizes.append(total)
    return got


def _check(runner: CheckRunner, store: Any, chunks: tuple[int, ...], layers: tuple[int, ...],
           sizes: list[int], task: TaskSpec, made: Commitments, output: list[int], cot: str,
           answer: str) -> bool:
    """One verifier's whole check of committed layer states: binding, fetch, re-run."""
    e = _start(runner, task, made, chunks, layers, output, cot, answer)
    job = runner.prepare(e)
    if not isinstance(job, LayerJob):
        return job.passed
    return runner.run_layers(e, job, _fetch(store, e, job, sizes)).passed


def _prefill_check(runner: CheckRunner, task: TaskSpec, chunks: tuple[int, ...],
                   output: list[int], sol: Any, prints: tuple[bytes, ...]) -> bool:
    return runner.run(StartCheck(
        check_id=bytes(32), task=task, model_hash=runner.model_hash, output_ids=tuple(output),
        answer=sol.answer, cot=sol.cot_text, chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
        fingerprints=tuple(prints[c] for c in chunks), deadline_at_ms=0)).passed


# ---------------------------------------------------------------- result to verdict, in-process


def _result_to_verdict_ms(runner: CheckRunner, store: Any,
                          solved: list[tuple[TaskSpec, Any, Commitments]],
                          rounds: int) -> list[float]:
    """Run requester, executor and two verifiers' machines with the real checks, in-process."""
    from crypto.keys import Identity
    from protocol.market.auction import AuctionConfig, SubmitTask
    from protocol.market.executor import ExecutorConfig, ServedModel
    from protocol.market.selection import ScoreSelector
    from protocol.verification.requester import VerifiedAuction, VerifyConfig
    from protocol.verification.executor import VerifiedExecutor
    from protocol.verification.verifier import Verifier, VerifierConfig

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
    loop = _Loop(machines, runner, store, ids["executor"].peer_id)
    for r in range(rounds):
        task, sol, made = solved[r % len(solved)]
        loop.now = r * 1_000_000
        loop.solution = (sol, made)
        loop.perform(ids["requester"].peer_id, auction.handle(SubmitTask(
            question=task.question, answer_type=task.answer_type, choices=task.choices,
            deadline_ms=600_000, k=1, max_tokens=256, task_id=bytes([r + 1]) * 32), loop.now))
        loop.states_of = task.task_id  # where the executor's store keeps this solution's states
        loop.run_until_decided()
    return loop.times or [float("nan")]


class _Loop:
    """A FIFO of (machine, event) with virtual time; checks and solutions are real."""

    def __init__(self, machines: dict[str, Any], runner: CheckRunner, store: Any,
                 executor: str) -> None:
        self.machines, self.runner, self.executor = machines, runner, executor
        self.store = store
        self.states_of = b""
        self.queue: deque[tuple[str, object]] = deque()
        self.now = 0
        self.solution: tuple[Any, Commitments] | None = None
        self.revealed_at = 0.0
        self.times: list[float] = []

    def perform(self, src: str, effects: list[object]) -> None:
        from protocol.market.executor import StartCompute
        from protocol.machine import Emit, Publish, Received, Send
        from protocol.market.events import ComputeDone
        from protocol.verification.messages import Reveal

        for e in effects:
            if isinstance(e, Send):
                if isinstance(e.message, Reveal):
                    self.revealed_at = time.perf_counter()
                self.queue.append((e.peer, Received(src, e.message)))
            elif isinstance(e, Publish):
                self.queue.append((self.executor, Received(src, e.message, e.topic)))
            elif isinstance(e, StartCompute) and self.solution is not None:
                sol, made = self.solution
                self.queue.append((src, ComputeDone(
                    e.task.task_id, e.attempt, sol.answer, sol.cot_text, sol.confidence,
                    len(sol.token_ids), 1, self.runner.model_hash, made.fingerprints, b"",
                    tuple(sol.token_ids), made.states_root, made.state_layers)))
            elif isinstance(e, StartCheck):
                job = self.runner.prepare(e)
                done = job if not isinstance(job, LayerJob) else \
                    self.runner.run_layers(e, job, _fetch(self.store, e, job,
                                                          task_id=self.states_of))
                self.queue.append((src, done))
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
