"""The loop's ``generate`` function on llama.cpp: one chat turn, sampled under a grammar.

``llama_generate(llm)`` wraps a ``llama_cpp.Llama``: the prompt becomes the user turn of the
model's own chat template (``create_chat_completion``), and a JSON schema, when given, becomes
a GBNF grammar (``LlamaGrammar.from_json_schema``) that every sampled token must fit. Greedy by
default, so a step is reproducible. Grammars are cached by schema (building one parses the
GBNF text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from node.agents.loop import GenerateFn


def llama_generate(llm: Any, *, temperature: float = 0.0, seed: int = 0,
                   lock: AbstractContextManager[Any] | None = None) -> GenerateFn:
    """A ``generate(prompt, json_schema, max_tokens) -> text`` running on ``llm``, holding
    ``lock`` (the owner's, when ``llm`` serves other generations too) while it runs."""
    from llama_cpp import LlamaGrammar

    grammars: dict[str, Any] = {}

    def generate(prompt: str, schema: Mapping[str, Any] | None, max_tokens: int) -> str:
        grammar = None
        if schema is not None:
            key = json.dumps(schema, sort_keys=True)
            if key not in grammars:
                grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
            grammar = grammars[key]
        with lock if lock is not None else nullcontext():
            reply = llm.create_chat_completion(
                messages=[{"role": "user", "content": prompt}], grammar=grammar,
                max_tokens=max_tokens, temperature=temperature, seed=seed)
        return str(reply["choices"][0]["message"]["content"] or "")

    return generate
