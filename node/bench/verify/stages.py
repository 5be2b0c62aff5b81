"""Stage checks of a distributed inference chain: what they catch and what they cost.

In one process, on the default model's own blocks (models.blocks, the code a stage server
runs), without daemons: a chain of three stages ([0, 10), [10, 20), [20, 30) of SmolLM2's 30)
greedily generates ``STEPS`` steps (the prompt's prefill, then one token a step), hidden states
rounded to fp16 between stages as on the wire. The middle stage is then replaced by each
dishonest kind of models.dishonest, computing on the same committed inputs (the honest
chain's: which inputs a liar sees does not change what a check of it compares).

* ``stage_detection``: per kind, the fraction of trials in which the liar is convicted within
  ``STEPS`` steps at the default check rate by the check daemons run
  (node.inference.stage_checks): each stage commits, with every step, to the keys and values
  (K/V) the step appended (fp32, its cache's precision), and a check recomputes only the
  selected steps' rows on the committed K/V (models.stage_kv.recheck, what a checker's
  node.inference.server runs), comparing both their outputs and their K/V rows. Each trial
  draws its own nonce (so its own steps: protocol.inference.stage_checks.step_checked over the
  stage's signed commitments); a step's verdict does not depend on which others are checked,
  so every step is judged once per kind (``stage_steps_off``: the fraction of the liar's steps
  found off; ``stage_honest_steps_off``: the honest stage's steps found off) and each trial
  asks whether a step it selects is off. ``stage_false_convictions``: the same trials over the
  honest stage.
* ``stage_check_cost_ratio``: what the checks of one generation add to the chain's compute:
  for ``COST_TRIALS`` nonces, every hop's selected rows recomputed on its committed K/V in one
  forward and compared, timed, plus what every stage spends every step reading the K/V rows
  it appended out of its cache and hashing them for its commitment (``stage_commit_kv_s``),
  over the compute time of the three stages over the whole generation; the transfers are
  left out (no compute of blocks). All are CPU time of the one thread computing (torch at one
  thread for the measurement), which other jobs on a shared machine change least.
* ``stage_detection_prefill``, ``stage_false_convictions_prefill``,
  ``stage_check_cost_ratio_prefill``: the same for the fallback daemons run when a stage's
  steps do not fit the pages with their K/V: every hop recomputed from position 0 up to its
  last selected step (one prefill each), outputs compared. Attention is causal, so the
  recompute of a prefix is the first rows of the recompute of the whole input history: one
  recompute serves every trial.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from crypto.hashing import digest
from crypto.keys import Identity
from models.stage_kv import row_error
from protocol.inference.messages import StageCommit
from protocol.inference.stage_checks import (
    DEFAULT_CHECK_RATE,
    MAX_STAGE_ERR,
    commit_signing_bytes,
    disagrees,
    step_checked,
)

#: steps of one generation: the prompt's prefill and one token a step after it
STEPS = 100
SPLITS = ((0, 10), (10, 20), (20, 30))
LIAR = 1
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
#: nonces the per-position check's cost is averaged over (each costs a few rows) ...
COST_TRIALS = 20
#: ... and the prefill fallback's (each costs a prefill per hop)
COST_TRIALS_PREFILL = 3
NOISE_SCALE = 0.01


@dataclass
class _Run:
    """One stage's frames over a generation: inputs and outputs per step, fp16 as on the wire."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _generate(head: Any, stages: list[Any], prompt: list[int],
              ) -> tuple[list[_Run], list[Any], float, float]:
    """Greedy STEPS steps through ``stages``: every stage's frames, caches, compute time and
    the time spent reading and hashing each step's K/V rows (the stages' commitments)."""
    from models.blocks import StageCache
    from models.stage_kv import kv_width, step_kv

    runs = [_Run([], []) for _ in stages]
    caches = [StageCache() for _ in stages]
    compute_s, kv_s, tokens, pos = 0.0, 0.0, list(prompt), 0
    for _ in range(STEPS):
        x = _fp16(head.embed_tokens(tokens[pos:]))
        for stage, cache, run in zip(stages, caches, runs, strict=True):
            started = time.thread_time()
            y = _fp16(stage.forward(x, pos, cache))
            compute_s += time.thread_time() - started
            started = time.thread_time()
            digest(step_kv(cache, range(stage.start, stage.end), pos, len(x),
                           kv_width(stage.config)).astype("<f4").tobytes())
            kv_s += time.thread_time() - started
            run.inputs.append(x)
            run.outputs.append(y)
            x = y
        pos = len(tokens)
        tokens.append(int(np.argmax(head.logits(x)[-1])))
    return runs, caches, compute_s, kv_s


