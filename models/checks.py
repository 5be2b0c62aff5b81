"""The model work of a verifier: re-check the result another executor committed to.

The executor's side is models/commitments.py; the verifier recomputes its layers in fp32,
within tolerances measured against the executor's llama.cpp states (models.layer_states), so
honest work passes. The verifier (:class:`CheckRunner`) rebuilds the prompt from the task exactly
as the executor's ``models.cot.solve`` did (``models.cot.build_prompt``: the task's style and
conversation, same serving backend's template and tokenizer), then checks that the claimed
CoT is the detokenized output and that the claimed answer is what ``models.cot.answer_of``
finds in it. The checks re-run the model over the claimed tokens (teacher forcing), never
the sampler: a result sampled at any temperature with the attempt's seed
(``protocol.market.sampling.executor_seed``, which anyone holding the task can recompute)
checks out exactly as a greedy one does. Then, when the executor committed layer
states (the default), :meth:`CheckRunner.prepare` says which leaves to fetch from it (the
caller fetches them: node/verification/state_streams.py in the daemon) and
:meth:`CheckRunner.run_layers` re-runs layer 1 and the layers the seed drew on them
(models.layer_states: ~3 of 30 layers, ~1% of the inference); with fingerprints only,
:meth:`CheckRunner.run` re-runs one prefill up to the last sampled chunk
(models.fingerprint.check_fingerprint, ~20% of the inference on a CPU).

Everything here blocks: the daemon's verify service calls it in ``trio.to_thread``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.agents.wire import ToolCallRecord
from protocol.market.messages import MAX_ANSWER_CHARS, TaskSpec
from protocol.verification.verifier import CheckDone, StartCheck

if TYPE_CHECKING:  # numpy and torch load only where a model is used
    from models.adapter_weights import LoraWeights
    from models.layer_states import CheckPlan as LayerPlan

#: the executor's marker for a CoT cut to the wire limit (protocol.market.executor)
COT_TRUNCATION_MARK = "\n[... truncated]"
#: LoRA adapters a runner keeps read (agents' adapters it checked results of)
MAX_ADAPTERS = 4


def cot_matches(claimed: str, text: str) -> bool:
    """Is ``claimed`` the detokenized output (or the executor's truncation of it)?"""
    if claimed == text:
        return True
    if claimed.endswith(COT_TRUNCATION_MARK):
        return text.startswith(claimed[:-len(COT_TRUNCATION_MARK)])
    return False


def task_prompt_ids(backend: Any, task: TaskSpec, system_prompt: str = "",
                    tool_calls: tuple[ToolCallRecord, ...] = ()) -> list[int]:
    """The prompt ``models.cot.solve`` sends for ``task`` (its style, chain of thought on),
    for an agent with ``system_prompt`` that made ``tool_calls``."""
    from models.cot import build_prompt, problem_of

    problem = problem_of(task, system_prompt, tool_calls)
    return list(backend.prompt_ids(build_prompt(problem, cot=True)))


@dataclass(frozen=True, slots=True)
class LayerJob:
    prompt_ids: list[int]
    plan: LayerPlan
    wanted: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class CheckTiming:
    prefill_ms: float
    tokens: int


class CheckRunner:
    """Runs ``StartCheck`` on one model; one check at a time (a lock). The model is the
    ``backend`` given, or what ``loader`` returns at the first check (a deferred runner:
    every node verifies by default, and most never get a check)."""

    def __init__(self, backend: Any = None, *, model_hash: bytes = b"",
                 loader: Callable[[], Any] | None = None) -> None:
        if backend is None and (loader is None or not model_hash):
            raise ValueError("CheckRunner needs a backend, or a loader and its model's hash")
        self._backend = backend
        self._loader = loader
        self.model_hash = model_hash or bytes.fromhex(backend.identity_hash)
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self.last: CheckTiming | None = None
        #: adapters read for checks, by content hash (oldest dropped past MAX_ADAPTERS)
        self._adapters: dict[bytes, LoraWeights] = {}

    @property
    def backend(self) -> Any:
        if self._backend is None:
            with self._load_lock:
                if self._backend is None:
                    self._backend = self._loader()  # type: ignore[misc]
        return self._backend

    def warm(self) -> None:
        """Load what a check runs (the model, and the transformers copy that re-runs its
        layers) now rather than at the first check (blocking: run it in a thread)."""
        from models.fingerprint import fingerprint_backend

        fingerprint_backend(self.backend)

    @classmethod
    def load(cls, spec: str = "", *, deferred: bool = False) -> CheckRunner:
        """A runner on ``spec`` ("" = the default model); ``deferred``: only its weights are
        hashed now, the model loads at the first check."""
        import functools

        from models.config import ModelConfig
        from models.loader import load_backend
        from models.registry import identity_hash, resolve

        config = ModelConfig(spec=spec) if spec else ModelConfig()
        if not deferred:
            return cls(load_backend(config))
        return cls(model_hash=bytes.fromhex(identity_hash(resolve(config.spec))),
                   loader=functools.partial(load_backend, config))

    def _binding(self, e: StartCheck) -> CheckDone | list[int]:
        """The cheap part of every check (the CoT is the output, the answer is the CoT's):
        a failed CheckDone, or the prompt ids rebuilt from the task. Call under the lock."""
        from models.cot import answer_of, problem_of

        if e.model_hash != self.model_hash:
            raise ValueError("check for a model this runner does not hold")
        text = self.backend.detokenize(e.output_ids)
        if not cot_matches(e.cot, text):
            return CheckDone(e.check_id, False, "CoT is not the detokenized output tokens")
        problem = problem_of(e.task, e.system_prompt, e.tool_calls)
        if answer_of(problem, text)[:MAX_ANSWER_CHARS] != e.answer:
            return CheckDone(e.check_id, False, "answer is not the one the output states")
        return task_prompt_ids(self.backend, e.task, e.system_prompt, e.tool_calls)

    def prepare(self, e: StartCheck) -> CheckDone | LayerJob:
        """For a check of committed layer states: the binding checks and what to fetch."""
        from models.layer_states import needed_leaves, plan_check

        with self._lock:
            prompt = self._binding(e)
        if isinstance(prompt, CheckDone):
            return prompt
        plan = plan_check(len(prompt), len(e.output_ids), e.chunk_indices, e.chunk_tokens,
                          e.layers)
        return LayerJob(prompt, plan, tuple(needed_leaves(plan)))

    def run_layers(self, e: StartCheck, job: LayerJob, fetched: dict[tuple[int, int], Any],
                   adapter: Path | None = None) -> CheckDone:
        """Re-run layer 1 and the sampled layers on the fetched, Merkle-checked leaves; for a
        result on a LoRA adapter (``e.adapter``) with the adapter file at ``adapter`` (the
        caller fetched it and checked its bytes against the hash) merged into those layers.
        An adapter that does not fit the model fails the check: the executor named it."""
        from models.adapter_weights import merged
        from models.fingerprint import fingerprint_backend
        from models.layer_states import check_layers

        if e.adapter and adapter is None:
            raise ValueError("the check names an adapter: its file is needed")
        with self._lock:
            backend = fingerprint_backend(self.backend)
            blocks = [0, *(layer - 1 for layer in job.plan.layers)]  # layer L is block L-1
            started = time.perf_counter()
            with ExitStack() as stack:
                try:
                    lora = self._lora(backend, e.adapter, adapter) if e.adapter else None
                    stack.enter_context(merged(backend, lora, blocks))
                except ValueError as exc:
                    return CheckDone(e.check_id, False, f"adapter: {exc}"[:128])
                checks = check_layers(backend, job.prompt_ids + list(e.output_ids), job.plan,
                                      fetched)
            self.last = CheckTiming((time.perf_counter() - started) * 1000, job.plan.end)
        bad = [c.reason for c in checks if not c.ok]
        return CheckDone(e.check_id, not bad, "; ".join(bad)[:128])

    def _lora(self, backend: Any, key: bytes, path: Path | None) -> LoraWeights:
        """The adapter ``key`` read from ``path`` (kept: the next check on it reads nothing)."""
        from models.adapter_weights import read_lora

        if key not in self._adapters:
            config = backend.model.config
            if len(self._adapters) >= MAX_ADAPTERS:
                del self._adapters[next(iter(self._adapters))]
            self._adapters[key] = read_lora(path, config.num_attention_heads,  # type: ignore[arg-type]
                                            config.num_key_value_heads)
        return self._adapters[key]

    def run(self, e: StartCheck) -> CheckDone:
        """A check by one prefill over the sampled chunks (no layer states committed)."""
        from models.fingerprint import check_fingerprint, fingerprint_backend

        with self._lock:
            prompt = self._binding(e)
            if isinstance(prompt, CheckDone):
                return prompt
            n_chunks = (len(e.output_ids) + e.chunk_tokens - 1) // e.chunk_tokens
            blobs = [b""] * n_chunks  # only the sampled chunks are compared
            for index, blob in zip(e.chunk_indices, e.fingerprints, strict=True):
                if index < n_chunks:
                    blobs[index] = blob
            started = time.perf_counter()
            result = check_fingerprint(fingerprint_backend(self.backend), prompt, e.output_ids,
                                       blobs, chunks=list(e.chunk_indices), chunk=e.chunk_tokens)
            upto = min(len(e.output_ids), (max(e.chunk_indices, default=0) + 1) * e.chunk_tokens)
            self.last = CheckTiming((time.perf_counter() - started) * 1000, len(prompt) + upto)
        if result.ok:
            return CheckDone(e.check_id, True, "")
        why = "; ".join(f"chunk {c.chunk}: {c.reason}" for c in result.chunks if not c.ok)
        return CheckDone(e.check_id, False, why[:128])
