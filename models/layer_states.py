"""Per-layer hidden-state commitments and single-layer re-checks (the VeriLLM scheme).

Why: re-running a whole prefill (models.fingerprint, TOPLOC) costs a verifier ~2.6 ms per
token on two CPU cores, against ~16 ms per token for llama.cpp to generate: ~0.2 of the
inference, not the small fraction verification must be. So the executor commits to every
layer's output, and a verifier re-runs only a few sampled layers on the committed inputs.

Executor: commits to the output of every decoder layer, ``S[l]`` for l = 1..L, shape (L, T, C) (the residual stream, before the
final norm). It is cut into leaves of ``BLOCK_TOKENS`` positions per layer (:func:`encode_leaf`,
little-endian float32) and committed with one Merkle root; leaf (l, b) sits at index
``(l - 1) * n_blocks + b``.

Where the states come from: a llama.cpp executor takes them from its own generation
(models.llama_capture: quantized kernels, no extra computation); any other backend runs one
fp32 prefill here (:func:`layer_states`). The verifier always recomputes in fp32 torch on the
dequantized weights of the same file, on the device those weights are on (CPU or CUDA).

Verifier, for a check of sampled output chunks with sampled layers (:func:`needed_leaves`
lists what it must fetch, each with a Merkle proof):

* layer 1 at every position, prompt and output: its input is the token embeddings, which the
  verifier computes itself from the prompt it rebuilt and the claimed output, so an altered
  token, of the prompt or of the output, shows at its own position;
* each sampled layer ``l >= 2`` on the committed ``S[l-1]`` of every position up to the last
  checked one (causal attention needs no later position), compared with the committed
  ``S[l]`` at the checked chunks' positions.

Only the compared positions run the whole layer (:func:`recompute_layer` with ``rows``); the
others give their keys and values, ~15% of a layer's work.

The comparison is on what the layer adds to the residual stream, per position:
``err = ||recomputed - claimed|| / ||claimed - input||`` (L2 over the hidden dimension), and a
layer passes when every compared position's err is within :data:`MAX_LAYER_ERR` and their
mean within :data:`MEAN_LAYER_ERR`. Measured on SmolLM2-135M Q4_1 (``symphony bench verify``
and six evaluation questions, every layer): fp32 reruns differ by float reordering only
(<= 1e-6); llama.cpp's own states differ from the fp32 rerun by its 8-bit quantization of each
matmul's input and its f16 attention cache: per-position err up to 0.056, a layer's mean up to
0.031. The same weights requantized to Q4_0 (a cheaper model) give means of 0.084 and up at
every layer, Q5_1 0.059 and up (0.11 at most layers); an altered token ~1 at its own position.
Weights merely rounded to bfloat16 (1.3e-3 to 3.6e-3) are below llama.cpp's own noise and no
longer caught. The bounds sit between, twice the honest figures and more.

What it catches: a result from another model or another quantization fails every layer,
so every check. A cheater that computes some layers properly and fakes the rest is caught
with the probability that a sampled layer is a faked one; the protocol draws
``protocol.verification.verifier.LAYERS_PER_CHECK`` of them per check from the unsteerable seed.
Cost: 1 + sampled layers of L, at the compared positions, plus keys and values elsewhere:
well under 1/10 of one prefill, plus fetching the leaves (``BLOCK_TOKENS * C * 4``
bytes each, 74 KB for SmolLM2-135M).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK_TOKENS = 32
LEAF_VERSION = 1
_HEADER = struct.Struct("<BBHIHH")  # version, reserved, layer, block, positions, hidden size
#: a sampled layer's update must match to this relative L2 error at every compared position ...
MAX_LAYER_ERR = 0.25
#: ... and to this on average over them (see the module docstring for the measured figures)
MEAN_LAYER_ERR = 0.06


def n_blocks(total_tokens: int) -> int:
    return -(-total_tokens // BLOCK_TOKENS)


def leaf_index(layer: int, block: int, blocks: int) -> int:
    """Where leaf (layer, block) sits in the Merkle tree of ``blocks`` blocks per layer."""
    return (layer - 1) * blocks + block


def leaf_position(index: int, blocks: int) -> tuple[int, int]:
    """(layer, block) of Merkle leaf ``index``: the inverse of :func:`leaf_index`."""
    return index // blocks + 1, index % blocks


def leaf_header(layer: int, block: int, positions: int, hidden: int) -> bytes:
    """The bytes an encoded leaf starts with; little-endian float32 rows follow."""
    return _HEADER.pack(LEAF_VERSION, 0, layer, block, positions, hidden)


def encode_leaf(layer: int, block: int, states: np.ndarray) -> bytes:
    """states: (n, C) float32 outputs of ``layer`` for the positions of ``block``."""
    n, c = states.shape
    return leaf_header(layer, block, n, c) + np.ascontiguousarray(states, dtype="<f4").tobytes()


def decode_leaf(blob: bytes) -> tuple[int, int, np.ndarray]:
    """blob -> (layer, block, states (n, C) float32). Raises ValueError on bad input."""
    if len(blob) < _HEADER.size:
        raise ValueError("state leaf: shorter than its header")
    version, _, layer, block, n, c = _HEADER.unpack_from(blob)
    if version != LEAF_VERSION or n == 0 or c == 0:
        raise ValueError(f"state leaf: bad header (version {version}, {n} x {c})")
    if len(blob) != _HEADER.size + 4 * n * c:
        raise ValueError(f"state leaf: {len(blob)} bytes for {n} x {c} float32")
    arr = np.frombuffer(blob, dtype="<f4", offset=_HEADER.size).reshape(n, c)
    if not np.isfinite(arr).all():
        raise ValueError("state leaf: non-finite values")
    return layer, block, arr.astype(np.float32)


def blocks_of(states: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """(layer, block) -> that leaf's rows of (L, T, C) layer outputs, in Merkle order."""
    L, T, _ = states.shape
    return {(layer, b): states[layer - 1, b * BLOCK_TOKENS:(b + 1) * BLOCK_TOKENS]
            for layer in range(1, L + 1) for b in range(n_blocks(T))}


