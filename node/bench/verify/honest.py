"""The false-positive rate of `symphony bench verify`, with its interval (``--honest N``).

Each of N honest runs answers a question of the evaluation set (cycled, with a seed, a
temperature and a prompt style of its own: :data:`STYLES`, the task styles whose prompts
differ most, the chain of thought's of about 77 tokens, the chat turn's of about 40, the raw
text's (``Question: ...`` and ``Answer:``, which a raw completion goes on from) of about 13)
on one of four honest executors, commits, and has the result checked
once as a verifier does (node.bench.verify.verdict.check_result: binding, Merkle-checked
leaves from a real models.state_store.StateStore, layer 1 and the seed's layers re-run on the
fp32 verifier) at a verifier thread count of its own. The executors: llama.cpp with state
capture at 1 and at 2 threads (the states of its own generation), and llama.cpp without
capture whose commitment is the fp32 prefill (what a backend without capture commits) at
torch's 1 and 2 threads. Generations are short (at most :data:`HONEST_TOKENS`, two
fingerprint chunks): the check compares layer 1 at every prompt and output position and the sampled
layers at the checked chunks, so a longer output adds positions, not kinds of work.
The executors are built once per call and serve every run; a line on stderr every
:data:`PROGRESS_EVERY` checked runs says how far a long run got.

A run whose answer has no token commits to nothing and is not a verification: runs go on
until N were checked (``honest_empty`` counts the others).

Reported: ``honest_runs``, ``false_positives`` (checks of honest results that failed) and
``fp_upper_95``, the one-sided 95% upper bound of the false-positive rate
(models.stats.upper_bound: exact Clopper-Pearson).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

from models.commitments import commitments_for
from models.stats import upper_bound
from node.bench.verify.swaps import CHUNKS_PER_CHECK, capturing, solve_with
from node.bench.verify.verdict import check_result
from protocol.market.messages import TaskSpec
from protocol.verification.rules import choose_chunks, choose_layers
from protocol.verification.verifier import LAYERS_PER_CHECK

#: output tokens per honest run: two fingerprint chunks (models.commitments.CHUNK_TOKENS)
HONEST_TOKENS = 40
#: the thread counts executors and the verifier run at
THREADS = (1, 2)
#: the task styles honest runs cycle through (models.cot.build_prompt)
STYLES = ("cot", "chat", "plain")
#: runs between two progress lines on stderr
PROGRESS_EVERY = 100


def executors(runner: Any) -> dict[str, tuple[Any, int]]:
    """name -> (generating backend, torch threads of its fp32 prefill commitment; 0: the
    states its llama.cpp generation captured)."""
    from models.config import ModelConfig
    from models.llama_backend import LlamaCppBackend

    info = runner.backend.info
    out: dict[str, tuple[Any, int]] = {f"llama_cpp_t{t}": (capturing(info, info.path, t), 0)
                                       for t in THREADS}
    plain = LlamaCppBackend(info, ModelConfig(n_threads=1))  # no capture
    out.update({f"torch_t{t}": (plain, t) for t in THREADS})
    return out


def run_honest(runner: Any, folder: Path, questions: list[tuple[TaskSpec, Any]], n: int,
               rng: random.Random, backends: dict[str, tuple[Any, int]] | None = None,
               tokens: int = HONEST_TOKENS) -> dict[str, Any]:
    """``n`` checked honest runs (see the module docstring) of at most ``tokens`` output
    tokens on ``backends`` (default: the :func:`executors` of ``runner``): the failures, their
    upper bound, the failures per executor."""
    import torch

    from models.state_store import StateStore

    if n < 1:
        raise ValueError(f"--honest takes at least one run, got {n}")
    store = StateStore(folder / "honest-states", budget_bytes=1 << 28, keep_ms=0)
    backends = backends or executors(runner)
    names = sorted(backends)
    threads = torch.get_num_threads()
    failed: dict[str, int] = dict.fromkeys(names, 0)
    checked, i, started = 0, 0, time.perf_counter()
    while checked < n:
        if i >= 2 * n + len(STYLES):  # a model that answers nothing has no false positives
            raise RuntimeError(f"{i - checked} of {i} honest runs answered no token")
        task, problem = _varied(*questions[i % len(questions)], i)
        i += 1
        name = names[rng.randrange(len(names))]
        backend, prefill_threads = backends[name]
        s = solve_with(backend, task, problem, tokens, seed=rng.randrange(1 << 31),
                       temperature=rng.choice((0.0, 0.7, 1.0)))
        if not s.output_ids:  # an answer of no tokens commits to nothing: nothing to check
            continue
        if prefill_threads:
            torch.set_num_threads(prefill_threads)
        # a backend without capture commits by the fp32 prefill (models.commitments)
        made = commitments_for(backend, s.prompt_ids, s.output_ids, store, task.task_id)
        seed = rng.randbytes(32)
        chunks = choose_chunks(seed, "e", len(made.fingerprints), CHUNKS_PER_CHECK)
        layers = choose_layers(seed, "e", made.state_layers, LAYERS_PER_CHECK)
        torch.set_num_threads(rng.choice(THREADS))  # the verifier's
        failed[name] += not check_result(runner, store, chunks, layers, None, task, made,
                                         s.output_ids, s.cot, s.answer)
        torch.set_num_threads(threads)
        checked += 1
        if checked % PROGRESS_EVERY == 0 or checked == n:
            print(f"bench verify --honest: {checked}/{n} checked ({i} runs), "
                  f"{sum(failed.values())} false positives, "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    store.flush()
    false_positives = sum(failed.values())
    return {"honest_runs": checked, "honest_empty": i - checked,
            "false_positives": false_positives,
            "fp_upper_95": float(f"{upper_bound(false_positives, max(1, checked)):.3g}"),
            "false_positives_by_executor": failed}


def _varied(task: TaskSpec, problem: Any, i: int) -> tuple[TaskSpec, Any]:
    """Run ``i``'s task and problem: a task id of its own, the style :data:`STYLES` gives it
    (the task's, which the verifier builds the prompt from, and the problem's, which the
    executor does)."""
    style = STYLES[i % len(STYLES)]
    question = f"Question: {task.question}\nAnswer:" if style == "plain" else task.question
    return (dataclasses.replace(task, task_id=b"\xaa" + i.to_bytes(31, "big"), style=style,
                                question=question),
            dataclasses.replace(problem, style=style, question=question))

