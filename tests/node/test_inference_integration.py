"""Layer-sharded inference across real daemons (separate processes, loopback, port 0) serving
blocks of the default model (SmolLM2-135M, 30 blocks): `symphony generate` through a 2-stage
and a 3-stage chain is token-identical to the single-process model over 64 tokens (hidden
states travel as fp16), and a middle server killed with SIGKILL mid-generation is replaced by
replaying its inputs, with the output unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import ROOT, Testnet, run_cli

pytestmark = pytest.mark.integration

TOKENS = 64
#: a prompt the model continues for more than TOKENS tokens (no early end-of-sequence)
PROMPT = "Once upon a time, in a small village by the sea,"
INFERENCE = {"threads": 1}
GENERATE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def reference() -> Any:
    """The single-process model: greedy tokens for prompt ids, stopping at end-of-sequence."""
    pytest.importorskip("torch")
    import torch

    from models.blocks import LocalTarget, greedy
    from models.registry import default_model

    torch.set_num_threads(1)
    path = default_model().path
    eos = _eos(path)

    def run(prompt_ids: list[int]) -> list[int]:
        return greedy(LocalTarget.from_gguf(path), prompt_ids, TOKENS, stop=[eos])

    return run


def _eos(path: Path) -> int:
    from models.gguf_torch import read_gguf

    meta, _ = read_gguf(path)
    return int(meta["tokenizer.ggml.eos_token_id"])


def _offers(node: Any) -> list[list[Any]]:
    return list(httpx.get(node.api_url + "/inference/", timeout=30).json()["offers"])


def _inference(node: Any) -> dict[str, Any]:
    return dict(httpx.get(node.api_url + "/inference/", timeout=30).json())


def _generate(asker: Any, *options: str) -> dict[str, Any]:
    shown = run_cli("generate", PROMPT, "--max-tokens", str(TOKENS), "--json", *options,
                    data_dir=asker.data_dir, timeout_s=GENERATE_TIMEOUT_S)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return dict(json.loads(shown.stdout))


def _server(testnet: Testnet, name: str, blocks: str, asker: Any, wait: bool = False) -> Any:
    return testnet.start(name, bootstrap=[asker], wait=wait, config={"inference": INFERENCE},
                         extra_args=["--serve-blocks", blocks])


def test_chains_of_daemons_match_the_single_process_model(testnet: Testnet,
                                                          reference: Any) -> None:
    asker = testnet.start("asker", config={"inference": INFERENCE})
    first, last = _server(testnet, "x", "0:20", asker), _server(testnet, "c", "20:30", asker)
    for node in (first, last):
        node.wait_ready(120)
    testnet.wait_until(lambda: len(_offers(asker)) == 2, "2 block offers", timeout_s=60)

    two = _generate(asker)
    assert [(h["start"], h["end"]) for h in two["chain"]] == [(0, 20), (20, 30)]
    want = reference(two["prompt_ids"])
    assert len(want) == TOKENS
    assert two["tokens"] == want and two["recoveries"] == 0
    # speculative decoding through the same chain: the llama.cpp Q4_1 drafter, greedy checks
    drafted = _generate(asker, "--speculative", "6")
    assert drafted["tokens"] == want
    assert drafted["acceptance_rate"] > 0.3 and drafted["steps"] < TOKENS / 2

    # three stages: blocks 0-10, 10-20 (twice: the spare takes over below), 20-30; x is gone
    middle = [_server(testnet, n, "10:20", asker) for n in ("b1", "b2")]
    head = _server(testnet, "a", "0:10", asker)
    for node in (*middle, head):
        node.wait_ready(120)
    testnet.wait_until(lambda: len(_offers(asker)) == 5, "5 block offers", timeout_s=60)
    first.kill()
    three = _generate(asker)
    assert [(h["start"], h["end"]) for h in three["final_chain"]] == [(0, 10), (10, 20),
                                                                       (20, 30)]
    assert three["tokens"] == want
    assert _generate(asker, "--speculative", "6")["tokens"] == want

    # kill -9 of the middle server while it generates: replaced, output unchanged
    before = {m.name: _inference(m)["forwards"] for m in middle}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from node.cli.main import main; main()", "generate", PROMPT,
         "--max-tokens", str(TOKENS), "--json", "--data-dir", str(asker.data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        def stepping() -> Any:
            if proc.poll() is not None:
                raise AssertionError(f"generate ended early: {proc.communicate()}")
            return next((m for m in middle if _inference(m)["sessions"]
                         and _inference(m)["forwards"] >= before[m.name] + 12), None)

        busy = testnet.wait_until(stepping, "a middle server 12 steps into a session",
                                  timeout_s=GENERATE_TIMEOUT_S)
        busy.kill()
        out, err = proc.communicate(timeout=GENERATE_TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + err
    healed = json.loads(out)
    assert healed["tokens"] == want
    assert healed["recoveries"] >= 1
    spare = next(m for m in middle if m is not busy)
    assert spare.peer_id in [h["peer"] for h in healed["final_chain"]]
    assert busy.peer_id not in [h["peer"] for h in healed["final_chain"]]