# ------------------------------------------------------------------ what a check needs


@dataclass(frozen=True, slots=True)
class CheckPlan:
    total_tokens: int
    prompt_tokens: int
    positions: tuple[int, ...]  # compared for the sampled layers: the checked chunks
    layers: tuple[int, ...]  # sampled layers >= 2

    @property
    def end(self) -> int:
        """Positions [0, end) feed the sampled layers' attention."""
        return self.positions[-1] + 1


def plan_check(prompt_tokens: int, output_tokens: int, chunks: Sequence[int],
               chunk_tokens: int, layers: Sequence[int]) -> CheckPlan:
    """What checking output ``chunks`` (indices of ``chunk_tokens`` tokens) takes."""
    total = prompt_tokens + output_tokens
    positions: set[int] = set()
    for chunk in chunks:
        first = prompt_tokens + chunk * chunk_tokens
        last = min(total, prompt_tokens + (chunk + 1) * chunk_tokens) - 1
        if not 0 <= first <= last < total:
            raise ValueError(f"chunk {chunk} is not in an output of {output_tokens} tokens")
        positions |= set(range(first, last + 1))
    if not positions:
        raise ValueError("a check covers at least one chunk")
    return CheckPlan(total, prompt_tokens, tuple(sorted(positions)),
                     tuple(sorted({la for la in layers if la >= 2})))


def _blocks(positions: Iterable[int]) -> set[int]:
    return {p // BLOCK_TOKENS for p in positions}


def needed_leaves(plan: CheckPlan) -> list[tuple[int, int]]:
    """(layer, block) pairs a verifier fetches: layer 1 everywhere, and per sampled layer l
    the inputs S[l-1] up to ``end`` and the outputs S[l] at the compared positions."""
    need = {(1, b) for b in range(n_blocks(plan.total_tokens))}
    for layer in plan.layers:
        need |= {(layer - 1, b) for b in range(n_blocks(plan.end))}
        need |= {(layer, b) for b in _blocks(plan.positions)}
    return sorted(need)


# ------------------------------------------------------------------ the computation


def _torch_parts(backend: Any) -> tuple[Any, Any]:
    from models.hf_layers import decoder_of

    model = backend.model
    return decoder_of(model), model.config


def _device(backend: Any) -> Any:
    """Where the backend's weights are (the verifier runs there: CPU, or a CUDA device)."""
    return next(backend.model.parameters()).device


def _run_layers(backend: Any, x: Any, layers: Sequence[int]) -> list[Any]:
    """Run decoder layers (1-based) in order on x (1, T, C) at positions 0..T-1, as the
    model's forward does (models.hf_layers); return each one's output."""
    from models.hf_layers import run_layers

    base, config = _torch_parts(backend)
    return run_layers(base.rotary_emb, config, [(la - 1, base.layers[la - 1]) for la in layers],
                      x, 0)


def embeddings(backend: Any, ids: Sequence[int]) -> np.ndarray:
    import torch

    base, _ = _torch_parts(backend)
    with torch.no_grad():
        ids_t = torch.tensor([list(ids)], dtype=torch.long, device=_device(backend))
        return base.embed_tokens(ids_t)[0].float().cpu().numpy()


def num_layers(backend: Any) -> int:
    return int(_torch_parts(backend)[1].num_hidden_layers)


def layer_states(backend: Any, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """One prefill: (every layer's output (L, T, C), final-norm hidden states (T, C))."""
    import torch

    base, _ = _torch_parts(backend)
    x = torch.from_numpy(embeddings(backend, ids))[None].to(_device(backend))
    outs = _run_layers(backend, x, range(1, num_layers(backend) + 1))
    with torch.no_grad():
        final = base.norm(outs[-1])[0].float().cpu().numpy()
    return torch.cat(outs, 0).float().cpu().numpy(), final


def recompute_layer(backend: Any, layer: int, inputs: np.ndarray,
                    rows: Sequence[int] | None = None) -> np.ndarray:
    """Layer ``layer``'s output for ``inputs`` (E, C) at positions 0..E-1: every position, or
    only ``rows`` (ascending). On a Llama layer only the rows' queries, attention and MLP are
    computed and every position still gives its keys and values; any other architecture's
    layer runs whole (its own module: Q/K norms, sliding windows, extra norms) and the rows
    are taken from its output. The result equals the model's own layer up to float
    reordering (tests/models/test_layer_states.py)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))[None]
    x = x.to(_device(backend))
    base, _ = _torch_parts(backend)
    if rows is None or type(base.layers[layer - 1]) is not LlamaDecoderLayer:
        out = _run_layers(backend, x, [layer])[0][0].float().cpu().numpy()
        return out if rows is None else out[list(rows)]
    return _llama_rows(backend, layer, x, rows)


def _llama_rows(backend: Any, layer: int, x: Any, rows: Sequence[int]) -> np.ndarray:
    """A ``LlamaDecoderLayer``'s output at ``rows`` only (see :func:`recompute_layer`)."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    base, config = _torch_parts(backend)
    block = base.layers[layer - 1]
    attn = block.self_attn
    E, R = x.shape[1], len(rows)
    idx = torch.tensor(list(rows), dtype=torch.long, device=x.device)
    positions = torch.arange(E, device=x.device)
    heads, kv_heads, hd = config.num_attention_heads, config.num_key_value_heads, attn.head_dim
    with torch.no_grad():
        cos, sin = base.rotary_emb(x, position_ids=positions[None])
        xn = block.input_layernorm(x)
        q = attn.q_proj(xn[:, idx]).view(1, R, heads, hd).transpose(1, 2)
        k = attn.k_proj(xn).view(1, E, kv_heads, hd).transpose(1, 2)
        v = attn.v_proj(xn).view(1, E, kv_heads, hd).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos[:, idx], sin[:, idx])
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
        allowed = idx[:, None] >= positions[None, :]  # (R, E): causal
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                               scale=attn.scaling)
        h = x[:, idx] + attn.o_proj(out.transpose(1, 2).reshape(1, R, heads * hd))
        y = h + block.mlp(block.post_attention_layernorm(h))
    return y[0].float().cpu().numpy()


