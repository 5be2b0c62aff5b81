"""Rollout generation on a worker: llama.cpp with the policy version's LoRA adapter.

:class:`RolloutWorker` loads the base model once and switches adapters without reloading it
(llama.cpp's ``llama_adapter_lora_init`` / ``llama_set_adapters_lora``), keeping the last
``keep`` versions loaded so jobs for a slightly older version still run. Version 0 is the base
model (no adapter needed). :meth:`RolloutWorker.generate_group` answers a rollout job
(protocol/rl/messages.py): for each prompt the job's seed names, ``group_size`` completions
sampled with the job's temperature and top-p, each as token ids (the end-of-turn token
included when the model stopped) with every token's log-probability under the version's
policy at the job's temperature (``log_softmax(logits / T)``: the distribution the token was
drawn from, before top-p truncation, and what the learner recomputes).
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.backend import SamplingParams, choose_token, log_softmax
from models.config import ModelConfig
from models.fingerprint import DEFAULT_K, encode_chunk
from models.llama_backend import LlamaCppBackend
from models.rl.env import Environment
from models.rl.export import verify_adapter
from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody
from protocol.rl.prompts import job_prompts
from protocol.rl.validation import rollout_commitment

#: adapter versions a worker keeps loaded
DEFAULT_KEEP = 3


@dataclass(frozen=True, slots=True)
class SwapTiming:
    load_s: float  # llama_adapter_lora_init of the file (0 when it was already loaded)
    switch_s: float  # llama_set_adapters_lora on the live context


def _draw(logprobs: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from the full distribution ``exp(logprobs)`` (no top-k or top-p cut):
    one cumulative sum over the vocabulary, no sort."""
    cdf = np.cumsum(np.exp(logprobs))
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)


