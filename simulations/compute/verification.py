"""The compute model of commitment-based verification: what executors commit, what checks cost.

It models the scheme the daemon runs by default (models/commitments.py, models/checks.py,
models/layer_states.py). The executor takes its commitments (chunk fingerprints and the Merkle
root of every decoder layer's output) from its own generation: it pays what
``symphony bench verify`` measures, the state capture's share of the generation
(:data:`CAPTURE_SHARE`) plus hashing and writing the states (:data:`COMMIT_BYTES_PER_MS`, on
the executor's CPU whatever its device), :func:`commit_ms`. A verifier fetches the committed leaves it needs from the executor and re-runs layer 1 at every
output position plus the ``LAYERS_PER_CHECK`` layers the seed drew, in full only at the checked
chunks' positions (every other position up to the last checked one gives its keys and values,
``KV_SHARE`` of a layer's work). The model is the daemon's default model's shape
(``MODEL_LAYERS`` decoder layers of ``HIDDEN_SIZE``); the leaves fetched are exactly the ones
``models.layer_states.needed_leaves`` lists, each ``BLOCK_TOKENS * HIDDEN_SIZE * 4`` bytes (plus
its header), sent by the executor to the verifier over the network model.

Time: a whole prefill costs ``PREFILL_FACTOR`` decode steps per token (simulations/compute/cost.py),
so one layer at one position costs ``PREFILL_FACTOR / MODEL_LAYERS`` of a decode step.

Honesty: what an executor computed is kept per (task, attempt) as the set of layers it faked.
An honest executor fakes none; ``cheat = "swap"`` (another model) changes every layer, so every
check fails; ``cheat = "fabricate:<f>"`` fakes each layer with probability f, and a check fails
iff layer 1 or a drawn layer is faked. Fingerprints follow the same model: chunk i's is
``H(model that ran, task id, the chunk's token ids, i)``, made up for a swapped model.

A result committed without layer states (``layer_states=False``: the daemon's executor when it
keeps none) costs its executor one fp32 prefill over prompt + output for the fingerprints, and
is checked by the older whole re-prefill of the sampled chunks, whose fingerprints are
compared; "fabricate:<f>" then makes up that fraction of chunks instead.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from crypto.hashing import digest
from models.layer_states import BLOCK_TOKENS, needed_leaves, plan_check
from protocol.market.events import ComputeDone, StartCompute
from protocol.verification.executor import DEFAULT_CHUNK_TOKENS
from protocol.verification.verifier import CheckDone, CheckFailed, StartCheck
from simulations.compute.cost import PREFILL_FACTOR, CostModel

#: decoder layers and hidden size of the daemon's default model (SmolLM2-135M)
MODEL_LAYERS = 30
HIDDEN_SIZE = 576
#: share of a layer's work for a position that only gives its keys and values
KV_SHARE = 0.15
#: bytes of one leaf's header (models.layer_states: version, layer, block, positions, size)
LEAF_HEADER_BYTES = 12
#: bytes of the verifier's request for leaves (ids and framing)
LEAF_REQUEST_BYTES = 64
#: what capturing every layer's output during a llama.cpp generation adds to it (``symphony
#: bench verify``'s capture_cost_ratio_cpu: 0.008-0.014 on two idle CPU cores, 0.017-0.020
#: with other jobs on them; GPU offload is unmeasured)
CAPTURE_SHARE = 0.014
#: state bytes the executor's commitment hashes and writes per ms (``symphony bench verify``'s
#: commit_bytes_per_ms: BLAKE2b over the leaves and the page-cache write on one CPU thread,
#: 550-650 KB per ms of CPU time measured for the shipped questions)
COMMIT_BYTES_PER_MS = 500_000

CheckEvent = CheckDone | CheckFailed


def fingerprint(model_hash: bytes, task_id: bytes, ids: tuple[int, ...], index: int) -> bytes:
    raw = b"".join(i.to_bytes(4, "big") for i in ids)
    return digest(model_hash + task_id + raw + index.to_bytes(4, "big"), person=b"sim-fp")[:16]


def fingerprints(
    model_hash: bytes,
    task_id: bytes,
    ids: tuple[int, ...],
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[bytes, ...]:
    return tuple(
        fingerprint(model_hash, task_id, ids[i : i + chunk_tokens], i // chunk_tokens)
        for i in range(0, len(ids), chunk_tokens)
    )


def prefill_ms(tokens: float, tokens_per_s: float) -> float:
    """A whole prefill over ``tokens`` positions, in ms."""
    return tokens * PREFILL_FACTOR / tokens_per_s * 1000


def commit_ms(generation_ms: float, tokens: int) -> float:
    """What committing to the layer states of a generation over ``tokens`` positions (prompt
    + output) adds to it: the capture during it, then hashing and writing the states."""
    state_bytes = MODEL_LAYERS * tokens * HIDDEN_SIZE * 4
    return generation_ms * CAPTURE_SHARE + state_bytes / COMMIT_BYTES_PER_MS


class CommittingCost:
    """The cost model plus what a committing executor adds: token ids, fingerprints, layer
    states (faked per the node's cheat mode), and their cost (:func:`commit_ms`; a prefill
    without layer states)."""

    def __init__(self, cost: CostModel, *, layer_states: bool = True) -> None:
        self.cost = cost
        self.layer_states = layer_states
        #: generation time (ms) and the commitments' time (ms), summed over results
        self.compute_ms = 0
        self.commit_ms = 0
        #: (task id, attempt) -> (prompt tokens, layers the executor faked)
        self.states: dict[tuple[bytes, int], tuple[int, frozenset[int]]] = {}

    def compute(
        self, profile: Any, job: StartCompute, rng: random.Random
    ) -> tuple[int, object | None]:
        duration, outcome = self.cost.compute(profile, job, rng)
        if not isinstance(outcome, ComputeDone):
            return duration, outcome
        q = self.cost.question(job.task.question)
        prompt = q.prompt_tokens if q is not None else len(job.task.question) // 4
        total = prompt + outcome.tokens
        commit = max(1, int(commit_ms(duration, total) if self.layer_states
                            else prefill_ms(total, profile.device.tokens_per_s)))
        self.compute_ms += duration
        self.commit_ms += commit
        cheat: str = getattr(profile, "cheat", "")
        ids = tuple(rng.randrange(32_000) for _ in range(outcome.tokens))
        prints = self._prints(outcome, job, ids, cheat, rng)
        extra: dict[str, Any] = {"output_ids": ids, "fingerprints": prints}
        if self.layer_states:
            faked = self._faked_layers(cheat, rng)
            self.states[(job.task.task_id, job.attempt)] = (prompt, faked)
            extra["states_root"] = digest(
                job.task.task_id + bytes(sorted(faked)), person=b"sim-states"
            )
            extra["state_layers"] = MODEL_LAYERS
        return duration + commit, dataclasses.replace(outcome, **extra)

    def _prints(
        self,
        outcome: ComputeDone,
        job: StartCompute,
        ids: tuple[int, ...],
        cheat: str,
        rng: random.Random,
    ) -> tuple[bytes, ...]:
        ran = outcome.model_hash if cheat != "swap" else digest(b"a cheaper model", person=b"sim")
        prints = list(fingerprints(ran, job.task.task_id, ids))
        if cheat.startswith("fabricate:") and not self.layer_states:
            share = float(cheat.split(":", 1)[1])
            for i in range(len(prints)):
                if rng.random() < share:
                    prints[i] = rng.randbytes(16)
        return tuple(prints)

    @staticmethod
    def _faked_layers(cheat: str, rng: random.Random) -> frozenset[int]:
        if cheat == "swap":
            return frozenset(range(1, MODEL_LAYERS + 1))
        if cheat.startswith("fabricate:"):
            share = float(cheat.split(":", 1)[1])
            return frozenset(la for la in range(1, MODEL_LAYERS + 1) if rng.random() < share)
        return frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class CheckWork:
    """What one check costs the verifier: compute time and the states it fetches."""

    compute_ms: int
    fetch_bytes: int
    passed: bool
    detail: str


class CheckCost:
    """Verifier compute and fetches; ``executed`` is the executors' ``CommittingCost``."""

    def __init__(self, tokens_per_s: float, executed: CommittingCost) -> None:
        self.tokens_per_s = tokens_per_s
        self.executed = executed
        self.check_ms = 0
        self.checks = 0
        self.fetch_bytes = 0

    def work(self, job: StartCheck) -> CheckWork:
        """The check's compute, fetch and verdict (layer states when committed)."""
        held = self.executed.states.get((job.task.task_id, job.attempt))
        work = (
            self._layers(job, *held) if job.states_root and held is not None else self._prefill(job)
        )
        self.check_ms += work.compute_ms
        self.fetch_bytes += work.fetch_bytes
        self.checks += 1
        return work

    def _layers(self, job: StartCheck, prompt: int, faked: frozenset[int]) -> CheckWork:
        plan = plan_check(
            prompt, len(job.output_ids), job.chunk_indices, job.chunk_tokens, job.layers
        )
        units = len(job.output_ids) * (1 - KV_SHARE) + plan.total_tokens * KV_SHARE
        for _ in plan.layers:
            units += len(plan.positions) * (1 - KV_SHARE) + plan.end * KV_SHARE
        ms = max(1, int(prefill_ms(units / MODEL_LAYERS, self.tokens_per_s)))
        fetched = sum(
            LEAF_HEADER_BYTES
            + 4 * HIDDEN_SIZE * min(BLOCK_TOKENS, plan.total_tokens - block * BLOCK_TOKENS)
            for _, block in needed_leaves(plan)
        )
        bad = sorted(la for la in (1, *plan.layers) if la in faked)
        detail = f"layer {bad[0]}: update off" if bad else ""
        return CheckWork(ms, fetched, not bad, detail)

    def _prefill(self, job: StartCheck) -> CheckWork:
        ct = job.chunk_tokens
        passed = all(
            fingerprint(
                job.model_hash,
                job.task.task_id,
                job.output_ids[index * ct : (index + 1) * ct],
                index,
            )
            == fp
            for index, fp in zip(job.chunk_indices, job.fingerprints, strict=False)
        )
        ms = max(1, int(prefill_ms(len(job.chunk_indices) * ct, self.tokens_per_s)))
        return CheckWork(ms, 0, passed, "" if passed else "fingerprint mismatch")
