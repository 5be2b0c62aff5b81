"""Layer states taken from llama.cpp's own generation, for the executor's commitment.

llama.cpp calls a context's evaluation callback (``cb_eval``, ggml's
``ggml_backend_sched_eval_callback``) once per graph node to ask whether the caller wants that
tensor, and again with the tensor computed when it does. We want two kinds of node: each
decoder layer's output ``l_out-<i>`` (the residual stream, which models.layer_states commits
to) and ``result_norm`` (the final norm's output, which the fingerprints sample). A Python
callback would run ~1,100 times per generated token on SmolLM2-135M (every node is asked),
~2 us each: ~10% of the generation. So the callback is a few lines of C, compiled once with
the system compiler (the one that builds llama.cpp) into a cache folder and loaded with
ctypes: it compares the node's name, and for a wanted node copies its rows into a numpy buffer
of shape (layers + 1, capacity, hidden) with ``ggml_backend_tensor_get`` (any backend: a GPU
tensor is copied to the host). Asking for a node splits the graph there, which costs little
on a CPU.

Row placement: each slot appends the rows it is given in order (a prompt evaluated in batches
and then one token per step). llama.cpp computes the last layer and the final norm only at
the positions whose logits it returns (the batch's last one while prefilling), so a slot given
fewer rows than the slot before it got for the same batch holds them at that batch's last
positions; the other positions of that slot stay zero. models.layer_states never compares
the last layer at a prompt position, so nothing a check needs is missing.

When no compiler or library is found, :func:`load_capture` raises :class:`CaptureUnavailable`
and the executor commits by the fp32 prefill instead (models.commitments).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

C_SOURCE = r"""
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ggml_tensor;
const char * ggml_get_name(const struct ggml_tensor * tensor);
int64_t ggml_nelements(const struct ggml_tensor * tensor);
int64_t ggml_nrows(const struct ggml_tensor * tensor);
size_t ggml_nbytes(const struct ggml_tensor * tensor);
bool ggml_is_contiguous(const struct ggml_tensor * tensor);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset,
                             size_t size);

typedef struct {
    int32_t on;        /* take tensors only while set */
    int32_t error;     /* 0, or the first reason a wanted tensor could not be taken */
    int64_t n_slots;   /* decoder layers + 1 (the final norm) */
    int64_t hidden;
    int64_t capacity;  /* positions per slot */
    float * out;       /* (n_slots, capacity, hidden) */
    int64_t * next;    /* per slot: the position its next row goes to */
} capture_t;

/* The rows of ``t`` when it is a contiguous f32 tensor of whole rows of ``hidden`` floats
   (what both callbacks can copy out), else -1. */
static int64_t f32_rows(const struct ggml_tensor * t, int64_t hidden) {
    int64_t n = ggml_nelements(t), rows = ggml_nrows(t);
    if (ggml_nbytes(t) != (size_t) n * sizeof(float) || !ggml_is_contiguous(t)
            || n != rows * hidden) {
        return -1;
    }
    return rows;
}

static int64_t slot_named(int64_t n_slots, const char * name) {
    if (strncmp(name, "l_out-", 6) == 0) {
        char * end;
        long layer = strtol(name + 6, &end, 10);
        return (*end == '\0' && layer >= 0 && layer < n_slots - 1) ? layer : -1;
    }
    return strcmp(name, "result_norm") == 0 ? n_slots - 1 : -1;
}

static int64_t slot_of(const capture_t * c, const char * name) {
    return slot_named(c->n_slots, name);
}

bool symphony_capture_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    capture_t * c = (capture_t *) user_data;
    if (!c->on) {
        return !ask;
    }
    int64_t slot = slot_of(c, ggml_get_name(t));
    if (ask) {
        return slot >= 0;
    }
    if (slot < 0) {
        return true;
    }
    int64_t rows = f32_rows(t, c->hidden);
    if (rows < 0) {
        c->error = c->error ? c->error : 1;
        return true;
    }
    int64_t start = c->next[slot];
    if (slot > 0 && rows < c->next[slot - 1] - start) {
        start = c->next[slot - 1] - rows;  /* only the batch's last positions computed */
    }
    if (start + rows > c->capacity) {
        c->error = c->error ? c->error : 2;
        return true;
    }
    ggml_backend_tensor_get(t, c->out + (slot * c->capacity + start) * c->hidden, 0,
                            (size_t) (rows * c->hidden) * sizeof(float));
    c->next[slot] = start + rows;
    return true;
}

