"""Several prompts kept beside the llama.cpp context's own (models.prompt_cache): a prompt that
shares more with an older prompt than with the last one prefills only the rest, with the same
tokens, logprobs and layer states as a fresh context's; the least recently used entries go
first beyond the entry and byte bounds; entries are found only under the weights they were
saved with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from models.backend import SamplingParams  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.prompt_cache import PromptCache, shared_prefix  # noqa: E402

STORY = "<|im_start|>user\nhello the world, tell a story<|im_end|>\n<|im_start|>assistant\n"
SONG = STORY.replace("tell a story", "sing a song")
#: shares nothing with STORY but its first token
OTHER = "<|im_start|>system\nbe terse<|im_end|>\n<|im_start|>user\nwhat is 2 + 2?<|im_end|>\n"
PARAMS = SamplingParams(max_tokens=10, temperature=1.0, seed=4, ignore_eos=True)


def backend(path: Path, capture: bool = True, cache_bytes: int = 64 << 20) -> Any:
    from models.llama_backend import LlamaCppBackend
    from models.registry import resolve

    b = LlamaCppBackend(resolve(str(path)), ModelConfig(spec=str(path),
                                                        prompt_cache_bytes=cache_bytes))
    if capture:
        b.enable_state_capture()
    return b


def counting(b: Any) -> list[int]:
    """The token counts of each evaluation on ``b``'s context from now on."""
    evaluated: list[int] = []
    real_eval = b.llm.eval
    b.llm.eval = lambda tokens: (evaluated.append(len(tokens)), real_eval(tokens))[1]
    return evaluated


def test_shared_prefix_never_covers_the_prompts_last_token() -> None:
    assert shared_prefix([1, 2, 3, 4], [1, 2, 3]) == 2
    assert shared_prefix([1, 2, 9], [1, 2, 3, 4]) == 2
    assert shared_prefix([], [1, 2]) == 0 and shared_prefix([5], [1, 2]) == 0


@pytest.mark.parametrize("capture", [True, False])
def test_an_older_prompt_is_restored_with_the_same_tokens_logprobs_and_states(
        tiny_ggufs: dict[str, Path], capture: bool) -> None:
    warm, fresh = backend(tiny_ggufs["f32"], capture), backend(tiny_ggufs["f32"], capture, 0)
    story, song, other = (warm.tokenize(p) for p in (STORY, SONG, OTHER))
    assert shared_prefix(other, song) < shared_prefix(story, song) - 5
    warm.generate(STORY, PARAMS)
    warm.generate(OTHER, PARAMS)  # the context now holds OTHER: STORY was saved
    assert warm.prompts.prompts() == [tuple(story)]
    evaluated = counting(warm)
    got, want = warm.generate(SONG, PARAMS), fresh.generate(SONG, PARAMS)
    assert evaluated[0] == len(song) - shared_prefix(story, song)  # only what STORY lacks
    assert warm.prompts.restored == 1
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    if capture:
        assert warm.capture.kept_bytes(9) == warm.capture.kept_rows(9).nbytes > 0
        ids = list(got.prompt_token_ids) + list(got.token_ids)
        for mine, theirs in zip(warm.captured_states(ids), fresh.captured_states(ids),
                                strict=True):
            np.testing.assert_array_equal(mine, theirs)
    # the prompt the restored context held before SONG is no loss: OTHER's stays saved
    assert tuple(other) in warm.prompts.prompts()


def test_a_restored_prompt_goes_on_like_the_one_it_was_saved_from(
        tiny_ggufs: dict[str, Path]) -> None:
    """The same prompt again after another: all but its last token restored, and its whole
    generation (a second one after it too) as without a cache."""
    warm, fresh = backend(tiny_ggufs["f32"]), backend(tiny_ggufs["f32"], cache_bytes=0)
    first = warm.generate(STORY, PARAMS)
    warm.generate(OTHER, PARAMS)
    evaluated = counting(warm)
    again = warm.generate(STORY, PARAMS)
    assert evaluated[0] == 1 and again.token_ids == first.token_ids
    follow = SamplingParams(max_tokens=6, temperature=1.0, seed=9, ignore_eos=True)
    turn = STORY + first.text + "<|im_end|>\n"  # a next turn extends what the context holds
    got, want = warm.generate(turn, follow), fresh.generate(turn, follow)
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)


def test_the_least_recently_used_prompts_go_first_beyond_the_bounds(
        tiny_ggufs: dict[str, Path]) -> None:
    b = backend(tiny_ggufs["f32"])
    prompts = [f"<|im_start|>user\nquestion number {i}: why?<|im_end|>\n" for i in range(5)]
    b.prompts = PromptCache(64 << 20, max_entries=3)
    for p in prompts:
        b.generate(p, PARAMS)
    held = [b.tokenize(p) for p in prompts]
    assert b.prompts.prompts() == [tuple(t) for t in held[1:4]]  # 0 went; 4 is the context's
    b.generate(prompts[1], PARAMS)  # saves 4 (the context's), dropping the oldest but the
    assert b.prompts.restored == 1  # one restored, 1, which is then the newest
    assert b.prompts.prompts() == [tuple(held[3]), tuple(held[4]), tuple(held[1])]
    b.generate(STORY, PARAMS)  # the context's prompt, 1, is held already: only used again
    assert b.prompts.prompts() == [tuple(held[3]), tuple(held[4]), tuple(held[1])]
    one = b.prompts.nbytes // 3
    b.prompts = PromptCache(2 * one + one // 2)  # bytes for two entries of this size
    for p in prompts[:4]:
        b.generate(p, PARAMS)
    assert b.prompts.prompts() == [tuple(t) for t in held[1:3]]
    assert b.prompts.nbytes <= b.prompts.max_bytes
    b.prompts = PromptCache(one // 2)  # no entry fits: none is kept
    b.generate(prompts[0], PARAMS)
    b.generate(prompts[1], PARAMS)
    assert len(b.prompts) == 0 and b.prompts.nbytes == 0


def test_entries_are_found_only_under_the_weights_they_were_saved_with(
        tiny_ggufs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")
    from tests.models import rl_tiny

    policy = rl_tiny.make_policy(tiny_ggufs["f32"])
    rl_tiny.perturb(policy, scale=0.5)
    path = rl_tiny.export_adapter(policy, tmp_path, version=1).path
    b, fresh = backend(tiny_ggufs["f32"]), backend(tiny_ggufs["f32"], cache_bytes=0)
    story, song = b.tokenize(STORY), b.tokenize(SONG)
    b.generate(STORY, PARAMS)
    b.use_adapter(b.load_adapter(str(path)))  # saves STORY, under the base weights
    fresh.use_adapter(fresh.load_adapter(str(path)))
    evaluated = counting(b)
    got, want = b.generate(SONG, PARAMS), fresh.generate(SONG, PARAMS)
    assert evaluated == [len(song)] + [1] * (PARAMS.max_tokens - 1)  # nothing reused
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    b.use_adapter(None)  # saves SONG, under the adapter
    evaluated.clear()
    b.generate(SONG, PARAMS)
    assert evaluated[0] == len(song) - shared_prefix(story, song)  # STORY's base states
    b.forget_prompt()  # another change of the weights: nothing saved is of use
    assert len(b.prompts) == 0
