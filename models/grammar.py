"""Grammar-constrained sampling on llama.cpp: a JSON schema as a mask over the next token.

``JsonSchemaMask(llm, schema)`` compiles ``schema`` to a GBNF grammar
(``LlamaGrammar.from_json_schema``) and holds llama.cpp's grammar sampler for it. Per step,
:meth:`mask` gives the logits with every token the grammar does not allow next set to -inf
(end-of-sequence included, until the text is complete), and :meth:`accept` advances the
grammar by the token chosen. The sampling itself stays ``models.backend.choose_token``, so a
constrained generation is as reproducible as any other: same prompt, seed and schema, same
tokens. A planner writes its plan this way (models/cot.py, style ``plan``), so the plan always
has the shape ``protocol.agents.plans.parse_plan`` reads.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class JsonSchemaMask:
    """One generation's grammar state over ``llm`` (a ``llama_cpp.Llama``)."""

    def __init__(self, llm: Any, schema: str, n_vocab: int) -> None:
        import llama_cpp
        from llama_cpp import LlamaGrammar
        from llama_cpp._internals import LlamaTokenDataArray

        self._lib = llama_cpp
        grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._sampler = llama_cpp.llama_sampler_init_grammar(
            vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"))
        if not self._sampler:
            raise ValueError("llama.cpp refused the grammar of the JSON schema")
        self._n_vocab = n_vocab
        self._data = LlamaTokenDataArray(n_vocab=n_vocab)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits (V,) -> the same with the tokens the grammar forbids at -inf."""
        self._data.copy_logits(logits.astype(np.float32))
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(self._data.candidates))
        size = int(self._data.candidates.size)
        out = np.full(self._n_vocab, -np.inf, dtype=np.float64)
        ids = self._data.candidates_data.id[:size]
        out[ids] = self._data.candidates_data.logit[:size]
        return out

    def accept(self, token: int) -> None:
        self._lib.llama_sampler_accept(self._sampler, int(token))

    def close(self) -> None:
        if self._sampler:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        self.close()
