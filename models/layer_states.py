"""Per-layer hidden-state commitments and single-layer re-checks (the VeriLLM scheme).

Why: re-running a whole prefill (models.fingerprint, TOPLOC) costs a verifier ~2.6 ms per
token on two CPU cores, against ~16 ms per token for llama.cpp to generate: ~0.2 of the
inference, not the small fraction verification must be. So the executor commits to every
layer's output, and a verifier re-runs only a few sampled layers on the committed inputs.

Executor: :func:`layer_states` runs one fp32 prefill over prompt + output and keeps the output
of every decoder layer, ``S[l]`` for l = 1..L, shape (L, T, C) (the residual stream, before the
final norm). It is cut into leaves of ``BLOCK_TOKENS`` positions per layer (:func:`encode_leaf`,
little-endian float32) and committed with one Merkle root; leaf (l, b) sits at index
``(l - 1) * n_blocks + b``.

Verifier, for a check of sampled output chunks with sampled layers (:func:`needed_leaves` lists
what it must fetch, each with a Merkle proof):

* layer 1 at every position: its input is the token embeddings, which the verifier computes
  from the claimed tokens itself, so any altered prompt or output token, anywhere, shows;
* each sampled layer ``l >= 2`` on the committed ``S[l-1]`` of every position up to the end of
  the block holding the last checked token (causal attention needs no later position),
  compared with the committed ``S[l]`` on the blocks holding the checked chunks.

The comparison is on what the layer adds to the residual stream, per position:
``err = ||recomputed - claimed|| / ||claimed - input||`` (L2 over the hidden dimension).
Honest reruns differ by float reordering only (other thread counts, fewer rows): measured
<= 5e-7 on SmolLM2-135M. Weights rounded to bfloat16 give 1.4e-3 to 3.6e-3, another
quantization or model ~1e-1 and up; :data:`MAX_LAYER_ERR` sits between (tests/models pin it).

What it catches: a result from another model, quantization or precision fails every layer,
so every check. A cheater that computes some layers properly and fakes the rest is caught
with the probability that a sampled layer is a faked one; :data:`DEFAULT_SAMPLED_LAYERS`
sets how many are drawn per check (the protocol draws them from the unsteerable seed).
Cost: 1 + sampled layers of L, over at most T positions: ~3/30 of one prefill here, plus
fetching the leaves (``BLOCK_TOKENS * C * 4`` bytes each, 74 KB for SmolLM2-135M).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK_TOKENS = 32
LEAF_VERSION = 1
_HEADER = struct.Struct("<BBHIHH")  # version, reserved, layer, block, positions, hidden size
#: a sampled layer's update must match to this relative L2 error at every compared position
MAX_LAYER_ERR = 1e-4
#: layers (besides layer 1) each check re-runs
DEFAULT_SAMPLED_LAYERS = 2


def n_blocks(total_tokens: int) -> int:
    return -(-total_tokens // BLOCK_TOKENS)


def leaf_index(layer: int, block: int, blocks: int) -> int:
    return (layer - 1) * blocks + block


def leaf_count(layers: int, total_tokens: int) -> int:
    return layers * n_blocks(total_tokens)


def encode_leaf(layer: int, block: int, states: np.ndarray) -> bytes:
    """states: (n, C) float32 outputs of ``layer`` for the positions of ``block``."""
    n, c = states.shape
    return _HEADER.pack(LEAF_VERSION, 0, layer, block, n, c) + np.ascontiguousarray(
        states, dtype="<f4").tobytes()


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


def leaves(states: np.ndarray) -> list[bytes]:
    """All leaves of (L, T, C) layer outputs, in Merkle order."""
    L, T, _ = states.shape
    return [encode_leaf(layer, b, states[layer - 1, b * BLOCK_TOKENS:(b + 1) * BLOCK_TOKENS])
            for layer in range(1, L + 1) for b in range(n_blocks(T))]


# ------------------------------------------------------------------ what a check needs


@dataclass(frozen=True, slots=True)
class CheckPlan:
    total_tokens: int
    compare_blocks: tuple[int, ...]  # blocks holding the checked chunk
    end: int  # positions [0, end) are recomputed for the sampled layers
    layers: tuple[int, ...]  # sampled layers >= 2


def plan_check(prompt_tokens: int, output_tokens: int, chunks: Sequence[int],
               chunk_tokens: int, layers: Sequence[int]) -> CheckPlan:
    """What checking output ``chunks`` (indices of ``chunk_tokens`` tokens) takes."""
    total = prompt_tokens + output_tokens
    blocks: set[int] = set()
    for chunk in chunks:
        first = prompt_tokens + chunk * chunk_tokens
        last = min(total, prompt_tokens + (chunk + 1) * chunk_tokens) - 1
        if not 0 <= first <= last < total:
            raise ValueError(f"chunk {chunk} is not in an output of {output_tokens} tokens")
        blocks |= set(range(first // BLOCK_TOKENS, last // BLOCK_TOKENS + 1))
    if not blocks:
        raise ValueError("a check covers at least one chunk")
    end = min(total, (max(blocks) + 1) * BLOCK_TOKENS)
    return CheckPlan(total, tuple(sorted(blocks)), end,
                     tuple(sorted({la for la in layers if la >= 2})))


def needed_leaves(plan: CheckPlan) -> list[tuple[int, int]]:
    """(layer, block) pairs a verifier fetches: layer 1 everywhere, and per sampled layer l
    the inputs S[l-1] up to ``end`` and the outputs S[l] on the compared blocks."""
    need = {(1, b) for b in range(n_blocks(plan.total_tokens))}
    for layer in plan.layers:
        need |= {(layer - 1, b) for b in range(n_blocks(plan.end))}
        need |= {(layer, b) for b in plan.compare_blocks}
    return sorted(need)


# ------------------------------------------------------------------ the computation


def _torch_parts(backend: Any) -> tuple[Any, Any]:
    model = backend.model
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return base, model.config


def _run_layers(backend: Any, x: Any, layers: Sequence[int]) -> list[Any]:
    """Run decoder layers (1-based) in order on x (1, T, C); return each one's output."""
    import torch
    from transformers.masking_utils import create_causal_mask

    base, config = _torch_parts(backend)
    positions = torch.arange(x.shape[1]).unsqueeze(0)
    mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None,
                              past_key_values=None, position_ids=positions)
    rope = base.rotary_emb(x, position_ids=positions)
    outs = []
    with torch.no_grad():
        for layer in layers:
            x = base.layers[layer - 1](x, attention_mask=mask, position_embeddings=rope,
                                       position_ids=positions)
            outs.append(x)
    return outs


