"""Drafting while the target verifies (models.lookahead): the lookahead's drafts open the next
draft when the verdict keeps every draft and the bonus is its guess, greedy output stays
plain greedy decoding's, nothing waits for the lookahead, and sampled drafts never use it.
Drafter pools lend loaded drafters out and take them back."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.blocks import LocalTarget, greedy  # noqa: E402
from models.drafters import Draft, DrafterPool  # noqa: E402
from models.lookahead import Drafting  # noqa: E402
from models.speculative import SpeculativeConfig, speculative_generate  # noqa: E402
from protocol.inference.speculative import Rule  # noqa: E402
from tests.models.markov import PROMPT, MarkovTarget, NoisyDrafter  # noqa: E402

#: the longest a test waits for the lookahead's thread (a condition wait, not a sleep)
WAIT_S = 30.0


class CountingDrafter(NoisyDrafter):
    """A NoisyDrafter that counts the tokens it drafts and tells whoever waits."""

    def __init__(self, target: MarkovTarget, noise: float, fail: bool = False) -> None:
        super().__init__(target, noise)
        self.drafted = 0
        self.fail = fail
        self.cond = threading.Condition()

    def draft(self, context: Sequence[int], k: int, rng: random.Random) -> Draft:
        if self.fail:
            raise RuntimeError("the lookahead's drafter broke")
        out = super().draft(context, k, rng)
        with self.cond:
            self.drafted += len(out.tokens)
            self.cond.notify_all()
        return out


class PatientTarget(MarkovTarget):
    """A MarkovTarget whose verification lasts until the lookahead has drafted all it may
    (the bonus guess and as many tokens as were sent): a chain slower than the drafter."""

    def __init__(self, ahead: CountingDrafter) -> None:
        super().__init__()
        self.ahead, self.expected = ahead, 0

    def forward(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        if len(token_ids) > 1 and start > 0:  # a step with drafts: a lookahead of len(ids)
            self.expected += len(token_ids)
            with self.ahead.cond:
                assert self.ahead.cond.wait_for(lambda: self.ahead.drafted >= self.expected,
                                                WAIT_S)
        return super().forward(token_ids, start)


@pytest.mark.parametrize("rule", [Rule.GREEDY, Rule.MARS])
def test_a_held_lookahead_opens_the_next_draft(rule: Rule) -> None:
    plain = speculative_generate(MarkovTarget(), PROMPT, 64)
    base = MarkovTarget()
    ahead = CountingDrafter(base, 1.0)
    target = PatientTarget(ahead)
    drafter = CountingDrafter(base, 1.0)
    config = SpeculativeConfig(rule=rule, k=4, theta=0.8)
    gen = speculative_generate(target, PROMPT, 64, drafter, config, lookahead=ahead)
    alone = speculative_generate(MarkovTarget(), PROMPT, 64, NoisyDrafter(base, 1.0), config)
    if rule is Rule.GREEDY:
        assert gen.tokens == plain.tokens == alone.tokens
    else:  # the same drafts, so MARS keeps the same ones
        assert gen.tokens == alone.tokens
    assert 0 < gen.lookahead_hits < gen.steps and gen.lookahead_tokens == ahead.drafted
    # every held lookahead had drafted the whole next draft (4 tokens; fewer at the budget's
    # end, none after the last step): the loop's drafter drafted the rest only
    assert 0 < drafter.drafted <= gen.drafted - 4 * (gen.lookahead_hits - 2)
    assert target.cache == PROMPT + gen.tokens[:-1]


def test_a_failing_lookahead_leaves_the_loop_drafting_alone() -> None:
    plain = speculative_generate(MarkovTarget(), PROMPT, 40)
    target = MarkovTarget()
    ahead = CountingDrafter(target, 0.3, fail=True)
    gen = speculative_generate(target, PROMPT, 40, NoisyDrafter(target, 0.3),
                               SpeculativeConfig(k=3), lookahead=ahead)
    assert gen.tokens == plain.tokens and gen.lookahead_hits == 0


def test_sampled_drafts_never_use_the_lookahead() -> None:
    target = MarkovTarget()
    ahead = CountingDrafter(target, 0.3)
    config = SpeculativeConfig(rule=Rule.SAMPLING, k=3)
    one = speculative_generate(target, PROMPT, 30, NoisyDrafter(target, 0.3, 1.0), config,
                               seed=5, lookahead=ahead)
    two = speculative_generate(MarkovTarget(), PROMPT, 30, NoisyDrafter(target, 0.3, 1.0),
                               config, seed=5)
    assert one.tokens == two.tokens and ahead.drafted == 0 and one.lookahead_tokens == 0


def test_overlap_off_uses_no_lookahead() -> None:
    target = MarkovTarget()
    ahead = CountingDrafter(target, 0.3)
    speculative_generate(target, PROMPT, 30, NoisyDrafter(target, 0.3),
                         SpeculativeConfig(k=3, overlap=False), lookahead=ahead)
    assert ahead.drafted == 0


def test_drafting_takes_what_the_lookahead_has_and_drafts_the_rest() -> None:
    base = MarkovTarget()
    drafter, ahead = CountingDrafter(base, 0.3), CountingDrafter(base, 0.3)
    drafting = Drafting(drafter, random.Random(0), ahead)
    try:
        context = list(PROMPT)
        first = drafting.next(context, 3)
        drafting.look_ahead([*context, *first.tokens], 3)  # the guess and 3 more
        with ahead.cond:
            assert ahead.cond.wait_for(lambda: ahead.drafted >= 4, WAIT_S)
        guess = NoisyDrafter(base, 0.3).draft([*context, *first.tokens], 4, random.Random(0))
        drafting.settle(first.tokens, (*first.tokens, guess.tokens[0]))
        before = drafter.drafted
        grown = [*context, *first.tokens, guess.tokens[0]]
        nxt = drafting.next(grown, 5)
        assert nxt.tokens[:3] == guess.tokens[1:] and len(nxt.tokens) == 5
        assert drafter.drafted - before == 2  # only what the lookahead had not drafted
        assert drafting.hits == 1
        # a rejection drops the lookahead
        drafting.look_ahead([*grown, *nxt.tokens], 5)
        drafting.settle(nxt.tokens, (nxt.tokens[0], (nxt.tokens[1] + 1) % 12))
        assert drafting.hits == 1
    finally:
        drafting.close()


def test_a_pool_lends_loaded_drafters_and_keeps_a_few(tiny_ggufs: dict[str, Path]) -> None:
    torch.set_num_threads(1)
    pool = DrafterPool(tiny_ggufs["q8"], n_threads=1, keep=1)
    try:
        one, two = pool.take(), pool.take(0.7)
        assert one is not two and two.temperature == 0.7
        pool.give(one)
        pool.give(two)  # beyond keep=1: closed
        again = pool.take(0.0)
        assert again is one and again.temperature == 0.0
        # a drafter lent again drafts as a fresh one does
        reference = greedy(LocalTarget.from_gguf(tiny_ggufs["f32"]), PROMPT, 24)
        gen = speculative_generate(LocalTarget.from_gguf(tiny_ggufs["f32"]), PROMPT, 24, again,
                                   SpeculativeConfig(k=4), lookahead=pool.take())
        assert gen.tokens == reference
        with pytest.raises(ValueError, match="temperature"):
            pool.take(-1.0)
    finally:
        pool.close()