/* The batched decoder's capture (models.batched): a batch holds rows of several sequences,
   each row's states go to its own sequence's buffer. llama.cpp may split one batch into
   ubatches (one graph each), in batch order; the first layer's output has every row of its
   ubatch, the last layer's and the final norm's only the rows whose logits are read. */
typedef struct {
    int32_t on;
    int32_t error;
    int64_t n_slots;
    int64_t hidden;
    int64_t n_rows;        /* rows of the batch being decoded */
    int64_t row0;          /* the batch row the current ubatch starts at */
    int64_t rows;          /* rows of the current ubatch */
    float ** dst;          /* per batch row: its (slot 0, position) address, or NULL: not kept */
    int64_t * stride;      /* per batch row: floats from one slot of its buffer to the next */
    int64_t * out_rows;    /* the batch rows whose logits are read, in order */
    int64_t * out_before;  /* per batch row (and one past the last): such rows before it */
} batch_capture_t;

bool symphony_batch_capture_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    batch_capture_t * c = (batch_capture_t *) user_data;
    if (!c->on) {
        return !ask;
    }
    int64_t slot = slot_named(c->n_slots, ggml_get_name(t));
    if (ask) {
        return slot >= 0;
    }
    if (slot < 0) {
        return true;
    }
    int64_t rows = f32_rows(t, c->hidden);
    if (rows < 0) {
        c->error = c->error ? c->error : 1;
        return true;
    }
    if (slot == 0) {  /* a new ubatch: the rows after the last one's */
        c->row0 += c->rows;
        c->rows = rows;
    }
    int64_t first = c->row0 + c->rows <= c->n_rows ? c->out_before[c->row0] : -1;
    int64_t outputs = first < 0 ? -1 : c->out_before[c->row0 + c->rows] - first;
    if (first < 0 || (rows != c->rows && rows != outputs)) {
        c->error = c->error ? c->error : 3;
        return true;
    }
    size_t row_bytes = (size_t) c->hidden * sizeof(float);
    for (int64_t j = 0; j < rows; ++j) {
        int64_t r = rows == c->rows ? c->row0 + j : c->out_rows[first + j];
        if (c->dst[r] != NULL) {
            ggml_backend_tensor_get(t, c->dst[r] + slot * c->stride[r], (size_t) j * row_bytes,
                                    row_bytes);
        }
    }
    return true;
}
"""

#: the C helper's error codes
ERRORS = {1: "a wanted tensor is not a contiguous float32 (rows, hidden) array",
          2: "more positions than the context holds",
          3: "a batch's tensors do not match its rows"}


class CaptureUnavailable(RuntimeError):
    """The C callback could not be built or loaded here."""


class _Capture(ctypes.Structure):
    _fields_ = [("on", ctypes.c_int32), ("error", ctypes.c_int32),
                ("n_slots", ctypes.c_int64), ("hidden", ctypes.c_int64),
                ("capacity", ctypes.c_int64), ("out", ctypes.c_void_p),
                ("next", ctypes.c_void_p)]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "symphony"


def _library(lib_dir: Path) -> Path:
    """The compiled callback for the ggml library in ``lib_dir`` (built once, then cached)."""
    key = hashlib.blake2b((C_SOURCE + str(lib_dir)).encode(), digest_size=8).hexdigest()
    target = _cache_dir() / f"llama-capture-{key}.so"
    if target.exists():
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CaptureUnavailable("no C compiler (cc) to build the layer-state callback")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "capture.c", Path(tmp) / "capture.so"
        src.write_text(C_SOURCE)
        proc = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src), f"-L{lib_dir}",
             "-lggml-base", f"-Wl,-rpath,{lib_dir}"], capture_output=True, text=True,
            check=False)
        if proc.returncode != 0:
            raise CaptureUnavailable(f"building the layer-state callback failed: "
                                     f"{proc.stderr.strip()[:300]}")
        os.replace(out, target)
    return target


def _load() -> ctypes.CDLL:
    """The compiled callbacks, for the ggml library that llama_cpp loads."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    try:
        return ctypes.CDLL(str(_library(lib_dir)))
    except OSError as exc:
        raise CaptureUnavailable(f"loading the layer-state callback failed: {exc}") from exc


