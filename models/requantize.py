"""A GGUF requantized to another llama.cpp type: the cheaper model a precision-swapping
executor would serve in place of the one it declares (``symphony bench verify``, tests).

llama.cpp's own quantizer (``llama_model_quantize``) dequantizes each weight of the source
and quantizes it again (``allow_requantize``: the source may itself be quantized, as the
shipped Q4_1 is). Every tensor is written in the type asked for (``pure``: not llama.cpp's
mixes, whose "Q2_K" keeps ``ffn_down`` in Q3_K), except where the type cannot hold it:
k-quants (Q3_K, Q2_K) need rows that are a multiple of 256 values, and where a tensor's rows
are not (SmolLM2-135M's 576-wide projections and embeddings) llama.cpp falls back to Q4_0 for
that tensor, so such a file mixes the two. ``BF16`` rounds the dequantized weights to bfloat16
(and llama.cpp then computes in bf16).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

#: the types this module writes, by name -> llama.cpp's ftype constant name
FTYPES = {
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q3_K": "LLAMA_FTYPE_MOSTLY_Q3_K_S",  # with ``pure``: Q3_K wherever it fits
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "BF16": "LLAMA_FTYPE_MOSTLY_BF16",
}


def requantize(source: Path, folder: Path, kind: str) -> Path:
    """``source`` requantized to ``kind`` (a key of :data:`FTYPES`) as
    ``folder/<source stem>-<kind>.gguf``; an existing file there is reused. Written to a
    temporary name and renamed, so a file under the final name is whole."""
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    if kind not in FTYPES:
        raise ValueError(f"unknown quantization {kind!r}; choose from {', '.join(FTYPES)}")
    target = folder / f"{source.stem}-{kind}.gguf"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[kind])
    params.allow_requantize, params.pure = True, True
    with suppress_stdout_stderr(disable=False):  # a line per tensor on stderr otherwise
        failed = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                                ctypes.byref(params))
    if failed:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"requantizing {source} to {kind} failed ({failed})")
    partial.replace(target)
    return target