def update_error(recomputed: np.ndarray, claimed: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """Per-position relative L2 error of the layer's update (see the module docstring)."""
    scale = np.linalg.norm(claimed - inputs, axis=-1) + 1e-6
    return np.linalg.norm(recomputed - claimed, axis=-1) / scale  # (n,)


@dataclass(frozen=True, slots=True)
class LayerCheck:
    layer: int
    ok: bool
    worst_err: float
    reason: str = ""


def check_layers(backend: Any, ids: Sequence[int], plan: CheckPlan,
                 fetched: Mapping[tuple[int, int], np.ndarray]) -> list[LayerCheck]:
    """Re-run layer 1 and the plan's layers on the fetched (Merkle-checked) leaves."""
    if len(ids) != plan.total_tokens:
        raise ValueError(f"{len(ids)} tokens for a plan over {plan.total_tokens}")

    def rows(layer: int, positions: Sequence[int]) -> np.ndarray:
        missing = sorted({p // BLOCK_TOKENS for p in positions
                          if (layer, p // BLOCK_TOKENS) not in fetched})
        if missing:
            raise ValueError(f"layer {layer}: blocks {missing} not fetched")
        return np.stack([fetched[(layer, p // BLOCK_TOKENS)][p % BLOCK_TOKENS]
                         for p in positions]) if positions else np.zeros((0, 0), np.float32)

    def judge(layer: int, got: np.ndarray, claimed: np.ndarray, inputs: np.ndarray,
              positions: Sequence[int]) -> LayerCheck:
        if got.shape != claimed.shape:
            return LayerCheck(layer, False, float("inf"), f"layer {layer}: shape "
                              f"{claimed.shape} claimed, {got.shape} recomputed")
        err = update_error(got, claimed, inputs)
        worst, mean = float(err.max(initial=0.0)), float(err.mean()) if len(err) else 0.0
        if not worst <= MAX_LAYER_ERR:
            pos = positions[int(err.argmax())]
            return LayerCheck(layer, False, worst, f"layer {layer}: update off by {worst:.1e} "
                              f"at position {pos} (tolerance {MAX_LAYER_ERR:.2g})")
        if not mean <= MEAN_LAYER_ERR:
            return LayerCheck(layer, False, worst, f"layer {layer}: update off by {mean:.1e} "
                              f"on average (tolerance {MEAN_LAYER_ERR:.2g})")
        return LayerCheck(layer, True, worst)

    out = []
    emb = embeddings(backend, ids)
    every = list(range(plan.total_tokens))
    out.append(judge(1, recompute_layer(backend, 1, emb, every), rows(1, every), emb, every))
    compared = list(plan.positions)
    for layer in plan.layers:
        inputs = rows(layer - 1, range(plan.end))
        got = recompute_layer(backend, layer, inputs, compared)
        out.append(judge(layer, got, rows(layer, compared), inputs[compared], compared))
    return out
