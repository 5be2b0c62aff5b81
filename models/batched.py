"""Batched decoding on llama.cpp: many generations at once through one model.

:class:`BatchedDecoder` owns a second llama.cpp context on the backend's model (the weights
are shared, not loaded again) with ``n_seq`` sequences, each its own KV cache of ``seq_ctx``
tokens (``kv_unified`` off: a sequence never attends to another's cells). A worker thread
runs the decode loop: each round it puts into one ``llama_batch`` the next token of every
sequence that is generating (one ``seq_id`` per generation) and, with the room left, prompt
tokens of sequences being prefilled, calls ``llama_decode`` once, and hands each sequence
the logits of its last position. Sampling stays per sequence and is the same code as the
single-sequence path (models.backend.Decoding: the seeded PCG64 stream, EOS, stop strings,
``on_text`` streaming), so a greedy sequence decoded here yields the tokens it yields alone.
When a generation ends, its sequence's KV cells are removed and its ``seq_id`` is free for
the next one. :meth:`generate` blocks its caller (an executor's solver thread) until its
generation is done; it takes what models.cot.solve passes to ``Backend.generate``.

What runs here: plain sampled or greedy generations whose prompt plus budget fits
``seq_ctx`` (:meth:`fits`). What does not, and stays on the backend's single-sequence
context (models/solver.py routes it): a JSON-schema grammar (its llama.cpp sampler is bound
to the single context's state), a LoRA adapter (llama.cpp applies adapters per context, so
it would change every sequence in the batch) and the layer-state capture (its callback
records the positions of one sequence; a batched result is committed to by one prefill on
the capturing context instead, models/solver.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.backend import Decoding, Generation, Message, SamplingParams

#: KV cache cells per sequence: prompt plus generated tokens of one batched generation
#: (a longer one goes to the single-sequence path)
DEFAULT_SEQ_CTX = 1_024


class BatchDecodeError(RuntimeError):
    """llama_decode refused a batch (no KV room, or an internal error)."""


@dataclass(eq=False)
class _Sequence:
    """One generation in the decoder: its sampling state and where it stands."""

    decoding: Decoding
    prompt: tuple[int, ...]
    seq_id: int = -1
    fed: int = 0  # prompt tokens already in the KV cache
    next_token: int | None = None  # sampled, to be evaluated in the next round
    started: float = 0.0
    prefilled: float = 0.0
    result: Generation | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @property
    def pos(self) -> int:
        """Position of the next token evaluated for this sequence."""
        return self.fed + len(self.decoding.out) - (1 if self.next_token is not None else 0)


class BatchedDecoder:
    """Decodes up to ``n_seq`` generations of ``backend``'s model at once (thread-safe);
    ``backend`` is a models.llama_backend.LlamaCppBackend, which builds this
    (``batched``: the import runs that way only)."""

    def __init__(self, backend: Any, n_seq: int,
                 seq_ctx: int = DEFAULT_SEQ_CTX) -> None:
        if n_seq < 1:
            raise ValueError(f"n_seq must be >= 1, got {n_seq}")
        lib = backend._llama_cpp
        self._lib = lib
        self.backend = backend
        self.n_seq = n_seq
        self.seq_ctx = min(seq_ctx, backend.llm.n_ctx())
        # the single context's own settings (threads, attention kernels, KV types), so the
        # logits match its; only the sizes differ, and no state capture callback
        params = lib.llama_context_params.from_buffer_copy(backend.llm.context_params)
        params.n_ctx = self.seq_ctx * n_seq
        params.n_seq_max = n_seq
        params.kv_unified = False
        params.n_batch = max(int(params.n_batch), n_seq)
        params.n_ubatch = params.n_batch
        params.cb_eval = lib.ggml_backend_sched_eval_callback()
        params.cb_eval_user_data = None
        self.n_batch = int(params.n_batch)
        self._ctx = lib.llama_init_from_model(backend.llm.model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the batched context")
        self._mem = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._n_vocab = backend.n_vocab
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._free_ids = list(range(n_seq - 1, -1, -1))
        self._closed = False
        #: generations finished here
        self.decoded = 0
        self._thread = threading.Thread(target=self._run, name="batched-decoder", daemon=True)
        self._thread.start()

    # what models.cot.solve uses of a backend
    def detokenize(self, ids: Sequence[int]) -> str:
        return self.backend.detokenize(ids)

    def fits(self, n_prompt: int, params: SamplingParams) -> bool:
        """Whether a generation of ``n_prompt`` prompt tokens can run here (no grammar, and
        prompt plus budget within a sequence's KV cells)."""
        return not params.json_schema and 0 < n_prompt and \
            n_prompt + params.max_tokens <= self.seq_ctx

    def generate(self, prompt: str | Sequence[Message] | Sequence[int],
                 params: SamplingParams,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        """As ``Backend.generate``, decoded in the shared batch; blocks until done.
        ValueError for what :meth:`fits` refuses."""
        ids = self.backend.prompt_ids(prompt)
        if not self.fits(len(ids), params):
            raise ValueError(f"a generation of {len(ids)} + {params.max_tokens} tokens "
                             f"{'with a grammar ' if params.json_schema else ''}does not fit "
                             f"a batched sequence ({self.seq_ctx} tokens)")
        seq = _Sequence(Decoding(self.backend, ids, params, on_text), tuple(ids))
        seq.started = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batched decoder is closed")
            self._waiting.append(seq)
            self._cond.notify()
        seq.finished.wait()
        if seq.error is not None:
            raise seq.error
        assert seq.result is not None  # set with finished unless error is
        return seq.result

    def close(self) -> None:
        """Stop the worker (generations still waiting fail) and free the context."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._lib.llama_batch_free(self._batch)
        self._lib.llama_free(self._ctx)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._active:
                    self._cond.wait()
                if self._closed:
                    for seq in [*self._waiting, *self._active]:
                        self._fail(seq, RuntimeError("the batched decoder closed"))
                    return
                while self._waiting and self._free_ids:
                    seq = self._waiting.popleft()
                    seq.seq_id = self._free_ids.pop()
                    self._active.append(seq)
            try:
                self._round()
            except BatchDecodeError as exc:  # every sequence of the batch fails with it
                for seq in list(self._active):
                    self._fail(seq, exc)

    def _round(self) -> None:
        """One llama_decode: the next token of each generating sequence first (so none
        starves), then prompt chunks of the prefilling ones while the batch has room."""
        lib, batch = self._lib, self._batch
        outputs: list[tuple[_Sequence, int]] = []  # (sequence, its row in the batch)
        n = 0
        for seq in self._active:
            if seq.next_token is not None:
                self._put(n, seq.next_token, seq.pos, seq.seq_id, True)
                outputs.append((seq, n))
                n += 1
        for seq in self._active:
            if seq.fed < len(seq.prompt) and n < self.n_batch:
                take = min(len(seq.prompt) - seq.fed, self.n_batch - n)
                for i in range(take):
                    last = seq.fed + i == len(seq.prompt) - 1
                    self._put(n, seq.prompt[seq.fed + i], seq.fed + i, seq.seq_id, last)
                    if last:
                        outputs.append((seq, n))
                    n += 1
                seq.fed += take
        batch.n_tokens = n
        rc = lib.llama_decode(self._ctx, batch)
        if rc != 0:
            raise BatchDecodeError(f"llama_decode failed ({rc}) on a batch of {n} tokens")
        now = time.perf_counter()
        for seq, row in outputs:
            if seq.next_token is None:
                seq.prefilled = now
            self._advance(seq, row)

    def _put(self, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = logits

    def _advance(self, seq: _Sequence, row: int) -> None:
        """Sample ``seq``'s next token from the logits at ``row``; finish it when done."""
        ptr = self._lib.llama_get_logits_ith(self._ctx, row)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()  # (V,)
        try:
            seq.next_token = seq.decoding.feed(logits)
        except Exception as exc:  # its on_text callback raised: only this sequence fails
            self._fail(seq, exc)
            return
        if seq.next_token is None:
            end = time.perf_counter()
            seq.result = seq.decoding.result((seq.prefilled - seq.started) * 1000.0,
                                             (end - seq.prefilled) * 1000.0)
            self.decoded += 1
            self._release(seq)

    def _fail(self, seq: _Sequence, exc: BaseException) -> None:
        seq.error = exc
        self._release(seq)

    def _release(self, seq: _Sequence) -> None:
        """Drop ``seq``'s KV cells, free its id, wake its caller."""
        with self._cond:
            if seq in self._active:
                self._active.remove(seq)
                self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, -1, -1)
                self._free_ids.append(seq.seq_id)
            elif seq in self._waiting:
                self._waiting.remove(seq)
        seq.finished.set()