def _lie(stage: Any, run: _Run) -> tuple[list[np.ndarray], Any]:
    """``stage``'s outputs (a dishonest one's) on the honest run's inputs, step by step, and
    its cache."""
    from models.blocks import StageCache

    cache, pos, out = StageCache(), 0, []
    for x in run.inputs:
        out.append(_fp16(stage.forward(x, pos, cache)))
        pos += len(x)
    return out, cache


def _kv_off(stage: Any, run: _Run, outputs: list[np.ndarray], cache: Any) -> list[bool]:
    """Per step: is the stage that sent ``outputs`` and kept ``cache`` off at that step by a
    per-position check (models.stage_kv)? Every step's rows in one recheck: a step's verdict
    does not depend on which others are checked."""
    from models.stage_kv import recheck, step_kv

    x = np.concatenate(run.inputs)
    kv = step_kv(cache, range(stage.start, stage.end), 0, len(x))
    y, new = recheck(stage, x, np.arange(len(x)), kv)
    off, pos = [], 0
    for got in outputs:
        rows = slice(pos, pos + len(got))
        off.append(disagrees(max(row_error(got, y[rows]), row_error(kv[rows], new[rows]))))
        pos += len(got)
    return off


def _commits(me: Identity, session: bytes, run: _Run, outputs: list[np.ndarray],
             ) -> list[StageCommit]:
    commits, pos = [], 0
    for step, (x, y) in enumerate(zip(run.inputs, outputs, strict=True), 1):
        i, o = digest(x.astype(np.float16).tobytes()), digest(y.astype(np.float16).tobytes())
        k = digest(b"%d" % step)  # what K/V digest a commitment names does not steer the draw
        signed = commit_signing_bytes(session, step, pos, len(x), i, o, k)
        commits.append(StageCommit(session_id=session, step=step, start_pos=pos, n=len(x),
                                   input_digest=i, output_digest=o, kv_digest=k,
                                   signature=me.sign(signed)))
        pos += len(x)
    return commits


def _convicted(rng: random.Random, me: Identity, run: _Run, outputs: list[np.ndarray],
               reference: np.ndarray) -> bool:
    """One trial: a fresh nonce and session select steps; is a selected one off?"""
    session, nonce = rng.randbytes(16), rng.randbytes(32)
    for c, y in zip(_commits(me, session, run, outputs), outputs, strict=True):
        if step_checked(nonce, me.peer_id, c, DEFAULT_CHECK_RATE):
            ref = reference[c.start_pos:c.start_pos + c.n]
            err = np.max(np.linalg.norm(y - ref, axis=1) / np.linalg.norm(ref, axis=1))
            if disagrees(float(err)):
                return True
    return False


def _convicted_kv(rng: random.Random, me: Identity, run: _Run, outputs: list[np.ndarray],
                  off: list[bool]) -> bool:
    """One trial of the per-position check: is a step the nonce selects off?"""
    session, nonce = rng.randbytes(16), rng.randbytes(32)
    return any(off[c.step - 1] for c in _commits(me, session, run, outputs)
               if step_checked(nonce, me.peer_id, c, DEFAULT_CHECK_RATE))


def _check_cost_kv(rng: random.Random, me: Identity, stages: list[Any], runs: list[_Run],
                   caches: list[Any]) -> float:
    """The compute of one generation's per-position checks: each hop's selected rows
    recomputed on its committed K/V, in one forward, and compared."""
    from models.stage_kv import recheck, step_kv

    session, nonce, spent = rng.randbytes(16), rng.randbytes(32), 0.0
    for stage, run, cache in zip(stages, runs, caches, strict=True):
        picked = [c for c in _commits(me, session, run, run.outputs)
                  if step_checked(nonce, me.peer_id, c, DEFAULT_CHECK_RATE)]
        if not picked:
            continue
        kv = step_kv(cache, range(stage.start, stage.end), 0, cache.length)
        positions = np.concatenate([np.arange(c.start_pos, c.start_pos + c.n) for c in picked])
        rows = np.concatenate([run.inputs[c.step - 1] for c in picked])
        sent = np.concatenate([run.outputs[c.step - 1] for c in picked])
        started = time.thread_time()
        y, new = recheck(stage, rows, positions, kv[:positions.max() + 1])
        disagrees(max(row_error(sent, y), row_error(kv[positions], new)))
        spent += time.thread_time() - started
    return spent


