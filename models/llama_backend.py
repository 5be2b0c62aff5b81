"""llama.cpp backend (llama-cpp-python): GGUF files, quantized kernels; the default for serving.

We drive the low-level eval loop and read the last position's logits with
``llama_get_logits_ith`` (the high-level API keeps logits only with ``logits_all=True``, which
costs a vocab-sized matmul per prompt token). ``score`` needs logits at every position, so it
uses a second context created lazily with ``logits_all=True`` (same mmapped weights).

A committing executor calls :meth:`LlamaCppBackend.enable_state_capture` once: from then on
every generation also keeps each decoder layer's output and the final norm's at every
position (models.llama_capture, through llama.cpp's evaluation callback), which
models.commitments commits to without computing anything again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from models.backend import END_OF_TURN, Backend, chat_template_of
from models.config import LLAMA_CPP, ModelConfig, default_threads
from models.prompt_cache import PromptCache, shared_prefix
from models.registry import ModelInfo

if TYPE_CHECKING:
    from models.batched import BatchedDecoder
    from models.llama_capture import StateCapture

# llama.cpp's OpenMP threads spin-wait between kernels by default. On a machine whose cores
# are shared (other daemons, a desktop), spinning threads steal the CPU from the ones doing
# the work, so a prefill slows several-fold; PASSIVE threads sleep instead. Set before
# llama_cpp loads its OpenMP runtime; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def reusable_prefix(llm: Any, ids: Sequence[int]) -> int:
    """How many leading tokens of ``ids`` the llama.cpp context ``llm`` already holds in its
    cache, at most all but the last (evaluated again for its logits)."""
    return shared_prefix(llm.input_ids[:llm.n_tokens].tolist(), ids)


class LlamaCppBackend(Backend):
    kind = LLAMA_CPP

    def __init__(self, info: ModelInfo, config: ModelConfig = ModelConfig()) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.info = info
        self.config = config
        self._kwargs = dict(
            model_path=str(info.path), n_ctx=min(config.n_ctx, info.context_length),
            n_batch=config.n_batch, n_threads=config.n_threads or default_threads(),
            # prompts too: llama-cpp-python's default is every logical CPU, whose barriers
            # stall whenever another job holds a core (prefills here took 1-4 s instead of
            # 0.3, and longest where the state capture splits the graph)
            n_threads_batch=config.n_threads or default_threads(),
            seed=0, verbose=False,
            # offload to the GPU by default when this llama.cpp build can (a CPU build: 0)
            n_gpu_layers=config.n_gpu_layers if llama_cpp.llama_supports_gpu_offload() else 0,
        )
        self.llm = llama_cpp.Llama(**self._kwargs)
        self._scorer: object | None = None
        self.capture: StateCapture | None = None
        self._capture_error = ""
        #: prompts saved beside the one the context holds (models.prompt_cache), and the
        #: length of the last prompt evaluated (what is saved of the context)
        self.prompts = PromptCache(config.prompt_cache_bytes)
        self._prompt_len = 0
        #: the LoRA adapter applied now (None: the base model): what cached prompts are of
        self._adapter: object | None = None
        self.n_vocab = self.llm.n_vocab()
        meta = self.llm.metadata
        self.chat_template = chat_template_of(meta)
        eos = {self.llm.token_eos()}
        # Chat models end a turn with a special token that is not always the GGUF's EOS.
        for special in END_OF_TURN:
            ids = self.llm.tokenize(special.encode(), add_bos=False, special=True)
            if len(ids) == 1:
                eos.add(ids[0])
        self.eos_ids = frozenset(eos)
        self.bos_text = self._piece(self.llm.token_bos())
        self.eos_text = self._piece(self.llm.token_eos())
        self._add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", "false") in ("true", True))

    @property
    def gpu(self) -> int | None:
        """llama.cpp's main GPU when it offloads layers there; None: every layer on the CPU."""
        params = self.llm.model_params
        if params.n_gpu_layers == 0 or not self._llama_cpp.llama_supports_gpu_offload():
            return None
        return int(params.main_gpu)

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", "replace")

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=self._add_bos, special=True))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize([int(t) for t in ids]).decode("utf-8", "replace")

    def _last_logits(self) -> np.ndarray:
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()  # (V,)

    def _start(self, prompt_ids: Sequence[int]) -> np.ndarray:
        if len(prompt_ids) >= self.llm.n_ctx():
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit n_ctx={self.llm.n_ctx()}")
        ids = [int(t) for t in prompt_ids]
        keep = self._cached_prefix(ids)
        keep = self.prompts.reuse(self.llm, self.capture, ids, self._prompt_len, keep,
                                  self._adapter)
        self._prompt_len = len(ids)
        if keep == 0:
            self.llm.reset()
            self.llm._ctx.kv_cache_clear() if hasattr(self.llm._ctx, "kv_cache_clear") else None
        self.llm.n_tokens = keep  # eval() drops the cache beyond n_tokens
        if self.capture is not None:
            self.capture.rewind(keep)
        self.llm.eval(ids[keep:])
        return self._last_logits()

    def forget_prompt(self) -> None:
        """Let the next generation prefill its whole prompt, reusing nothing of the last one's
        (what a benchmark that times a generation against another backend's needs, or a
        change of the weights: the saved prompts go too)."""
        self.llm.n_tokens = 0
        self.prompts.clear()

    def _cached_prefix(self, ids: Sequence[int]) -> int:
        """How many leading tokens of ``ids`` the context's cache already holds from the last
        generation (the shared opening of a chat template, a system prompt, earlier turns),
        which a prefill need not evaluate again (llama-server's prompt cache reuses them
        alike; :attr:`prompts` holds more prompts than this one); at most all but the last token, which is evaluated for its logits. With the
        state capture on, only as many as it holds the states of (models.llama_capture
        ``StateCapture.rewind``)."""
        keep = reusable_prefix(self.llm, ids)
        if self.capture is not None and not self.capture.holds(keep):
            return 0
        return keep

    def _step(self, token: int) -> np.ndarray:
        if self.llm.n_tokens + 1 >= self.llm.n_ctx():
            raise ValueError(f"generation ran past n_ctx={self.llm.n_ctx()}")
        if self.capture is not None:
            self.capture.seek(self.llm.n_tokens)
        self.llm.eval([token])
        return self._last_logits()

    def mask(self, json_schema: str) -> Any:
        """llama.cpp's grammar sampler for ``json_schema`` (models/grammar.py)."""
        from models.grammar import JsonSchemaMask

        return JsonSchemaMask(self.llm, json_schema, self.n_vocab)

    def enable_state_capture(self) -> None:
        """Keep the layer states of every generation from now on (models.llama_capture).
        The context is rebuilt with the capture callback (the weights stay mapped); raises
        models.llama_capture.CaptureUnavailable when the callback cannot be built here."""
        if self.capture is not None:
            return
        import contextlib

        from models.llama_capture import CaptureUnavailable, StateCapture

        if self._capture_error:
            raise CaptureUnavailable(self._capture_error)
        model = self.llm._model
        layers = int(self._llama_cpp.llama_model_n_layer(model.model))
        try:
            capture = StateCapture(layers, model.n_embd(), self.llm.n_ctx())
        except CaptureUnavailable as exc:  # not tried again: every solve would rebuild it
            self._capture_error = str(exc)
            raise
        params = self.llm.context_params
        params.cb_eval, params.cb_eval_user_data = capture.callback, capture.user_data
        old = self.llm._ctx
        ctx = self._llama_cpp._internals.LlamaContext(model=model, params=params, verbose=False)
        old.close()
        self.llm._ctx = self.llm._stack.enter_context(contextlib.closing(ctx))
        self.llm.n_tokens = 0
        self.prompts.clear()  # saved without the states a commitment needs
        capture.on = True
        self.capture = capture

    def captured_states(self, ids: Sequence[int], copy: bool = True,
                        ) -> tuple[np.ndarray, np.ndarray] | None:
        """(layer outputs (L, T, C), final-norm states (T, C)) of ``ids`` from the last
        generation, when it was over exactly these tokens; the last token, which a generation
        cut at its length never evaluates, is evaluated here. None: nothing captured.
        ``copy=False``: views valid until the next generation (no 70 KB-per-token copy)."""
        capture, llm = self.capture, self.llm
        done = llm.n_tokens
        if capture is None or not 0 < done <= len(ids) or done < len(ids) - 1:
            return None
        if list(llm.input_ids[:done]) != [int(t) for t in ids[:done]]:
            return None
        if done < len(ids):
            self._step(int(ids[-1]))
        try:
            return capture.states(len(ids), copy)
        except ValueError:
            return None

    def replay(self, ids: Sequence[int]) -> None:
        """Evaluate ``ids`` on this (the capturing) context so that :meth:`captured_states`
        reads their states: how a generation decoded elsewhere (models.batched) is
        committed to, by one prefill instead of the decode that produced it."""
        if len(ids) > 1:
            self._start(ids[:-1])

    def batched(self, n_seq: int) -> BatchedDecoder:
        """A decoder of up to ``n_seq`` generations at once on this model (models.batched)."""
        from models.batched import BatchedDecoder

        return BatchedDecoder(self, n_seq)

    def load_adapter(self, path: str) -> object:
        """Load a llama.cpp LoRA GGUF beside the base weights (blocking); its handle for
        :meth:`use_adapter`. ValueError when llama.cpp refuses the file (not a LoRA GGUF, or
        made for another base model); llama.cpp frees a model's adapters with the model."""
        ptr = self._llama_cpp.llama_adapter_lora_init(self.llm.model, str(path).encode())
        if not ptr:
            raise ValueError(f"llama.cpp refused the LoRA adapter {path} (not a LoRA GGUF, "
                             "or made for another base model)")
        return ptr

    def use_adapter(self, adapter: object | None) -> None:
        """Apply ``adapter`` (a :meth:`load_adapter` handle) at scale 1 to every generation
        from now on, or none (None: the base model)."""
        import ctypes

        ctx = self.llm._ctx.ctx
        # the context holds the states of the weights before the switch: saved under them
        self.prompts.save(self.llm, self.capture, self._prompt_len, 0, self._adapter)
        self.llm.n_tokens = 0
        self._adapter = adapter
        if adapter is None:
            rc = self._llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            handles = (self._llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
            rc = self._llama_cpp.llama_set_adapters_lora(ctx, handles, 1,
                                                          (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed ({rc})")

    def close(self) -> None:
        """Free the llama.cpp contexts now (their finalizers can fail at interpreter exit)."""
        for llm in (self._scorer, self.llm):
            if llm is not None:
                llm.close()  # type: ignore[attr-defined]
        self._scorer = None

    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> list[float]:
        if self._scorer is None:
            self._scorer = self._llama_cpp.Llama(**self._kwargs, logits_all=True)
        scorer = self._scorer
        ids = [int(t) for t in prompt_ids] + [int(t) for t in continuation_ids]
        scorer.reset()  # type: ignore[attr-defined]
        scorer.eval(ids)  # type: ignore[attr-defined]
        n = len(prompt_ids)
        rows = np.asarray(scorer.scores[n - 1:len(ids) - 1], dtype=np.float64)  # type: ignore[attr-defined]
        rows = rows - rows.max(axis=1, keepdims=True)
        lp = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))  # (T_cont, V)
        return [float(lp[i, t]) for i, t in enumerate(continuation_ids)]