def embeddings(backend: Any, ids: Sequence[int]) -> np.ndarray:
    import torch

    base, _ = _torch_parts(backend)
    with torch.no_grad():
        return base.embed_tokens(torch.tensor([list(ids)], dtype=torch.long))[0].float().numpy()


def num_layers(backend: Any) -> int:
    return int(_torch_parts(backend)[1].num_hidden_layers)


def layer_states(backend: Any, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """One prefill: (every layer's output (L, T, C), final-norm hidden states (T, C))."""
    import torch

    base, _ = _torch_parts(backend)
    x = torch.from_numpy(embeddings(backend, ids))[None]
    outs = _run_layers(backend, x, range(1, num_layers(backend) + 1))
    with torch.no_grad():
        final = base.norm(outs[-1])[0].float().numpy()
    return torch.cat(outs, 0).float().numpy(), final


def recompute_layer(backend: Any, layer: int, inputs: np.ndarray) -> np.ndarray:
    """Layer ``layer``'s output for ``inputs`` (E, C) at positions 0..E-1."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))[None]
    return _run_layers(backend, x, [layer])[0][0].float().numpy()


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

    def rows(layer: int, blocks: Sequence[int]) -> np.ndarray:
        missing = [b for b in blocks if (layer, b) not in fetched]
        if missing:
            raise ValueError(f"layer {layer}: blocks {missing} not fetched")
        return np.concatenate([fetched[(layer, b)] for b in blocks], axis=0)

    def judge(layer: int, got: np.ndarray, claimed: np.ndarray, inputs: np.ndarray) -> LayerCheck:
        if got.shape != claimed.shape:
            return LayerCheck(layer, False, float("inf"), f"layer {layer}: shape "
                              f"{claimed.shape} claimed, {got.shape} recomputed")
        err = update_error(got, claimed, inputs)
        worst = float(err.max(initial=0.0))
        if not worst <= MAX_LAYER_ERR:
            pos = int(err.argmax())
            return LayerCheck(layer, False, worst, f"layer {layer}: update off by {worst:.1e} "
                              f"at position {pos} (tolerance {MAX_LAYER_ERR:.0e})")
        return LayerCheck(layer, True, worst)

    out = []
    emb = embeddings(backend, ids)
    all_blocks = range(n_blocks(plan.total_tokens))
    out.append(judge(1, recompute_layer(backend, 1, emb), rows(1, all_blocks), emb))
    compared = np.concatenate([np.arange(b * BLOCK_TOKENS, min(plan.end, (b + 1) * BLOCK_TOKENS))
                               for b in plan.compare_blocks])
    for layer in plan.layers:
        inputs = rows(layer - 1, range(n_blocks(plan.end)))[:plan.end]
        got = recompute_layer(backend, layer, inputs)[compared]
        claimed = rows(layer, plan.compare_blocks)[:len(compared)]
        out.append(judge(layer, got, claimed, inputs[compared]))
    return out
