"""One interface over inference backends (llama.cpp, transformers+torch).

models.llama_backend and models.hf_backend implement it; models.loader.load_backend picks one.

Contract of every :class:`Backend`:
- ``tokenize(text)`` parses special tokens (``<|im_start|>``) and adds no BOS unless the model
  asks for it; ``detokenize(ids)`` is its inverse for generated text.
- ``generate(prompt, params)`` where prompt is a string, chat messages, or token ids, returns
  a :class:`Generation` with the text (exactly ``detokenize(token_ids)``), the token ids, each
  sampled token's logprob under the model (before temperature), and timing. With
  ``params.stop``, generation ends at the token that completes a stop string (the text keeps
  it, so it stays ``detokenize(token_ids)``; the API cuts it where a reply is shown). Sampling is done
  here, in numpy, by :func:`choose_token`, so both backends sample identically.
- ``score(prompt_ids, continuation_ids)`` returns the logprob of each continuation token given
  everything before it, from one prefill.

Determinism: for a fixed seed the sampler's random stream is fixed (``numpy`` PCG64 seeded
with ``params.seed``), and at temperature 0 it is plain argmax. On the same backend, machine,
thread count and library versions, generation is reproducible token for token. Across machines
(other CPU SIMD paths, BLAS, thread counts, GPU) the logits differ in the last float bits, so a
near-tie between two tokens can flip and the continuation diverge; that is why verification
does not replay generation but compares activation fingerprints with tolerances
(models.fingerprint).
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.registry import ModelInfo, identity_hash

#: special tokens chat models end a turn with, when they are not the GGUF's EOS (ChatML,
#: Llama 3, Phi-3, Gemma); a tokenizer that makes one token of one treats it as an end
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
#: Used when a model ships no chat template: ChatML, as SmolLM2 and many small models use.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Gemma's turn format (its vocabulary's ``<start_of_turn>``/``<end_of_turn>``; the reply's
#: role is "model"; no system role: a system message opens the first user turn), for Gemma
#: GGUFs that ship no template (the base models). BOS comes from the tokenizer, not from here.
GEMMA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}\n\n{% endif %}{{ message['content'] }}<end_of_turn>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
#: the chat format of a GGUF architecture when its file ships no template (else ChatML)
ARCHITECTURE_TEMPLATES = {"gemma": GEMMA_TEMPLATE, "gemma2": GEMMA_TEMPLATE,
                          "gemma3": GEMMA_TEMPLATE}

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256  # most tokens to generate
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus sampling mass; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    seed: int = 0  # seeds the sampler's PCG64 stream
    ignore_eos: bool = False  # keep going past end-of-sequence (benchmarks)
    stop: tuple[str, ...] = ()  # end once the generated text holds one of these
    json_schema: str = ""  # a JSON schema every generated text must fit ("" = none); Backend.mask


@dataclass(frozen=True, slots=True)
class Generation:
    text: str  # == detokenize(token_ids)
    token_ids: tuple[int, ...]  # generated tokens (the end-of-sequence token excluded)
    prompt_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # logprob of each generated token, len == len(token_ids)
    finish_reason: str  # "stop" (end of sequence) or "length" (max_tokens reached)
    prompt_ms: float  # time to process the prompt
    generate_ms: float  # time to generate all tokens after the prompt
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / max(self.generate_ms / 1000.0, 1e-9)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits: (V,) -> logprobs (V,), float64 for a stable sum."""
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def choose_token(logprobs: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from logprobs (V,): argmax at temperature 0, else sample."""
    if params.temperature <= 0.0:
        return int(np.argmax(logprobs))
    scaled = logprobs / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(len(order), p=probs)])


@functools.lru_cache(maxsize=16)
def _compiled_template(template: str) -> Any:
    """Compiling a chat template costs ~6 ms: once per template, not once per prompt."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)


def chat_template_of(meta: dict[str, Any]) -> str | None:
    """A GGUF's chat template from its metadata: its own, else its architecture's turn format
    (ARCHITECTURE_TEMPLATES), else None (ChatML, by render_chat)."""
    own = meta.get("tokenizer.chat_template")
    return own or ARCHITECTURE_TEMPLATES.get(str(meta.get("general.architecture", "")))


def render_chat(template: str | None, messages: Sequence[Message], bos: str = "", eos: str = "") -> str:
    """The prompt text for chat messages, through the model's Jinja chat template."""
    return str(_compiled_template(template or CHATML_TEMPLATE).render(
        messages=list(messages), add_generation_prompt=True, bos_token=bos, eos_token=eos))


class Backend(ABC):
    """A loaded model. Not thread-safe: one call at a time (the daemon uses a worker)."""

    kind: str  # "llama.cpp" or "transformers"
    info: ModelInfo
    eos_ids: frozenset[int]
    chat_template: str | None = None
    bos_text: str = ""
    eos_text: str = ""
    _identity: str | None = None

    @property
    def gpu(self) -> int | None:
        """The CUDA device the model's weights are on; None: the CPU (models.device)."""
        return None

    @property
    def identity_hash(self) -> str:
        """BLAKE2b-256 hex of the weights file(s); computed once, lazily."""
        if self._identity is None:
            self._identity = identity_hash(self.info)
        return self._identity

    @abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abstractmethod
    def detokenize(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def _start(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Reset state, prefill the prompt, return the last position's logits (V,)."""

    @abstractmethod
    def _step(self, token: int) -> np.ndarray:
        """Append one token, return the logits (V,) for the next position."""

    @abstractmethod
    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> list[float]:
        """logprob of each continuation token given all tokens before it (one prefill)."""

    def prompt_ids(self, prompt: str | Sequence[Message] | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        items = list(prompt)
        if items and isinstance(items[0], dict):
            return self.tokenize(render_chat(self.chat_template, items, self.bos_text, self.eos_text))
        return [int(t) for t in items]

    def mask(self, json_schema: str) -> Any:
        """A fresh per-generation token mask for ``json_schema`` (``mask(logits)``,
        ``accept(token)``: models/grammar.py), or None where the backend has no grammar
        sampler (then the text is sampled unconstrained, and may not fit the schema)."""
        return None

    def generate(self, prompt: str | Sequence[Message] | Sequence[int],
                 params: SamplingParams = SamplingParams(),
                 on_text: Callable[[str], None] | None = None) -> Generation:
        """Sample up to ``params.max_tokens`` tokens after ``prompt``; ``on_text``, if given,
        is called with the text generated so far after each token (streaming: the same
        tokens and final text as without it)."""
        ids = self.prompt_ids(prompt)
        if not ids:
            raise ValueError("generate: empty prompt")
        grammar = self.mask(params.json_schema) if params.json_schema else None
        decoding = Decoding(self, ids, params, on_text, grammar)
        t0 = time.perf_counter()
        logits = self._start(ids)
        t1 = time.perf_counter()
        while (tok := decoding.feed(logits)) is not None:
            logits = self._step(tok)
        t2 = time.perf_counter()
        return decoding.result((t1 - t0) * 1000.0, (t2 - t1) * 1000.0)


class Decoding:
    """One generation's sampling state, fed the logits of each position: the one copy of the
    sampling rules (seeded PCG64 stream, grammar mask, EOS, stop strings, streaming, the
    token budget) that :meth:`Backend.generate` and models.batched's sequences both follow,
    so a sequence decoded in a batch samples exactly as it would alone."""

    def __init__(self, backend: Backend, ids: Sequence[int], params: SamplingParams,
                 on_text: Callable[[str], None] | None = None, grammar: Any = None) -> None:
        self._detokenize = backend.detokenize
        self._eos_ids = backend.eos_ids
        self.params = params
        self.on_text = on_text
        self.grammar = grammar
        self.prompt_ids = tuple(int(t) for t in ids)
        self.rng = np.random.Generator(np.random.PCG64(params.seed))
        self.out: list[int] = []
        self.logprobs: list[float] = []
        self.finish = "length"
        #: nothing more to sample (a zero budget samples nothing)
        self.done = params.max_tokens <= 0

    def feed(self, logits: np.ndarray) -> int | None:
        """Sample after ``logits`` (V,): the token to evaluate next, or None once finished."""
        if self.done:
            return None
        params = self.params
        lp = log_softmax(logits if self.grammar is None else self.grammar.mask(logits))
        tok = choose_token(lp, params, self.rng)
        if self.grammar is not None:
            self.grammar.accept(tok)
        if tok in self._eos_ids and not params.ignore_eos:
            return self._end("stop")
        self.out.append(tok)
        self.logprobs.append(float(lp[tok]))
        text = self._detokenize(self.out) if params.stop or self.on_text is not None else ""
        if params.stop and _holds_stop(text, params.stop):
            return self._end("stop")
        if self.on_text is not None:
            self.on_text(text)
        if len(self.out) >= params.max_tokens:
            return self._end("length")
        return tok

    def _end(self, finish: str) -> None:
        self.finish, self.done = finish, True
        return None

    def result(self, prompt_ms: float, generate_ms: float) -> Generation:
        return Generation(text=self._detokenize(self.out), token_ids=tuple(self.out),
                          prompt_token_ids=self.prompt_ids, logprobs=tuple(self.logprobs),
                          finish_reason=self.finish, prompt_ms=prompt_ms,
                          generate_ms=generate_ms)


def _holds_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s in text for s in stop)


def measure_throughput(backend: Backend, n_tokens: int = 32, seed: int = 0) -> float:
    """Generated tokens per second for a short, real greedy generation (what the ledger shows)."""
    gen = backend.generate([{"role": "user", "content": "Count from one to twenty in words."}],
                           SamplingParams(max_tokens=n_tokens, seed=seed, ignore_eos=True))
    return gen.tokens_per_s