def _check_cost(rng: random.Random, me: Identity, stages: list[Any], runs: list[_Run]) -> float:
    """The compute of one generation's checks: each hop recomputed to its last selected step."""
    from models.blocks import StageCache

    session, nonce, spent = rng.randbytes(16), rng.randbytes(32), 0.0
    for stage, run in zip(stages, runs, strict=True):
        commits = _commits(me, session, run, run.outputs)
        ends = [c.start_pos + c.n for c in commits
                if step_checked(nonce, me.peer_id, c, DEFAULT_CHECK_RATE)]
        if ends:
            x = np.concatenate(run.inputs)[:max(ends)]
            started = time.thread_time()
            stage.forward(x, 0, StageCache())
            spent += time.thread_time() - started
    return spent


def run(quick: bool) -> dict[str, Any]:
    import torch

    from models.gguf_torch import load_gguf_model
    from models.registry import default_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(quick, load_gguf_model(default_model().path)[0], default_model().path)
    finally:
        torch.set_num_threads(threads)


def _measure(quick: bool, model: Any, path: Any) -> dict[str, Any]:
    import llama_cpp

    from models.blocks import BlockStage, Head, StageCache
    from models.dishonest import KINDS, DishonestStage

    head, stages = Head(model), [BlockStage(model, a, b) for a, b in SPLITS]
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    prompt = list(vocab.tokenize(PROMPT.encode(), add_bos=False))
    vocab.close()
    runs, caches, chain_s, kv_s = _generate(head, stages, prompt)
    rng, me = random.Random(29), Identity.from_seed(b"bench-stage".ljust(32, b"."))
    liar = runs[LIAR]
    reference = _fp16(stages[LIAR].forward(np.concatenate(liar.inputs), 0, StageCache()))
    trials = 20 if quick else 200
    detection, prefill, steps_off = {}, {}, {}
    for kind in KINDS:
        outputs, cache = _lie(DishonestStage(stages[LIAR], kind, NOISE_SCALE, seed=29), liar)
        off = _kv_off(stages[LIAR], liar, outputs, cache)
        steps_off[kind] = round(sum(off) / len(off), 3)
        detection[kind] = sum(_convicted_kv(rng, me, liar, outputs, off)
                              for _ in range(trials)) / trials
        prefill[kind] = sum(_convicted(rng, me, liar, outputs, reference)
                            for _ in range(trials)) / trials
    off = _kv_off(stages[LIAR], liar, liar.outputs, caches[LIAR])
    honest = sum(_convicted_kv(rng, me, liar, liar.outputs, off) for _ in range(trials))
    honest_prefill = sum(_convicted(rng, me, liar, liar.outputs, reference)
                         for _ in range(trials))
    cost = [_check_cost_kv(rng, me, stages, runs, caches) for _ in range(COST_TRIALS)]
    cost_prefill = [_check_cost(rng, me, stages, runs) for _ in range(COST_TRIALS_PREFILL)]
    return {"stage_detection": detection, "stage_trials_per_kind": trials,
            "stage_steps": STEPS, "stage_check_rate": DEFAULT_CHECK_RATE,
            "stage_tolerance": MAX_STAGE_ERR, "stage_noise_scale": NOISE_SCALE,
            "stage_false_convictions": honest, "stage_steps_off": steps_off,
            "stage_honest_steps_off": sum(off),
            "stage_chain_compute_s": round(chain_s, 3),
            "stage_check_compute_s": round(statistics.mean(cost), 3),
            "stage_commit_kv_s": round(kv_s, 3),
            "stage_check_cost_ratio": round((statistics.mean(cost) + kv_s) / chain_s, 4),
            "stage_detection_prefill": prefill,
            "stage_false_convictions_prefill": honest_prefill,
            "stage_check_cost_ratio_prefill": round(statistics.mean(cost_prefill) / chain_s,
                                                    4)}
