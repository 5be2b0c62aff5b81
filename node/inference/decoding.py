"""How a chain generation picks its tokens and when it ends (node/inference/requester.py
decodes by it; node/market/chain_task.py builds it from an ask). Standard library only, so the
tasks service can check an ask without loading torch.

:class:`Decoding`: temperature 0 is greedy decoding (drafts verified greedily, the output
plain greedy decoding's; or by MARS, faster and not exact); temperature > 0 samples from
softmax(logits / T) cut to the ``top_p`` nucleus, seeded, and drafts are verified by
speculative rejection sampling (the output is distributed as plain sampling's).
:func:`stop_length` is where a stop string ends the generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: the most tokens one chain generation makes
MAX_TOKENS = 4096
#: the longest draft a step may make
MAX_DRAFT = 16
#: the highest sampling temperature
MAX_TEMPERATURE = 2.0

#: called from the decoding thread with the text so far and its token count; True stops it
OnText = Callable[[str, int], bool]


@dataclass(frozen=True, slots=True)
class Decoding:
    """How a chain generation picks its tokens, and when it ends."""

    max_tokens: int = 64  # most tokens to generate
    temperature: float = 0.0  # 0: greedy; above: seeded sampling
    top_p: float = 1.0  # sampling's nucleus mass (1 = off)
    seed: int = 0  # seeds sampling and sampled drafts
    speculative: int = 0  # the longest draft a step makes (0: plain decoding)
    rule: str = "greedy"  # with temperature 0: "greedy" (exact) or "mars" verification
    stop: tuple[str, ...] = ()  # end once the generated text holds one of these

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= MAX_TOKENS:
            raise ValueError(f"max_tokens must be within 1..{MAX_TOKENS}, got {self.max_tokens}")
        if not 0 <= self.speculative <= MAX_DRAFT:
            raise ValueError(f"speculative must be within 0..{MAX_DRAFT}, got {self.speculative}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be within 0..{MAX_TEMPERATURE}, "
                             f"got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be within (0, 1], got {self.top_p}")
        if self.rule not in ("greedy", "mars"):
            raise ValueError(f"rule must be 'greedy' or 'mars', got {self.rule!r}")
        if self.rule == "mars" and self.temperature > 0.0:
            raise ValueError("rule 'mars' relaxes greedy verification: with temperature > 0 "
                             "drafts are verified by rejection sampling")


def stop_length(tokens: Sequence[int], stops: Sequence[str],
                detokenize: Callable[[Sequence[int]], str]) -> int | None:
    """The fewest leading ``tokens`` whose text holds a stop string (None: none does)."""
    if not stops or not any(s in detokenize(tokens) for s in stops):
        return None
    n = len(tokens)
    while n > 1 and any(s in detokenize(tokens[:n - 1]) for s in stops):
        n -= 1
    return n
