"""Drafters for speculative decoding: cheap guesses of the next ``k`` tokens that the target
(the whole model, or a chain of servers) then verifies in one pass.

* :class:`LlamaDrafter` runs a GGUF model in llama.cpp, by default the served model's own Q4_1
  file (SmolLM2-135M: ~14 ms a token on one thread, far below a network round trip through a
  chain). It keeps one llama.cpp context across calls: each call reuses the cached prefix that
  the new context shares with the last one (the kept drafts included) and evaluates only the
  rest. ``temperature == 0`` drafts greedily (deterministic: no distributions returned); above
  0 it samples each draft from softmax(logits / T) and returns those distributions, which
  speculative rejection sampling needs.
* :class:`NgramDrafter` is prompt lookup decoding: it finds the latest earlier occurrence of
  the context's last ``n`` tokens (``max_n`` down to ``min_n``) and proposes what followed it.
  Free to run, deterministic, good on text that repeats its input (code edits, extraction,
  summaries); it proposes nothing when the suffix never occurred before.

A drafter proposes token ids, so it must share the target's tokenizer: :func:`check_pairing`
compares the two GGUFs' tokenizer hashes (models.gguf_reader.tokenizer_hash: vocabulary,
merges, special ids) and refuses a drafter whose ids would mean other text, naming both models.
A LlamaDrafter or DrafterPool given its ``target`` checks this before loading anything.

:class:`DrafterPool` keeps idle LlamaDrafters of one model between generations: loading one
costs more than a short generation's drafting, and one that stays keeps its cache of the last
context, so a prompt seen before is not evaluated again.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from models.config import default_threads


@dataclass(frozen=True, slots=True)
class Draft:
    """Proposed tokens, and the distributions they were drawn from: ``probs`` (len(tokens), V)
    float64, or None when the drafter proposes deterministically."""

    tokens: tuple[int, ...]
    probs: np.ndarray | None = None


EMPTY = Draft(())


class Drafter(Protocol):
    def draft(self, context: Sequence[int], k: int, rng: random.Random) -> Draft:
        """Up to ``k`` tokens that may follow ``context`` (fewer, or none, when it has no
        guess); ``rng`` draws the sampled drafts."""
        ...

    def close(self) -> None: ...


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64 over the last axis."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


class NgramDrafter:
    """Prompt lookup: propose the continuation of the latest earlier match of the context's
    last ``n`` tokens, trying ``n = max_n .. min_n``."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def draft(self, context: Sequence[int], k: int, rng: random.Random) -> Draft:
        ctx = list(context)
        if k <= 0:
            return EMPTY
        for n in range(min(self.max_n, len(ctx) - 1), self.min_n - 1, -1):
            suffix = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):  # latest earlier occurrence first
                if ctx[start:start + n] == suffix:
                    follow = ctx[start + n:start + n + k]
                    return Draft(tuple(follow))
        return EMPTY

    def close(self) -> None:
        """Holds nothing."""


class MismatchedDrafter(ValueError):
    """A drafter whose tokenizer is not its target's; the message names both models."""


def check_pairing(drafter: str | Path | None, target: str | Path | None) -> None:
    """MismatchedDrafter unless the two models (registry names or .gguf paths; None = the
    default model) have the same tokenizer hash; ValueError when either is not a GGUF."""
    from models.gguf_reader import tokenizer_hash
    from models.registry import resolve

    d, t = resolve(str(drafter) if drafter else None), resolve(str(target) if target else None)
    for info in (d, t):
        if info.fmt != "gguf":
            raise ValueError(f"model {info.name!r} is not a GGUF file: no tokenizer hash to "
                             "pair a drafter by")
    if d.path == t.path:
        return
    dh, th = tokenizer_hash(d.path), tokenizer_hash(t.path)
    if dh != th:
        raise MismatchedDrafter(
            f"drafter {d.name!r} ({d.family}, tokenizer {dh[:12]}) does not share the "
            f"tokenizer of target {t.name!r} ({t.family}, tokenizer {th[:12]}): its drafts "
            "would be ids of other text; draft with a model of the target's family")


