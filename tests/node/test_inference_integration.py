"""Layer-sharded inference across real daemons (separate processes, loopback, port 0) serving
blocks of the default model (SmolLM2-135M, 30 blocks): `symphony generate` through a 2-stage
and a 3-stage chain is token-identical to the single-process model over 64 tokens (hidden
states travel as fp16), and a middle server killed with SIGKILL mid-generation is replaced by
replaying its inputs, with the output unchanged. The OpenAI endpoint and ``symphony ask`` of a
daemon that holds no whole model run the model on the same chain: a greedy chat completion is
the single-process model's greedy output for the executor's templated prompt, streamed token by
token in several chunks, and a vote over a chain is refused. A daemon that itself serves part
of the model uses its own blocks as the chain's first hop; asked right after the other server
starts, it waits for that server's offer, and a wait that ends names the missing blocks. A
stage that lies about its hidden states is caught by the asker's stage checks, convicted in the
ledger and left out, and the generation is the honest chain's."""

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

    def run(prompt_ids: list[int], n: int = TOKENS) -> list[int]:
        return greedy(LocalTarget.from_gguf(path), prompt_ids, n, stop=[eos])

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
    _openai_over_the_chain(asker, reference)

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


#: a chat the model answers at some length, and how much of the answer is compared
CHAT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
CHAT_TOKENS = 24


def _openai_over_the_chain(asker: Any, reference: Any) -> None:
    """The asker serves no whole model; blocks 0-20 and 20-30 are offered by two peers."""
    import openai

    from models.llama_backend import LlamaCppBackend
    from models.registry import default_model
    from node.api.token import read_token

    client = openai.OpenAI(base_url=asker.api_url + "/v1", api_key=read_token(asker.data_dir),
                           timeout=GENERATE_TIMEOUT_S, max_retries=0)
    model = default_model().name
    assert model in [m.id for m in client.models.list()]
    # the executor's own templating of the chat, and the single-process model's greedy answer
    executor = LlamaCppBackend(default_model())
    prompt_ids = executor.prompt_ids(CHAT)
    want_ids = reference(prompt_ids, CHAT_TOKENS)
    ended = want_ids[-1] in executor.eos_ids
    want = executor.detokenize(want_ids[:-1] if ended else want_ids)
    executor.llm.close()

    got = client.chat.completions.create(model=model, messages=CHAT,  # type: ignore[arg-type]
                                         max_tokens=CHAT_TOKENS, temperature=0)
    assert got.choices[0].message.content == want
    assert got.choices[0].finish_reason == ("stop" if ended else "length")
    assert got.usage is not None and got.usage.prompt_tokens == len(prompt_ids)
    assert got.usage.completion_tokens == len(want_ids) - ended
    chain = got.model_extra["symphony"]["chain"]  # type: ignore[index]
    assert [(h["start"], h["end"]) for h in chain["final_route"]] == [(0, 20), (20, 30)]

    pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=CHAT_TOKENS, temperature=0,  # type: ignore[arg-type]
        stream=True) if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == want and len(pieces) >= 5  # token by token, not in one piece

    with pytest.raises(openai.BadRequestError, match="k = 3"):
        client.chat.completions.create(model=model, messages=CHAT,  # type: ignore[arg-type]
                                       extra_body={"symphony": {"k": 3}})
    asked = run_cli("ask", "What is 2 + 3?", "--model", model, "--max-tokens", "12", "--json",
                    data_dir=asker.data_dir, timeout_s=GENERATE_TIMEOUT_S)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    snap = json.loads(asked.stdout)
    assert snap["phase"] == "done" and snap["results"][0]["executor"] == "chain"
    assert 0 < snap["results"][0]["tokens"] <= 12 and snap["chain"]["final_route"]


def test_a_server_uses_its_own_blocks_and_waits_for_the_rest(testnet: Testnet,
                                                              reference: Any) -> None:
    head = testnet.start("head", config={"inference": INFERENCE},
                         extra_args=["--serve-blocks", "0:15"])
    # nobody serves blocks 15-30: a short wait says so, then fails naming them
    missing = run_cli("generate", PROMPT, "--max-tokens", "4", "--wait-s", "1",
                      data_dir=head.data_dir, timeout_s=GENERATE_TIMEOUT_S)
    assert missing.returncode != 0
    assert "waiting up to" in missing.stderr, missing.stderr
    assert "blocks 15-30 of" in missing.stderr.splitlines()[-1], missing.stderr
    # asked while the other server still loads: the generation waits for its offer
    tail = _server(testnet, "tail", "15:30", head)
    out = _generate(head, "--wait-s", "180")
    tail.wait_ready(120)
    assert [(h["peer"], h["start"], h["end"]) for h in out["chain"]] == [
        (head.peer_id, 0, 15), (tail.peer_id, 15, 30)]
    assert out["tokens"] == reference(out["prompt_ids"])


#: the tokens a checked generation makes, and the stage-check rate of its requester (high: a
#: short generation must select some steps of every hop)
CHECKED_TOKENS = 16


def test_a_lying_stage_is_convicted_and_the_generation_is_the_honest_chains(
        testnet: Testnet, reference: Any) -> None:
    """A chain head [0, 15) -> liar [15, 30): the liar adds noise to its hidden states. The
    asker serves [15, 30) itself with a single session slot (so its plan prefers the liar) and
    its stage checks recompute the liar's selected steps on that stage, convict the liar into
    the ledger and run the generation again without it: the output is the single-process
    model's. The next generation's chain leaves the liar out."""
    asker = testnet.start("asker", wait=False, extra_args=["--serve-blocks", "15:30"],
                          config={"inference": {**INFERENCE, "check_rate": 0.5,
                                                "max_sessions": 1}})
    asker.wait_ready(180)
    head = _server(testnet, "head", "0:15", asker)
    liar = testnet.start("liar", bootstrap=[asker], wait=False,
                         extra_args=["--serve-blocks", "15:30"],
                         config={"inference": {**INFERENCE, "dishonest": "noise"}})
    for node in (head, liar):
        node.wait_ready(180)
    testnet.wait_until(lambda: len(_offers(asker)) == 2, "2 block offers", timeout_s=60)

    first = _generate(asker, "--max-tokens", str(CHECKED_TOKENS))
    tried = [[h["peer"] for h in chain] for chain in first["attempt_chains"]]
    assert tried == [[head.peer_id, liar.peer_id], [head.peer_id, asker.peer_id]]
    assert first["convicted"] == [liar.peer_id] and first["reruns"] == 1
    caught = first["attempt_checks"][0]  # per position, on the liar's committed K/V
    assert caught["checked"] == [liar.peer_id] and caught["prefilled"] == []
    assert first["tokens"] == reference(first["prompt_ids"], CHECKED_TOKENS)
    assert [h["peer"] for h in first["final_chain"]] == [head.peer_id, asker.peer_id]
    shown = run_cli("ledger", "attestations", "--peer", liar.peer_id, "--kind",
                    "verification_failed", "--json", data_dir=asker.data_dir)
    assert shown.returncode == 0 and json.loads(shown.stdout)["count"] >= 1, shown.stdout

    again = _generate(asker, "--max-tokens", str(CHECKED_TOKENS))
    assert [h["peer"] for h in again["chain"]] == [head.peer_id, asker.peer_id]
    assert again["tokens"] == first["tokens"] and again["convicted"] == []
