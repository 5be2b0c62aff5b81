"""A Markov-chain target and drafters of known quality over a small vocabulary, for the
speculative-decoding tests (no model needed: the target's distributions are exact)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from models.drafters import Draft, softmax

V = 12


def _logit_table(seed: int, scale: float) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, size=(V, V, V)).astype(np.float32)


class MarkovTarget:
    """Logits depend on the last two tokens; keeps a 'cache' of the tokens it was fed and
    checks the forward/rollback contract as a real target would."""

    def __init__(self, seed: int = 0, scale: float = 2.0) -> None:
        self.table = _logit_table(seed, scale)
        self.cache: list[int] = []
        self.calls: list[int] = []

    @property
    def n_vocab(self) -> int:
        return V

    def forward(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        assert start == len(self.cache), (start, len(self.cache))
        self.cache.extend(int(t) for t in token_ids)
        self.calls.append(len(token_ids))
        return np.stack([self.table[self.cache[i - 1] if i else 0, self.cache[i]]
                         for i in range(start, len(self.cache))])

    def rollback(self, length: int) -> None:
        assert 0 <= length <= len(self.cache)
        del self.cache[length:]


class NoisyDrafter:
    """Drafts from another Markov table close to the target's: right most of the time; with
    ``temperature`` > 0 it samples and returns its distributions."""

    def __init__(self, target: MarkovTarget, noise: float, temperature: float = 0.0) -> None:
        self.table = target.table + _logit_table(99, noise)
        self.temperature = temperature

    def draft(self, context: Sequence[int], k: int, rng: random.Random) -> Draft:
        ctx = list(context)
        tokens, rows = [], []
        for _ in range(k):
            logits = self.table[ctx[-2] if len(ctx) > 1 else 0, ctx[-1]]
            if self.temperature:
                q = softmax(logits, self.temperature)
                token = int(np.searchsorted(np.cumsum(q), rng.random() * q.sum(), side="right"))
                rows.append(q)
            else:
                token = int(np.argmax(logits))
            tokens.append(token)
            ctx.append(token)
        return Draft(tuple(tokens), np.stack(rows) if rows else None)

    def close(self) -> None:
        pass


PROMPT = [1, 5, 3, 7]


#: chi-square critical value for V - 1 = 11 degrees of freedom at significance 0.001
CHI2_CRIT_11 = 31.26