class StateCapture:
    """The buffer and C callback one llama.cpp context writes its layer states into."""

    def __init__(self, n_layers: int, hidden: int, capacity: int) -> None:
        import llama_cpp

        self._lib = _load()
        self.n_layers, self.hidden, self.capacity = n_layers, hidden, capacity
        # untouched pages of a zeroed buffer cost no memory: only positions written do
        self.buffer = np.zeros((n_layers + 1, capacity, hidden), dtype=np.float32)
        self._next = np.zeros(n_layers + 1, dtype=np.int64)
        self._used = 0
        self._struct = _Capture(0, 0, n_layers + 1, hidden, capacity,
                                self.buffer.ctypes.data, self._next.ctypes.data)
        address = ctypes.cast(self._lib.symphony_capture_eval, ctypes.c_void_p).value
        self.callback: Any = llama_cpp.ggml_backend_sched_eval_callback(address)
        self.user_data = ctypes.cast(ctypes.pointer(self._struct), ctypes.c_void_p)

    @property
    def on(self) -> bool:
        return bool(self._struct.on)

    @on.setter
    def on(self, value: bool) -> None:
        self._struct.on = int(value)

    def reset(self) -> None:
        """Forget what was taken: the next evaluation starts at position 0."""
        self.rewind(0)

    def holds(self, positions: int) -> bool:
        """Whether the rows of positions [0, ``positions``) were all taken (and nothing failed)
        since the last :meth:`reset`: a context may then reuse its cache for them."""
        return not self._struct.error and self.positions() >= positions

    def rewind(self, position: int) -> None:
        """Keep the rows of positions [0, ``position``) and forget the rest, as :meth:`reset`
        and then evaluating those positions in one batch would leave them (the next
        evaluation starts at ``position``): the last layer and the final norm, computed only
        at a batch's last position, hold nothing there. ``rewind(0)`` is :meth:`reset`."""
        used = max(self._used, int(self._next.max()))
        self.buffer[:, position:used] = 0.0
        self.buffer[self.n_layers - 1:, :position] = 0.0
        self._used = position
        self._next[:] = position
        self._struct.error = 0

    def kept_rows(self, positions: int) -> np.ndarray:
        """A copy of what a reuse of positions [0, ``positions``) keeps of their states
        (:meth:`rewind`: every layer's output but the last's), (layers - 1, positions, C)."""
        return self.buffer[:self.n_layers - 1, :positions].copy()

    def kept_bytes(self, positions: int) -> int:
        """The size of :meth:`kept_rows` of ``positions``."""
        return max(0, self.n_layers - 1) * positions * self.hidden * self.buffer.itemsize

    def restore_rows(self, rows: np.ndarray) -> None:
        """Hold ``rows`` (:meth:`kept_rows` of some positions [0, n), taken earlier) as the
        states of positions [0, n) and nothing else, as :meth:`rewind` to n after evaluating
        them would leave them: the next evaluation starts at n."""
        n = rows.shape[1]
        self.rewind(0)
        self.buffer[:self.n_layers - 1, :n] = rows
        self._used = n
        self._next[:] = n

    def seek(self, position: int) -> None:
        """The next evaluation starts at ``position`` (the context's token count: after a
        rollback its rows overwrite what was taken beyond it)."""
        self._used = max(self._used, int(self._next.max()))
        self._next[:] = position

    def positions(self) -> int:
        """Positions whose layer outputs were all taken since :meth:`reset`."""
        return int(self._next[:max(1, self.n_layers - 1)].min())

    def states(self, total: int, copy: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(layer outputs (L, total, C), final-norm states (total, C)) of positions
        [0, total), copied out (``copy=False``: views of the buffer, valid until the next
        evaluation); ValueError when they were not all taken."""
        self._used = max(self._used, int(self._next.max()))
        if self._struct.error:
            raise ValueError(f"layer-state capture: {ERRORS.get(self._struct.error, '?')}")
        if self.positions() < total or self._next[-1] < total:
            raise ValueError(f"layer-state capture holds {self.positions()} positions, "
                             f"{total} asked")
        layers, final = self.buffer[:self.n_layers, :total], self.buffer[self.n_layers, :total]
        return (layers.copy(), final.copy()) if copy else (layers, final)


class _BatchCapture(ctypes.Structure):
    _fields_ = [("on", ctypes.c_int32), ("error", ctypes.c_int32),
                ("n_slots", ctypes.c_int64), ("hidden", ctypes.c_int64),
                ("n_rows", ctypes.c_int64), ("row0", ctypes.c_int64), ("rows", ctypes.c_int64),
                ("dst", ctypes.c_void_p), ("stride", ctypes.c_void_p),
                ("out_rows", ctypes.c_void_p), ("out_before", ctypes.c_void_p)]


class BatchCapture:
    """The C callback of a batched context (models.batched): each row of a batch goes to the
    states buffer of its own sequence, a (layers + 1, capacity, hidden) float32 array made
    by :meth:`buffer`. :meth:`prepare` says, before each ``llama_decode``, where each row
    of the batch goes; :meth:`failure` says after it whether every wanted tensor was taken."""

    def __init__(self, n_layers: int, hidden: int, max_rows: int) -> None:
        import llama_cpp

        self._lib = _load()
        self.n_layers, self.hidden = n_layers, hidden
        self._dst = np.zeros(max_rows, dtype=np.uintp)
        self._stride = np.zeros(max_rows, dtype=np.int64)
        self._out_rows = np.zeros(max_rows, dtype=np.int64)
        self._out_before = np.zeros(max_rows + 1, dtype=np.int64)
        self._struct = _BatchCapture(0, 0, n_layers + 1, hidden, 0, 0, 0,
                                     self._dst.ctypes.data, self._stride.ctypes.data,
                                     self._out_rows.ctypes.data, self._out_before.ctypes.data)
        address = ctypes.cast(self._lib.symphony_batch_capture_eval, ctypes.c_void_p).value
        self.callback: Any = llama_cpp.ggml_backend_sched_eval_callback(address)
        self.user_data = ctypes.cast(ctypes.pointer(self._struct), ctypes.c_void_p)

    def buffer(self, capacity: int) -> np.ndarray:
        """A sequence's states buffer for ``capacity`` positions (untouched pages of a zeroed
        buffer cost no memory: only positions written do)."""
        return np.zeros((self.n_layers + 1, capacity, self.hidden), dtype=np.float32)

    def prepare(self, rows: list[tuple[np.ndarray | None, int, bool]]) -> None:
        """The next batch's rows in order: (its sequence's buffer, or None: not kept; its
        position; whether its logits are read)."""
        n, outputs = len(rows), 0
        for i, (buf, pos, logits) in enumerate(rows):
            if buf is None:
                self._dst[i], self._stride[i] = 0, 0
            else:
                if not 0 <= pos < buf.shape[1]:
                    raise ValueError(f"position {pos} is outside a buffer of {buf.shape[1]}")
                self._dst[i] = buf.ctypes.data + pos * self.hidden * buf.itemsize
                self._stride[i] = buf.shape[1] * self.hidden
            self._out_before[i] = outputs
            if logits:
                self._out_rows[outputs] = i
                outputs += 1
        self._out_before[n] = outputs
        st = self._struct
        st.n_rows, st.row0, st.rows, st.error = n, 0, 0, 0
        st.on = int(any(buf is not None for buf, _, _ in rows))

    def failure(self) -> str:
        """Why the last batch's states were not all taken ("" when they were)."""
        code = self._struct.error
        return ERRORS.get(code, f"error {code}") if code else ""
