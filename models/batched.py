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
When a generation ends, its sequence's KV cells are removed but its prompt's, and its
``seq_id`` is free for the next one, which starts past the longest prefix of its prompt that
some sequence's cells hold (the chat template's opening, shared by every prompt; copied from
another sequence's stream when not its own), as llama-server reuses a slot's last prompt. :meth:`generate` blocks its caller (an executor's solver thread) until its
generation is done; it takes what models.cot.solve passes to ``Backend.generate``.

Rounds. Each round evaluates the next token of every generating sequence in one
``llama_decode``, in the order of their ids, then the prompt chunk of each sequence being
prefilled in a ``llama_decode`` of its own, while the round has room (``n_batch`` tokens). Kept
apart so, the rows of every ubatch llama.cpp cuts a batch into (its KV cache is one stream
per sequence: a ubatch takes sequences of consecutive ids and equal token counts) follow the
batch's own order, which the layer-state capture relies on.

Layer states. A committing executor (models/solver.py) asks :meth:`generate_states` for a
generation's layer states too: every decoder layer's output and the final norm's at every
position, as models.llama_capture.StateCapture takes them on the single context, here by
llama_capture.BatchCapture's callback, which writes each row of a batch into its own
sequence's buffer. A generation cut at its length never evaluates its last token; a kept one
evaluates it in one more round, so the states cover prompt and output. The commitment is
then made from them, with no second pass over the tokens (models.commitments).

What runs here: plain sampled or greedy generations whose prompt plus budget fits
``seq_ctx`` (:meth:`fits`). What does not, and stays on the backend's single-sequence
context (models/solver.py routes it): a JSON-schema grammar (its llama.cpp sampler is bound
to the single context's state) and a LoRA adapter (llama.cpp applies adapters per context,
so it would change every sequence in the batch).
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
from models.prompt_cache import HELD_PREFIX_TOKENS, shared_prefix

#: (every decoder layer's output (L, T, C), the final norm's (T, C)) over prompt + output
States = tuple[np.ndarray, np.ndarray]

#: KV cache cells per sequence: prompt plus generated tokens of one batched generation
#: (a longer one goes to the single-sequence path)
DEFAULT_SEQ_CTX = 1_024
#: free ids that keep their layer states too, the newest ((layers + 1) x hidden floats a
#: token): a prompt on another id copies the prefix from one of these; each id keeps at most
#: HELD_PREFIX_TOKENS of its last prompt (models.prompt_cache: the single context's rule too)
HELD_STATES_IDS = 2


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
    #: its layer states, (layers + 1, prompt + budget, hidden) (None: not kept)
    states: np.ndarray | None = None
    evaluated: int = 0  # positions evaluated so far
    closing: bool = False  # done sampling; its last token is evaluated for the states
    capture_failure: str = ""

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
        self.n_batch = int(params.n_batch)
        #: the layer-state callback (None where it cannot be built: no states kept)
        self._capture = _batch_capture(backend, self.n_batch)
        if self._capture is None:
            params.cb_eval = lib.ggml_backend_sched_eval_callback()
            params.cb_eval_user_data = None
        else:
            params.cb_eval = self._capture.callback
            params.cb_eval_user_data = self._capture.user_data
        self._ctx = lib.llama_init_from_model(backend.llm.model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the batched context")
        self._mem = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._n_vocab = backend.n_vocab
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._free_ids = list(range(n_seq - 1, -1, -1))  # popped lowest first
        #: per free sequence id: the prompt its KV cells still hold, and that prompt's kept
        #: layer states (None: not kept); the next generation on the id reuses their prefix
        self._held: dict[int, tuple[tuple[int, ...], np.ndarray | None]] = {}
        self._closed = False
        #: generations finished here
        self.decoded = 0
        #: prompt tokens not evaluated again: their KV cells were reused (_reuse)
        self.reused = 0
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
        return self._run_one(prompt, params, on_text, False).result  # type: ignore[return-value]

    def generate_states(self, prompt: str | Sequence[Message] | Sequence[int],
                        params: SamplingParams, on_text: Callable[[str], None] | None = None,
                        ) -> tuple[Generation, States | None]:
        """:meth:`generate`, and the generation's layer states over prompt + output (views of
        its own buffer); None where they could not be taken (no callback, or llama.cpp
        computed tensors the callback did not expect)."""
        seq = self._run_one(prompt, params, on_text, self._capture is not None)
        assert seq.result is not None  # _run_one returns finished sequences only
        if seq.states is None or seq.capture_failure:
            return seq.result, None
        total = len(seq.prompt) + len(seq.result.token_ids)
        layers = seq.states.shape[0] - 1
        return seq.result, (seq.states[:layers, :total], seq.states[layers, :total])

    @property
    def keeps_states(self) -> bool:
        """Whether :meth:`generate_states` can take layer states here."""
        return self._capture is not None

    def _run_one(self, prompt: str | Sequence[Message] | Sequence[int],
                 params: SamplingParams, on_text: Callable[[str], None] | None,
                 keep: bool) -> _Sequence:
        ids = self.backend.prompt_ids(prompt)
        if not self.fits(len(ids), params):
            raise ValueError(f"a generation of {len(ids)} + {params.max_tokens} tokens "
                             f"{'with a grammar ' if params.json_schema else ''}does not fit "
                             f"a batched sequence ({self.seq_ctx} tokens)")
        seq = _Sequence(Decoding(self.backend, ids, params, on_text), tuple(ids))
        if keep and self._capture is not None:
            seq.states = self._capture.buffer(len(ids) + max(params.max_tokens, 0))
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
        return seq

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
                    self._free_ids.sort(reverse=True)  # the lowest: ids stay consecutive
                    seq.seq_id = self._free_ids.pop()
                    self._reuse(seq)
                    self._active.append(seq)
            try:
                self._round()
            except BatchDecodeError as exc:  # every sequence of the batch fails with it
                for seq in list(self._active):
                    self._fail(seq, exc)

    def _round(self) -> None:
        """The next token of each generating sequence (first, so none starves), then prompt
        chunks of the prefilling ones while the round has room (the module docstring says
        why in separate ``llama_decode`` calls)."""
        rows = [(seq, seq.next_token, seq.pos, True)
                for seq in sorted(self._active, key=lambda s: s.seq_id)
                if seq.next_token is not None]
        if rows:
            self._decode(rows)  # type: ignore[arg-type]  # next_token is set in each row
        room = self.n_batch - len(rows)
        for seq in list(self._active):
            if seq.fed < len(seq.prompt) and room > 0:
                take = min(len(seq.prompt) - seq.fed, room)
                end = seq.fed + take
                self._decode([(seq, seq.prompt[p], p, p == len(seq.prompt) - 1)
                              for p in range(seq.fed, end)])
                seq.fed = end
                room -= take

    def _decode(self, rows: list[tuple[_Sequence, int, int, bool]]) -> None:
        """One llama_decode of ``rows`` (sequence, token, position, whether its logits are
        read), then each sequence whose logits were read samples its next token."""
        for i, (seq, token, pos, logits) in enumerate(rows):
            self._put(i, token, pos, seq.seq_id, logits)
        self._batch.n_tokens = len(rows)
        if self._capture is not None:
            self._capture.prepare([(seq.states, pos, logits) for seq, _, pos, logits in rows])
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise BatchDecodeError(f"llama_decode failed ({rc}) on a batch of {len(rows)} tokens")
        failure = self._capture.failure() if self._capture is not None else ""
        now = time.perf_counter()
        for i, (seq, _, pos, logits) in enumerate(rows):
            seq.evaluated = pos + 1
            if failure and seq.states is not None:
                seq.capture_failure = failure
            if logits:
                if seq.next_token is None:
                    seq.prefilled = now
                self._advance(seq, i)

    def _put(self, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = logits

    def _advance(self, seq: _Sequence, row: int) -> None:
        """Sample ``seq``'s next token from the logits at ``row``; finish it when done (a
        kept sequence whose last token is not evaluated yet: after one more round)."""
        if seq.closing:  # its last token's states are taken: nothing more to sample
            self._finish(seq)
            return
        ptr = self._lib.llama_get_logits_ith(self._ctx, row)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()  # (V,)
        try:
            seq.next_token = seq.decoding.feed(logits)
        except Exception as exc:  # its on_text callback raised: only this sequence fails
            self._fail(seq, exc)
            return
        if seq.next_token is not None:
            return
        end = time.perf_counter()
        seq.result = seq.decoding.result((seq.prefilled - seq.started) * 1000.0,
                                         (end - seq.prefilled) * 1000.0)
        out = seq.decoding.out
        if seq.states is not None and out and seq.evaluated < len(seq.prompt) + len(out):
            seq.next_token, seq.closing = out[-1], True
            return
        self._finish(seq)

    def _finish(self, seq: _Sequence) -> None:
        self.decoded += 1
        self._release(seq)

    def _fail(self, seq: _Sequence, exc: BaseException) -> None:
        seq.error = exc
        self._release(seq)

    def _release(self, seq: _Sequence) -> None:
        """Drop ``seq``'s KV cells but its prompt's (a finished one's: the next generation
        on its id reuses what it shares with them), free its id, wake its caller."""
        with self._cond:
            if seq in self._active:
                self._active.remove(seq)
                held = seq.prompt[:HELD_PREFIX_TOKENS] if seq.result is not None and \
                    seq.fed == len(seq.prompt) else ()
                self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, len(held), -1)
                states = None if seq.states is None or seq.capture_failure else \
                    seq.states[:, :len(held)].copy()
                self._held[seq.seq_id] = (held, states)
                kept = [i for i, (_, st) in self._held.items() if st is not None]
                for i in kept[:-HELD_STATES_IDS]:  # the oldest first
                    self._held[i] = (self._held[i][0], None)
                self._free_ids.append(seq.seq_id)
            elif seq in self._waiting:
                self._waiting.remove(seq)
        seq.finished.set()

    def _reuse(self, seq: _Sequence) -> None:
        """Start ``seq`` past the longest prompt prefix that its own id's, a free id's or a
        running sequence's KV cells hold (copied to its id's cells), with that prefix's kept
        states; its last prompt token is evaluated: its logits start the sampling."""
        sources = [(i, held, states) for i, (held, states) in self._held.items()]
        sources += [(s.seq_id, s.prompt[:s.fed],
                     None if s.states is None or s.capture_failure else s.states)
                    for s in self._active if s is not seq]
        best, n, prefix = seq.seq_id, 0, None
        for sid, held, states in sources:
            if seq.states is not None and states is None:
                continue  # a prefix without its states is of no use to a kept sequence
            m = shared_prefix(held, seq.prompt)
            if m > n or (m == n and sid == seq.seq_id):
                best, n, prefix = sid, m, states
        self._held.pop(seq.seq_id, None)
        if best != seq.seq_id and n > 0:  # another stream's cells: copied whole, then cut
            self._lib.llama_memory_seq_cp(self._mem, best, seq.seq_id, -1, -1)
        self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, n, -1)
        if seq.states is not None and prefix is not None and n > 0:
            seq.states[:, :n] = prefix[:, :n]  # as a fresh prefill leaves them: no last
            seq.states[-2:, :n] = 0.0  # layer or final norm before the prompt's last token
        seq.fed = seq.evaluated = n
        self.reused += n


def _batch_capture(backend: Any, n_rows: int) -> Any:
    """The layer-state callback of a batched context on ``backend``'s model, or None where
    it cannot be built (models.llama_capture)."""
    from models.llama_capture import BatchCapture, CaptureUnavailable

    model = backend.llm._model
    try:
        return BatchCapture(int(backend._llama_cpp.llama_model_n_layer(model.model)),
                            int(model.n_embd()), n_rows)
    except CaptureUnavailable:
        return None


class StatesRun:
    """What models.cot.solve generates with for a committed result: one generation on the
    decoder, its layer states in ``states`` afterwards (None: not taken)."""

    def __init__(self, decoder: BatchedDecoder) -> None:
        self.decoder = decoder
        self.states: States | None = None

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.decoder.detokenize(ids)

    def generate(self, prompt: str | Sequence[Message] | Sequence[int],
                 params: SamplingParams,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        gen, self.states = self.decoder.generate_states(prompt, params, on_text)
        return gen
