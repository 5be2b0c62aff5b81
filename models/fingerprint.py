"""Activation fingerprints (TOPLOC-style) for commitment-based verification.

``fingerprint`` runs one prefill over prompt + generated tokens, takes the final hidden layer
(after the final norm) at every generated position, and for each chunk of ``chunk`` generated
tokens emits one blob holding, per position, the ``k`` entries of largest magnitude.

Blob encoding (little-endian, plain ``bytes``, so protocol/ can Merkle-hash and send it):
    u8  version (= FORMAT_VERSION)
    u8  k
    n * k * u16      hidden-dimension indices, position-major, by decreasing |value|
    n * k * f16      the values at those indices (IEEE half precision)
where n, the positions in this chunk (== chunk, except a shorter last chunk), is the
length's: (size - 2) / (4 k). Size: 2 + 4*n*k bytes; 258 bytes per 32 tokens at the default
k=2, TOPLOC's size (version 1 had a u16 n and k=4: 516 bytes). k=2 was kept by measurement:
the chunk checks' mean error is a mean over n*k entries and the rank test holds per position,
so halving k keeps every adversary of tests/models/test_checks.py and ``symphony bench
verify`` caught; the layer states (models.layer_states) carry the rest of the detection.

``check_fingerprint`` recomputes the hidden states in one prefill that stops at the end of
the last requested chunk (causal attention: later tokens cannot matter), and for each claimed
(index, value) compares against the recomputed value at that index:
    rel_err = |recomputed - claimed| / (|claimed| + VALUE_FLOOR)
A chunk passes when the mean rel_err <= MEAN_REL_TOL, no more than MAX_BAD_FRACTION of entries
exceed BAD_REL_TOL, and every claimed index still has a recomputed magnitude within RANK_SLACK
of the position's k-th largest (claimed entries must really be top-k).

Honest noise (other thread counts, batch shapes, padding, CPU vs CPU) is float reordering in
fp32, ~1e-6 relative, plus f16 rounding of the claimed value, <= 2^-11 relative; another
quantization of the same model moves values by ~1e-2 and another model or altered tokens by
~1. The tolerances sit between (tests/models/test_fingerprint.py pins them). Fingerprints are
defined on the transformers fp32 path from the dequantized weights; an executor serving with
llama.cpp computes them with ``fingerprint_backend(...)`` on the same GGUF, so executor and
verifier run the same computation. GPU verifiers must disable TF32 (fp32 matmuls stay fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.building import building

FORMAT_VERSION = 2
DEFAULT_CHUNK = 32
DEFAULT_K = 2
_HEADER_BYTES = 2
#: Added to |claimed| in the relative error, so near-zero values do not blow it up.
VALUE_FLOOR = 0.05
#: A chunk's mean relative error must stay under this (honest: ~2e-4 from f16 rounding;
#: SmolLM2 with weights merely rounded to bf16: ~2e-3, so this fails it).
MEAN_REL_TOL = 1e-3
#: An entry whose relative error exceeds this is "bad" ...
BAD_REL_TOL = 1e-2
#: ... and at most this fraction of a chunk's entries may be bad.
MAX_BAD_FRACTION = 0.05
#: A claimed index must have |recomputed| >= (1 - RANK_SLACK) * (k-th largest |recomputed|).
RANK_SLACK = 0.05


@dataclass(frozen=True, slots=True)
class ChunkCheck:
    chunk: int  # chunk index
    ok: bool
    mean_rel_err: float
    bad_fraction: float
    rank_failures: int  # claimed indices that are not (nearly) top-k when recomputed
    reason: str  # "" when ok


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool  # every requested chunk passed
    chunks: tuple[ChunkCheck, ...]


def encode_chunk(h: np.ndarray, k: int) -> bytes:
    """h: (n, C) hidden states of one chunk -> blob (see module docstring)."""
    n, C = h.shape
    if not 0 < k <= min(C, 255) or C > 65535 or not 0 < n <= 65535:
        raise ValueError(f"cannot fingerprint: k={k}, hidden size {C}, positions {n}")
    idx = np.argsort(-np.abs(h), axis=1, kind="stable")[:, :k]  # (n, k)
    vals = np.take_along_axis(h, idx, axis=1)  # (n, k)
    return bytes([FORMAT_VERSION, k]) + idx.astype("<u2").tobytes() + vals.astype("<f2").tobytes()


def blob_positions(blob: bytes) -> int:
    """Positions a blob covers (0 when its header or length is malformed)."""
    if len(blob) <= _HEADER_BYTES or blob[0] != FORMAT_VERSION or blob[1] == 0:
        return 0
    n, rest = divmod(len(blob) - _HEADER_BYTES, 4 * blob[1])
    return n if rest == 0 else 0


def decode_chunk(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """blob -> (indices (n, k) int, values (n, k) float32). Raises ValueError on bad input."""
    if len(blob) < _HEADER_BYTES or blob[0] != FORMAT_VERSION or blob[1] == 0:
        raise ValueError("fingerprint blob: bad header")
    k, n = blob[1], blob_positions(blob)
    if n == 0:
        raise ValueError(f"fingerprint blob: {len(blob)} bytes is not 2 + 4*n*{k}")
    idx = np.frombuffer(blob, dtype="<u2", count=n * k, offset=_HEADER_BYTES).reshape(n, k)
    idx = idx.astype(np.int64)
    vals = np.frombuffer(blob, dtype="<f2", count=n * k,
                         offset=_HEADER_BYTES + 2 * n * k).reshape(n, k)
    return idx, vals.astype(np.float32)


def _output_hidden(backend: object, prompt_ids: Sequence[int], output_ids: Sequence[int],
                   upto: int) -> np.ndarray:
    """Hidden states at output positions [0, upto): (upto, C), from one prefill."""
    ids = list(prompt_ids) + list(output_ids[:upto])
    h = backend.hidden_states([ids])[0]  # type: ignore[attr-defined]  # (T, C)
    # The state that *produced* output token j sits at position len(prompt)+j: the token's own
    # position, so a fingerprint covers the token itself and everything before it.
    return h[len(prompt_ids):len(prompt_ids) + upto]


def fingerprint(backend: object, prompt_ids: Sequence[int], output_ids: Sequence[int],
                chunk: int = DEFAULT_CHUNK, k: int = DEFAULT_K) -> list[bytes]:
    """One blob per chunk of ``output_ids`` (the last may be shorter). Needs hidden_states()."""
    if not output_ids:
        return []
    h = _output_hidden(backend, prompt_ids, output_ids, len(output_ids))  # (T_out, C)
    return [encode_chunk(h[s:s + chunk], k) for s in range(0, len(output_ids), chunk)]


def compare_chunk(h: np.ndarray, blob: bytes, chunk_index: int) -> ChunkCheck:
    """Compare recomputed hidden states h (n, C) of one chunk against its claimed blob."""
    try:
        idx, claimed = decode_chunk(blob)
    except ValueError as e:
        return ChunkCheck(chunk_index, False, float("inf"), 1.0, 0, str(e))
    n, k = idx.shape
    if n != h.shape[0] or int(idx.max(initial=0)) >= h.shape[1]:
        return ChunkCheck(chunk_index, False, float("inf"), 1.0, 0,
                          f"blob covers {n} positions / index {int(idx.max(initial=0))}, "
                          f"recomputed {h.shape[0]} x {h.shape[1]}")
    got = np.take_along_axis(h, idx, axis=1)  # (n, k)
    rel = np.abs(got - claimed) / (np.abs(claimed) + VALUE_FLOOR)  # (n, k)
    kth = -np.partition(-np.abs(h), k - 1, axis=1)[:, k - 1:k]  # (n, 1) k-th largest |h|
    rank_failures = int((np.abs(got) < (1.0 - RANK_SLACK) * kth).sum())
    mean, bad = float(rel.mean()), float((rel > BAD_REL_TOL).mean())
    reasons = []
    if not np.isfinite(mean) or mean > MEAN_REL_TOL:
        reasons.append(f"mean rel err {mean:.2e} > {MEAN_REL_TOL:.0e}")
    if bad > MAX_BAD_FRACTION:
        reasons.append(f"{bad:.0%} of entries off by > {BAD_REL_TOL:.0e}")
    if rank_failures:
        reasons.append(f"{rank_failures} claimed indices not in the recomputed top-{k}")
    return ChunkCheck(chunk_index, not reasons, mean, bad, rank_failures, "; ".join(reasons))


def check_fingerprint(backend: object, prompt_ids: Sequence[int], output_ids: Sequence[int],
                      fingerprints: Sequence[bytes], chunks: Sequence[int] | None = None,
                      chunk: int = DEFAULT_CHUNK) -> CheckResult:
    """Verify the requested chunks (default: all) with one prefill up to the last of them."""
    n_chunks = (len(output_ids) + chunk - 1) // chunk
    wanted = sorted(set(range(n_chunks) if chunks is None else chunks))
    if len(fingerprints) != n_chunks or any(not 0 <= c < n_chunks for c in wanted):
        bad = ChunkCheck(-1, False, float("inf"), 1.0, 0,
                         f"{len(fingerprints)} fingerprints for {n_chunks} chunks, asked {wanted}")
        return CheckResult(False, (bad,))
    if not wanted:
        return CheckResult(True, ())
    upto = min(len(output_ids), (wanted[-1] + 1) * chunk)
    h = _output_hidden(backend, prompt_ids, output_ids, upto)  # (upto, C)
    results = tuple(compare_chunk(h[c * chunk:(c + 1) * chunk], fingerprints[c], c) for c in wanted)
    return CheckResult(all(r.ok for r in results), results)


_FINGERPRINTERS: dict[str, object] = {}


def fingerprint_backend(backend: object) -> object:
    """A backend that can compute hidden states for ``backend``'s model: itself when it can,
    else a transformers backend on the same GGUF file (loaded once and cached)."""
    if hasattr(backend, "hidden_states"):
        return backend
    from models.config import TRANSFORMERS, ModelConfig, default_threads
    from models.hf_backend import TransformersBackend

    info = backend.info  # type: ignore[attr-defined]
    key = str(info.path)
    with building():  # a check and the verifier's warm-up may ask at once: one load
        if key not in _FINGERPRINTERS:
            # the serving backend's thread policy: torch's default (every logical CPU) spins
            # its threads against any other load and ran checks many times slower on shared
            # cores
            threads = (getattr(getattr(backend, "config", None), "n_threads", 0)
                       or default_threads())
            _FINGERPRINTERS[key] = TransformersBackend.load(
                info, ModelConfig(backend=TRANSFORMERS, n_threads=threads))
        return _FINGERPRINTERS[key]