class LlamaDrafter:
    """Drafts with a GGUF model in llama.cpp (default: the default model's Q4_1 file); given
    its ``target``, only when the two share a tokenizer (:func:`check_pairing`)."""

    def __init__(self, model: str | Path | None = None, *, temperature: float = 0.0,
                 n_threads: int = 0, n_ctx: int = 2048,
                 target: str | Path | None = None) -> None:
        import llama_cpp

        from models.registry import resolve

        if temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        info = resolve(str(model) if model else None)
        if info.fmt != "gguf":
            raise ValueError(f"model {info.name!r} is not a GGUF file: llama.cpp cannot draft with it")
        if target is not None:
            check_pairing(model, target)
        self._llama_cpp = llama_cpp
        self.temperature = temperature
        threads = n_threads or default_threads()
        # n_threads_batch too: llama-cpp-python's default is every logical CPU, and the
        # catch-up after each step is a batch: its spinning barriers stalled drafts many-fold
        # when other processes held a core
        self.llm = llama_cpp.Llama(model_path=str(info.path), n_ctx=min(n_ctx, info.context_length),
                                   n_threads=threads, n_threads_batch=threads, n_batch=256,
                                   seed=0, verbose=False)
        self.n_vocab = int(self.llm.n_vocab())

    def _logits(self) -> np.ndarray:
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()  # (V,)

    def _catch_up(self, context: Sequence[int]) -> np.ndarray:
        """Make the llama.cpp cache hold ``context`` (reusing the prefix it already holds) and
        return the logits after its last token."""
        from models.llama_backend import reusable_prefix

        keep = reusable_prefix(self.llm, context)
        self.llm.n_tokens = keep  # eval() drops the cache beyond n_tokens
        self.llm.eval([int(t) for t in context[keep:]])
        return self._logits()

    def draft(self, context: Sequence[int], k: int, rng: random.Random) -> Draft:
        if not context:
            raise ValueError("cannot draft after an empty context")
        k = min(k, self.llm.n_ctx() - len(context) - 1)
        if k <= 0:
            return EMPTY
        logits = self._catch_up(context)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for i in range(k):
            if self.temperature == 0.0:
                token = int(np.argmax(logits))
            else:
                q = softmax(logits, self.temperature)  # (V,)
                cdf = np.cumsum(q)
                token = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
                token = min(token, self.n_vocab - 1)
                rows.append(q)
            tokens.append(token)
            if i + 1 < k:
                self.llm.eval([token])
                logits = self._logits()
        return Draft(tuple(tokens), np.stack(rows) if rows else None)

    def close(self) -> None:
        self.llm.close()


#: idle drafters a pool keeps (each holds a llama.cpp context, ~50 MB with its cache)
MAX_IDLE_DRAFTERS = 2


class DrafterPool:
    """Idle :class:`LlamaDrafter` s of one model, lent out one generation at a time; given
    the ``target`` they draft for, the pool refuses a drafter model with another tokenizer
    when it is made (:func:`check_pairing`)."""

    def __init__(self, model: str | Path | None = None, *, n_threads: int = 0,
                 keep: int = MAX_IDLE_DRAFTERS, target: str | Path | None = None) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        if target is not None:
            check_pairing(model, target)
        self.model, self.n_threads, self.keep = model, n_threads, keep
        self._idle: list[LlamaDrafter] = []
        self._lock = threading.Lock()

    def take(self, temperature: float = 0.0) -> LlamaDrafter:
        """An idle drafter (the one used last first: its cache is the most recent), or a new
        one, drafting at ``temperature``."""
        if temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        with self._lock:
            drafter = self._idle.pop() if self._idle else None
        if drafter is None:
            return LlamaDrafter(self.model, temperature=temperature, n_threads=self.n_threads)
        drafter.temperature = temperature
        return drafter

    def give(self, drafter: LlamaDrafter) -> None:
        """Back into the pool, or closed when the pool holds ``keep`` already."""
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(drafter)
                return
        drafter.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for drafter in idle:
            drafter.close()
