"""Several prompts' prefixes for one single-sequence llama.cpp context, bounded in bytes.

A llama.cpp context holds the KV cells of one token sequence, and a prefill evaluates only
what a new prompt does not share with it (models.llama_backend). Alone, that keeps the last
generation's prompt only: a chat arriving after a chain-of-thought task shares just the chat
template's first tokens with it and prefills the rest again. :class:`PromptCache` keeps more:
before a prefill overwrites the context's prompt, that prompt's KV cells are saved
(``llama_state_seq_get_data`` of sequence 0) with the layer states the capture took over them
(models.llama_capture: what a commitment needs at every position, the reused ones included);
a later prompt sharing more with a saved entry than with the context restores the entry
(``llama_state_seq_set_data``) and prefills only the rest. The least recently used entries go
first once the entries pass ``max_entries`` or ``max_bytes``.

Restored cells and states are the bytes the prefill wrote, so a generation after them has the
same tokens, logprobs and layer states as after a fresh prefill (tests/models/
test_prompt_cache.py). The rules are models.batched's for the prefixes its sequences hold:
:func:`shared_prefix` (never the prompt's last token: it is evaluated for its logits), at most
:data:`HELD_PREFIX_TOKENS` prompt tokens kept per entry, and the states of reused positions as
a fresh prefill leaves them (``StateCapture.rewind``).

Entries hold states of the weights applied when they were saved: each carries a ``tag`` (the
backend's LoRA adapter, None for the base model) and is found only under the same tag;
whoever changes the weights in another way clears the cache. Everything here blocks and runs
under the backend's lock (one caller at a time).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from models.llama_capture import StateCapture

#: prompt tokens an entry (and a freed batched sequence, models.batched) keeps: a chat
#: template's opening and a system prompt are far shorter
HELD_PREFIX_TOKENS = 256
#: entries kept at most (their bytes at most: models.config.ModelConfig.prompt_cache_bytes)
DEFAULT_MAX_ENTRIES = 8


def shared_prefix(held: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens of ``prompt`` ``held`` holds, at most all but its last token
    (which is evaluated again for its logits)."""
    n, limit = 0, min(len(held), len(prompt) - 1)
    while n < limit and held[n] == prompt[n]:
        n += 1
    return n


@dataclass(eq=False, slots=True)
class _Entry:
    tokens: tuple[int, ...]
    tag: Hashable
    kv: np.ndarray  # llama_state_seq_get_data's bytes (uint8)
    #: the layer states of ``tokens`` that a reuse keeps ((layers - 1, len(tokens), hidden);
    #: None: saved without a capture)
    rows: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + (self.rows.nbytes if self.rows is not None else 0)


class PromptCache:
    def __init__(self, max_bytes: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_bytes < 0 or max_entries < 0:
            raise ValueError("a prompt cache's bounds must not be negative (0 = off)")
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest use first
        self._next_key = 0
        self.nbytes = 0
        #: entries saved and restored, prompt tokens not evaluated again thanks to them
        self.saved = self.restored = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prompts(self) -> list[tuple[int, ...]]:
        """The tokens of each entry, least recently used first."""
        return [e.tokens for e in self._entries.values()]

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def reuse(self, llm: Any, capture: StateCapture | None, ids: Sequence[int],
              prompt_len: int, keep: int, tag: Hashable) -> int:
        """Before a prefill of ``ids`` on the context ``llm`` (which holds their first
        ``keep`` tokens, and a prompt of ``prompt_len`` tokens) under ``tag``: save its prompt
        (:meth:`save`), and restore the saved entry that shares most with ``ids`` when it
        shares more than ``keep`` (:meth:`restore`). How many leading tokens of ``ids`` the
        context then holds."""
        best = self._best(ids, keep, tag, capture)
        self.save(llm, capture, prompt_len, keep, tag, spare=best)
        return keep if best is None else self.restore(llm, capture, ids, best, keep)

    def save(self, llm: Any, capture: StateCapture | None, prompt_len: int, keep: int,
             tag: Hashable, spare: int | None = None) -> None:
        """Before the context ``llm`` keeps only its first ``keep`` tokens: save the prompt it
        holds (its first ``prompt_len`` tokens, at most :data:`HELD_PREFIX_TOKENS`) as an
        entry under ``tag`` when that loses more than ``keep`` tokens of it, evicting others
        but the entry ``spare``. Cuts the context to that prompt (what it drops is dropped by
        the prefill after anyway)."""
        n = min(prompt_len, int(llm.n_tokens), HELD_PREFIX_TOKENS)
        if n <= keep or self.max_entries == 0:
            return
        tokens = tuple(int(t) for t in llm.input_ids[:n])
        for key, old in self._entries.items():
            if old.tag == tag and old.tokens[:n] == tokens:  # held already
                self._entries.move_to_end(key)
                return
        if capture is not None and not capture.holds(n):
            return  # a reuse of it could not give the commitment its states
        import llama_cpp

        ctx = llm._ctx.ctx
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, n, -1)
        llm.n_tokens = n
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        if size + (capture.kept_bytes(n) if capture is not None else 0) > self.max_bytes:
            return
        kv = np.empty(size, dtype=np.uint8)
        if llama_cpp.llama_state_seq_get_data(ctx, _bytes(kv), size, 0) != size:
            return
        entry = _Entry(tokens, tag, kv, capture.kept_rows(n) if capture is not None else None)
        for key in [k for k, e in self._entries.items()
                    if k != spare and e.tag == tag and tokens[:len(e.tokens)] == e.tokens]:
            self._drop(key)  # a prefix of the new entry: it holds no more than the new one
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.nbytes += entry.nbytes
        self.saved += 1
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            self._drop(next(k for k in self._entries if k != spare))  # the new one at last

    def _best(self, ids: Sequence[int], keep: int, tag: Hashable,
              capture: StateCapture | None) -> int | None:
        """The entry under ``tag`` that shares the most leading tokens with ``ids``, if more
        than ``keep``; with a ``capture``, only one saved with its layer states."""
        best, most = None, keep
        for key, entry in self._entries.items():
            if entry.tag == tag and (capture is None or entry.rows is not None):
                n = shared_prefix(entry.tokens, ids)
                if n > most:
                    best, most = key, n
        return best

    def restore(self, llm: Any, capture: StateCapture | None, ids: Sequence[int], best: int,
                keep: int) -> int:
        """Restore the entry ``best`` into the context ``llm`` (its KV cells, tokens and kept
        layer states); how many leading tokens of ``ids`` it then holds (0 when llama.cpp
        refused the entry: the context is emptied; ``keep`` was what it held before)."""
        import llama_cpp

        entry = self._entries[best]
        most = shared_prefix(entry.tokens, ids)
        self._entries.move_to_end(best)
        ctx = llm._ctx.ctx
        if llama_cpp.llama_state_seq_set_data(ctx, _bytes(entry.kv), entry.kv.size, 0) == 0:
            self._drop(best)  # refused: nothing of sequence 0 can be trusted
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, 0, -1)
            llm.n_tokens = 0
            return 0
        n = len(entry.tokens)
        llm.input_ids[:n] = entry.tokens
        llm.n_tokens = n
        if capture is not None and entry.rows is not None:
            capture.restore_rows(entry.rows)
        self.restored += 1
        self.reused_tokens += most - keep
        return most

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def _bytes(array: np.ndarray) -> Any:
    """``array``'s data as the ``uint8_t *`` llama.cpp's state calls take."""
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