class RolloutWorker:
    """One llama.cpp model and its adapters. Not thread-safe: one job at a time."""

    def __init__(self, spec: str | None = None, *, n_threads: int = 1, keep: int = DEFAULT_KEEP,
                 n_ctx: int = 2048) -> None:
        from models.loader import load_backend

        if keep < 1:
            raise ValueError(f"a worker keeps at least one adapter version (keep={keep})")
        config = ModelConfig(spec=spec or ModelConfig().spec, n_threads=n_threads, n_ctx=n_ctx)
        backend = load_backend(config)
        assert isinstance(backend, LlamaCppBackend)  # the default backend is llama.cpp
        # the layer states of every generation are kept (models.llama_capture): each
        # completion's fingerprint is read from them, no computation again. Before any
        # adapter is set: this rebuilds the context.
        backend.enable_state_capture()
        self.backend = backend
        self.keep = keep
        self._llama_cpp = backend._llama_cpp
        self._adapters: OrderedDict[int, tuple[object, str]] = OrderedDict()  # version -> (ptr, sha)
        self.version = 0
        #: ((version, prompt ids), logits after them) of the prompt in the context's cache
        self._prompt: tuple[tuple[int, tuple[int, ...]], np.ndarray] | None = None

    @property
    def versions(self) -> list[int]:
        """Versions this worker can serve now (0, the base, always)."""
        return [0, *self._adapters]

    def add_adapter(self, version: int, path: Path, sha256: str) -> float:
        """Check the file's hash and load it next to the base; seconds spent. Evicts the oldest
        version beyond ``keep`` (never the one in use)."""
        if version in self._adapters:
            return 0.0
        if version < 1:
            raise ValueError(f"adapter versions start at 1 (version 0 is the base), got {version}")
        verify_adapter(path, sha256)
        t = time.perf_counter()
        ptr = self._llama_cpp.llama_adapter_lora_init(self.backend.llm.model, str(path).encode())
        if not ptr:
            raise ValueError(f"llama.cpp refused the adapter {path} (wrong base model?)")
        self._adapters[version] = (ptr, sha256)
        elapsed = time.perf_counter() - t
        while len(self._adapters) > self.keep:
            oldest = next(v for v in self._adapters if v != self.version)
            old_ptr, _ = self._adapters.pop(oldest)
            self._llama_cpp.llama_adapter_lora_free(old_ptr)
        return elapsed

    def use(self, version: int) -> float:
        """Make ``version`` the active policy on the live context; seconds spent."""
        t = time.perf_counter()
        ctx = self.backend.llm._ctx.ctx
        if version == 0:
            rc = self._llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        elif version in self._adapters:
            ptr, _ = self._adapters[version]
            adapters = (self._llama_cpp.llama_adapter_lora_p_ctypes * 1)(ptr)
            scales = (ctypes.c_float * 1)(1.0)
            rc = self._llama_cpp.llama_set_adapters_lora(ctx, adapters, 1, scales)
        else:
            raise KeyError(f"policy version {version} is not loaded (have {self.versions})")
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed ({rc}) for version {version}")
        if version != self.version:  # the cache holds the previous version's states: the
            self.backend.forget_prompt()  # backend's prefill must not reuse them
        self.version = version
        return time.perf_counter() - t

    def model_hash(self) -> bytes:
        """SHA-256 of (base identity, adapter hash) for the active version."""
        sha = self._adapters[self.version][1] if self.version else ""
        return hashlib.sha256(f"{self.backend.identity_hash}:{sha}".encode()).digest()

    def _start(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Logits after ``prompt_ids``. The G completions of a prompt share its prefill: the
        prompt's cache entries are kept (the context's next eval drops everything after
        them), so only the first completion under a version pays for it."""
        key = (self.version, tuple(prompt_ids))
        if self._prompt is not None and self._prompt[0] == key:
            self.backend.llm.n_tokens = len(prompt_ids)
            return self._prompt[1].copy()
        self._prompt = None
        logits = self.backend._start(prompt_ids)
        self._prompt = (key, logits.copy())
        return logits

    def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """One completion under the active version; the end-of-turn token is kept; log-probs
        at ``params.temperature`` (the model's own at temperature 0, i.e. greedy)."""
        rng = np.random.Generator(np.random.PCG64(params.seed))
        logits = self._start(prompt_ids)
        ids: list[int] = []
        lps: list[float] = []
        finished = False
        tempered = params.temperature if params.temperature > 0 else 1.0
        plain = params.temperature > 0 and params.top_p >= 1.0 and params.top_k == 0
        for i in range(params.max_tokens):
            lp_t = log_softmax(logits / tempered) if tempered != 1.0 else log_softmax(logits)
            tok = _draw(lp_t, rng) if plain else choose_token(log_softmax(logits), params, rng)
            ids.append(tok)
            lps.append(max(float(lp_t[tok]), -1000.0))  # the wire's floor (MIN_LOGPROB)
            if tok in self.backend.eos_ids:
                finished = True
                break
            if i + 1 < params.max_tokens:
                logits = self.backend._step(tok)
        return Completion(token_ids=tuple(ids), logprobs=tuple(lps), finished=finished,
                          fingerprint=self._fingerprint(prompt_ids, ids))

    def _fingerprint(self, prompt_ids: Sequence[int], ids: list[int]) -> bytes:
        """The completion's fingerprint (models/fingerprint.py's blob over all its tokens)
        from the final-norm states llama.cpp computed while generating it: the state at each
        token's own position (the last token is evaluated for it). The learner recomputes
        the same states under the job's version and compares (models/rl/checks.py)."""
        full = [*prompt_ids, *ids]
        states = self.backend.captured_states(full, copy=False)
        if states is None:
            raise RuntimeError("the layer-state capture holds no states of this completion")
        final = states[1][len(prompt_ids):len(full)]
        return encode_chunk(final, DEFAULT_K)

    def generate_group(self, job: RolloutJob, env: Environment, *, worker: str,
                       attempt: int = 0) -> RolloutResultBody:
        """Answer ``job``: ``group_size`` completions of each of its prompts, in order."""
        if job.policy_version != self.version:
            self.use(job.policy_version)
        if job.dataset_size != env.size:
            raise ValueError(f"job names a dataset of {job.dataset_size} prompts, "
                             f"the environment has {env.size}")
        t = time.perf_counter()
        indices = job_prompts(job)
        seed_base = int.from_bytes(hashlib.blake2b(job.job_id, digest_size=8).digest(), "big")
        completions = []
        for p, index in enumerate(indices):
            prompt_ids = self.backend.prompt_ids(env.prompt(index))
            for g in range(job.group_size):
                params = SamplingParams(max_tokens=job.sampling.max_tokens,
                                        temperature=job.sampling.temperature,
                                        top_p=job.sampling.top_p,
                                        seed=(seed_base + p * job.group_size + g) % (1 << 63))
                completions.append(self.sample(prompt_ids, params))
        return RolloutResultBody(
            job_id=job.job_id, attempt=attempt, worker=worker, policy_version=self.version,
            prompt_indices=indices, completions=tuple(completions),
            compute_ms=int((time.perf_counter() - t) * 1000),
            commitment=rollout_commitment(completions), model_hash=self.model_hash())

    def close(self) -> None:
        self.use(0)  # detach every adapter from the context before freeing them
        for ptr, _ in self._adapters.values():
            self._llama_cpp.llama_adapter_lora_free(ptr)
        self._adapters.clear()
        self.backend.close()
