"""transformers + torch backend: HF directories, GGUF files (dequantized), or in-memory models.

Runs fp32 on CPU. Needed wherever activations matter: fingerprints (``hidden_states``),
verification by prefill, and later training. Weights from a GGUF are dequantized by
models.gguf_torch; the tokenizer of a GGUF is llama.cpp's own (vocab-only load, fast and
identical to what the llama.cpp backend produces) when llama-cpp-python is installed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from models.backend import END_OF_TURN, Backend, chat_template_of
from models.building import building
from models.config import TRANSFORMERS, ModelConfig
from models.registry import ModelInfo

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub from here


class _LlamaCppTokenizer:
    """The GGUF's tokenizer through llama.cpp (vocab only, no weights loaded)."""

    def __init__(self, path: str) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        import atexit

        atexit.register(self.llm.close)  # its finalizer can fail at interpreter exit
        meta = self.llm.metadata
        self.chat_template = chat_template_of(meta)
        self.add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") in ("true", True)
        self.bos_id, self.eos_id = self.llm.token_bos(), self.llm.token_eos()

    def encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=True))

    def decode(self, ids: Sequence[int], special: bool = False) -> str:
        return self.llm.detokenize([int(t) for t in ids], special=special).decode("utf-8", "replace")


class _HFTokenizer:
    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.chat_template = getattr(tok, "chat_template", None)
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else -1
        self.eos_id = tok.eos_token_id if tok.eos_token_id is not None else -1

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], special: bool = False) -> str:
        return str(self.tok.decode([int(t) for t in ids], skip_special_tokens=not special,
                                   clean_up_tokenization_spaces=False))


class TransformersBackend(Backend):
    kind = TRANSFORMERS

    def __init__(self, model: torch.nn.Module, tokenizer: Any, info: ModelInfo,
                 config: ModelConfig = ModelConfig(backend=TRANSFORMERS)) -> None:
        """Wrap a loaded causal LM; ``tokenizer`` is an HF tokenizer or a _LlamaCppTokenizer."""
        self.model = model.eval()
        self.tok = tokenizer if isinstance(tokenizer, _LlamaCppTokenizer) else _HFTokenizer(tokenizer)
        self.info = info
        self.config = config
        if config.n_threads:
            torch.set_num_threads(config.n_threads)
        self.chat_template = self.tok.chat_template
        eos = {self.tok.eos_id} - {-1}
        for special in END_OF_TURN:
            ids = self.tok.encode(special)
            if ids[:1] == [self.tok.bos_id]:  # a GGUF tokenizer that adds BOS (Gemma's)
                ids = ids[1:]
            if len(ids) == 1:
                eos.add(ids[0])
        self.eos_ids = frozenset(eos)
        self.bos_text = self.tok.decode([self.tok.bos_id], special=True) if self.tok.bos_id >= 0 else ""
        self.eos_text = self.tok.decode([self.tok.eos_id], special=True) if self.tok.eos_id >= 0 else ""
        self._past: Any = None
        self._pos = 0

    @classmethod
    def load(cls, info: ModelInfo, config: ModelConfig = ModelConfig(backend=TRANSFORMERS)) -> TransformersBackend:
        """Build the backend for ``info`` (blocking), one model build at a time in the process
        (models/building.py)."""
        with building():
            return cls._load(info, config)

    @classmethod
    def _load(cls, info: ModelInfo, config: ModelConfig) -> TransformersBackend:
        if info.fmt == "gguf":
            from models.gguf_torch import load_gguf_model

            model, _ = load_gguf_model(info.path)
            try:
                tokenizer: Any = _LlamaCppTokenizer(str(info.path))
            except ImportError:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
            return cls(model, tokenizer, info, config)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32,
                                                     local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(info.path), local_files_only=True)
        return cls(model, tokenizer, info, config)

    @property
    def gpu(self) -> int | None:
        """The CUDA device of the model's weights; None when they are on the CPU."""
        device = next(self.model.parameters()).device
        return (device.index or 0) if device.type == "cuda" else None

    def tokenize(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids)

    @torch.no_grad()
    def _start(self, prompt_ids: Sequence[int]) -> np.ndarray:
        from transformers import DynamicCache

        self._past = DynamicCache()
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # (1, T)
        out = self.model(input_ids=ids, past_key_values=self._past, use_cache=True)
        self._pos = ids.shape[1]
        return out.logits[0, -1].float().numpy()  # (V,)

    @torch.no_grad()
    def _step(self, token: int) -> np.ndarray:
        ids = torch.tensor([[token]], dtype=torch.long)  # (1, 1)
        out = self.model(input_ids=ids, past_key_values=self._past, use_cache=True)
        self._pos += 1
        return out.logits[0, -1].float().numpy()  # (V,)

    @torch.no_grad()
    def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> list[float]:
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], dtype=torch.long)  # (1, T)
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].double()  # (Tc, V)
        lp = torch.log_softmax(logits, dim=-1)
        cont = torch.tensor(list(continuation_ids), dtype=torch.long)
        return lp.gather(1, cont[:, None])[:, 0].tolist()

    @torch.no_grad()
    def hidden_states(self, batch: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Final-layer hidden states (after the final norm) for each sequence: [(T_i, C)].

        Sequences are right-padded into one batch; under causal attention padding at the end
        never influences earlier positions, so each row equals its unbatched prefill up to
        float reordering.
        """
        lengths = [len(s) for s in batch]
        T = max(lengths)
        pad = next(iter(self.eos_ids), 0)
        ids = torch.tensor([list(s) + [pad] * (T - len(s)) for s in batch], dtype=torch.long)  # (B, T)
        mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        h = base(input_ids=ids, attention_mask=mask).last_hidden_state.float()  # (B, T, C)
        return [h[i, :n].numpy() for i, n in enumerate(lengths)]
