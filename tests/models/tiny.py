"""Tiny random-weight llama models for fast tests: in memory (transformers) and as GGUF files.

The GGUF gets a 259-token byte-level GPT-2 vocabulary (256 bytes, 3 merges, 3 ChatML specials), so both
llama.cpp and our transformers loader can run it; Q/K rows are permuted the way llama.cpp's
converter does, so both backends compute the same function.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


def byte_tokens() -> list[str]:
    """GPT-2's byte -> printable unicode map, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


MERGES = ["Ġ t", "h e", "Ġ a"]  # llama.cpp insists on at least one merge
VOCAB = byte_tokens() + [m.replace(" ", "") for m in MERGES] + SPECIALS
EOS_ID = VOCAB.index("<|im_end|>")


def tiny_model(seed: int = 0, scale: float = 1.0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(VOCAB), hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         initializer_range=0.1 * scale, eos_token_id=EOS_ID, bos_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norm gains, so the final hidden state has structure
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp converter's Q/K row permutation. w: (n_head * head_dim, C)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: torch.nn.Module, path: Path, quant: str = "F32") -> Path:
    """Write ``model`` as a llama GGUF; quant "F32", "Q8_0" or "Q4_0" (2-D weights only)."""
    import gguf
    from gguf.constants import GGMLQuantizationType as Q

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type({"F32": 0, "Q8_0": 7, "Q4_0": 2}[quant])
    w.add_vocab_size(len(VOCAB))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * (len(VOCAB) - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(VOCAB.index("<|endoftext|>"))
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for name, p in model.state_dict().items():
        arr = p.detach().float().numpy().copy()
        if name in names:
            gname = names[name]
        else:
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{layer[rest]}"
            if rest == "self_attn.q_proj.weight":
                arr = _permute(arr, HEADS)
            elif rest == "self_attn.k_proj.weight":
                arr = _permute(arr, KV_HEADS)
        if quant != "F32" and arr.ndim == 2:
            w.add_tensor(gname, gguf.quants.quantize(arr, Q[quant]), raw_dtype=Q[quant])
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
