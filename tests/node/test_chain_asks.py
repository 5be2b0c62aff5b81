"""Asks served by a chain (node/market/chain_asks.py, chain_task.py), the chain requester's
decoding (node/inference/requester.py, decoding.py) and the OpenAI stream over a chain,
without a network: the chain's hops are
a single-process model (models.blocks.LocalTarget) of a tiny GGUF with a real tokenizer.
tests/node/test_inference_integration.py runs the same through real daemons."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
import trio

pytest.importorskip("torch")
pytest.importorskip("gguf")

import torch  # noqa: E402

from models.blocks import LocalTarget, greedy  # noqa: E402
from node.api.openai_routes import streamable  # noqa: E402
from node.inference.decoding import Decoding, stop_length  # noqa: E402
from node.inference.requester import Requester  # noqa: E402
from node.inference.service import InferenceSection  # noqa: E402
from node.market.ask_request import AskError, parse_ask  # noqa: E402
from node.market.chain_asks import ChainAsks, interrupted  # noqa: E402
from node.market.requester import TasksSection  # noqa: E402
from protocol.inference.placement import Placement, Route  # noqa: E402
from tests.models import tiny  # noqa: E402

CHAIN = Placement(Route.CHAIN, "tiny", "tiny is served only in parts")
HOPS = [{"peer": "p1", "start": 0, "end": 1}, {"peer": "p2", "start": 1, "end": 2}]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return tiny.write_gguf(tiny.tiny_model(seed=3), tmp_path_factory.mktemp("asks") / "t.gguf")


class LocalRequester(Requester):
    """The real requester (tokenizer, chat template, decoding) whose chain is one process."""

    def __init__(self, path: Path, fail: str = "") -> None:
        import llama_cpp

        tokenizer = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        service = SimpleNamespace(model_path=path, section=InferenceSection(), host=None)
        super().__init__(service, None, tokenizer)  # type: ignore[arg-type]
        self.path, self.fail = path, fail

    async def complete(self, ids: list[int], decoding: Decoding,
                       on_text: Any = None) -> dict[str, Any]:
        if self.fail:
            raise ValueError(self.fail)
        target = LocalTarget.from_gguf(self.path)
        out = await trio.to_thread.run_sync(self._decode, target, ids, decoding, on_text)
        return {**out, "prompt_ids": ids, "prompt_tokens": len(ids), "wall_s": 0.5,
                "tokens_per_s": 2.0, "chain": HOPS, "final_chain": HOPS, "recoveries": 0,
                "precision": "f16"}


class Inference:
    running = True
    model_name = "tiny"

    def __init__(self, requester: LocalRequester, nursery: trio.Nursery) -> None:
        self._requester, self.start_soon = requester, nursery.start_soon

    async def requester(self) -> LocalRequester:
        return self._requester


def asks(requester: LocalRequester, nursery: trio.Nursery,
         records: list[dict[str, Any]]) -> ChainAsks:
    ctx = SimpleNamespace(services={"inference": Inference(requester, nursery)},
                          clock=lambda: int(trio.current_time() * 1000),
                          log=structlog.get_logger())
    return ChainAsks(ctx, records.append, 0)


def event(**request: Any) -> Any:
    """A checked ask, with a task id of its own."""
    event.drawn = getattr(event, "drawn", 0) + 1  # type: ignore[attr-defined]
    task_id = event.drawn.to_bytes(32, "big")  # type: ignore[attr-defined]
    return parse_ask({"question": "Hello there", **request}, TasksSection(), task_id)


def decode(requester: Requester, gguf: Path, ids: list[int], d: Decoding) -> dict[str, Any]:
    """The requester's decoding loop, in a worker thread as the daemon runs it."""
    target = LocalTarget.from_gguf(gguf)
    return dict(trio.run(trio.to_thread.run_sync, requester._decode, target, ids, d, None))


def run(body: Any) -> Any:
    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            return await body(nursery)

    return trio.run(main)


# ---------------------------------------------------------------- the requester's decoding


def test_greedy_decoding_is_the_models_and_a_stop_string_ends_it(gguf: Path) -> None:
    requester = LocalRequester(gguf)
    ids = requester.prompt_ids([{"role": "user", "content": "Hi"}])
    assert ids == requester.tokenize("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    want = greedy(LocalTarget.from_gguf(gguf), ids, 12, stop=sorted(requester.end_ids))
    out = decode(requester, gguf, ids, Decoding(max_tokens=12))
    assert out["tokens"] == want and out["text"] == requester.detokenize(want)
    assert out["finish_reason"] == "length" and out["completion_tokens"] == 12
    text = out["text"]
    stop = text[5:7]  # a stop string the greedy text completes at some token
    cut = decode(requester, gguf, ids, Decoding(max_tokens=12, stop=(stop,)))
    assert cut["finish_reason"] == "stop" and stop in cut["text"]
    assert stop not in requester.detokenize(cut["tokens"][:-1])
    assert cut["tokens"] == want[:len(cut["tokens"])]


def test_sampling_is_seeded(gguf: Path) -> None:
    requester = LocalRequester(gguf)
    ids = requester.tokenize("Once")

    def sample(seed: int) -> list[int]:
        d = Decoding(max_tokens=10, temperature=1.5, top_p=0.95, seed=seed)
        return list(decode(requester, gguf, ids, d)["tokens"])

    assert sample(1) == sample(1)
    assert len({tuple(sample(s)) for s in range(2, 6)}) > 1


@pytest.mark.parametrize("bad,match", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"speculative": 17}, "speculative"),
    ({"rule": "sampling"}, "rule"), ({"rule": "mars", "temperature": 0.5}, "mars"),
])
def test_bad_decoding_is_named(bad: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Decoding(**bad)


def test_stop_length_is_the_fewest_tokens_holding_a_stop() -> None:
    text = "abcdef"
    assert stop_length([0, 1, 2, 3, 4, 5], ["cd"], lambda ids: "".join(text[i] for i in ids)) == 4
    assert stop_length([0, 1], ["cd"], lambda ids: "".join(text[i] for i in ids)) is None


@pytest.mark.parametrize("text,stop,ready", [
    ("Hello wor", ("END",), "Hello wor"),
    ("Hello. EN", ("END",), "Hello. "),  # may still become the stop string
    ("Hello. END more", ("END",), "Hello. "),
    ("caf\ufffd", (), "caf"),  # an incomplete UTF-8 character waits for its next token
    ("a\n", ("\n\n", "x"), "a"),
])
def test_streamable_holds_back_what_is_undecided(text: str, stop: tuple[str, ...],
                                                 ready: str) -> None:
    assert streamable(text, stop) == ready


class ChainService:
    """The tasks service as the OpenAI routes see it, for a model only a chain serves."""

    GROWING = ["Hel", "Hello wor", "Hello world. EN", "Hello world. END and"]

    def __init__(self) -> None:
        self.snap = {"task_id": "cd" * 32, "phase": "done", "answer": "x", "votes": [],
                     "results": [{"executor": "chain", "attempt": 0, "answer": "x",
                                  "normalized": "x", "weight": 1.0, "tokens": 9,
                                  "cot": "Hello world. END and more", "prompt_tokens": 4,
                                  "finish_reason": "stop"}],
                     "attempts": [{"attempt": 0, "model": "tiny"}], "chain": {"route": HOPS}}

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        return self.snap if wait else {**self.snap, "phase": "running"}

    async def wait_done(self, task_id: str) -> dict[str, Any]:
        return self.snap

    def place(self, model: str) -> Placement:
        return Placement(Route.CHAIN, model, "served in parts")

    def model_created(self) -> dict[str, int]:
        return {"tiny": 1}

    def agent_created(self) -> dict[str, int]:
        return {}

    async def _grow(self) -> Any:
        for text in self.GROWING:
            yield text

    def live_text(self, task_id: str) -> Any:
        return self._grow()


def test_the_openai_stream_of_a_chain_sends_the_text_as_it_grows() -> None:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from node.api.openai_routes import openai_routes

    app = Starlette(routes=openai_routes(ChainService()))
    app.state.api_token = "t"
    client = TestClient(app, headers={"Authorization": "Bearer t"})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stop": "END"}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    # "EN" waits (it may become the stop string); the stop string and what follows never come
    assert [p for p in pieces if p] == ["Hel", "lo wor", "ld. "]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and lines[-1] == "[DONE]"
    assert chunks[-1]["model"] == "tiny" and chunks[-1]["symphony"]["chain"]["route"] == HOPS
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["message"]["content"] == "Hello world. "
    assert whole["model"] == "tiny" and whole["usage"]["completion_tokens"] == 9


# ---------------------------------------------------------------- chain asks


def test_a_chat_ask_runs_on_the_chain_and_streams_its_text(gguf: Path) -> None:
    requester = LocalRequester(gguf)
    records: list[dict[str, Any]] = []

    async def body(nursery: trio.Nursery) -> tuple[dict[str, Any], list[str]]:
        chains = asks(requester, nursery, records)
        ask = {"style": "chat", "max_tokens": 10}
        snap = await chains.ask(event(**ask), ask, CHAIN, wait=False)
        assert snap["phase"] == "running" and "chain" in snap
        live = chains.live_text(snap["task_id"])
        assert live is not None
        texts = [text async for text in live]
        return records[-1], texts

    snap, texts = run(body)
    ids = requester.prompt_ids([{"role": "user", "content": "Hello there"}])
    want = greedy(LocalTarget.from_gguf(gguf), ids, 10, stop=sorted(requester.end_ids))
    (result,) = snap["results"]
    assert snap["phase"] == "done" and result["cot"] == requester.detokenize(want)
    assert result["tokens"] == 10 and result["prompt_tokens"] == len(ids)
    assert result["finish_reason"] == "length" and result["executor"] == "chain"
    assert [a["peer"] for a in snap["attempts"]] == ["p1", "p2"]
    assert snap["chain"]["final_route"] == HOPS and snap["k"] == 1
    assert len(texts) >= 5 and texts[-1] == result["cot"]  # one text per step: it grows
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert json.loads(json.dumps(snap)) == snap and [r["phase"] for r in records] == [
        "running", "done"]
    assert interrupted({**snap, "phase": "running"}, 9)["phase"] == "failed"  # type: ignore[index]
    assert interrupted({"task_id": "x", "phase": "running"}, 9) is None  # the market's


def test_a_vote_a_broken_chain_and_a_deadline(gguf: Path) -> None:
    records: list[dict[str, Any]] = []

    async def body(nursery: trio.Nursery) -> None:
        chains = asks(LocalRequester(gguf), nursery, records)
        with pytest.raises(AskError, match="k = 3") as caught:
            await chains.ask(event(k=3), {"k": 3}, CHAIN, wait=True)
        assert caught.value.param == "k"
        with pytest.raises(AskError, match="speculative"):
            await chains.ask(event(), {"speculative": 99}, CHAIN, wait=True)
        broken = asks(LocalRequester(gguf, fail="no chain: no server covers block 1"), nursery,
                      records)
        snap = await broken.ask(event(), {}, CHAIN, wait=True)
        assert snap["phase"] == "failed" and "block 1" in snap["failure"]
        slow = await chains.ask(event(max_tokens=4000, deadline_ms=1000), {}, CHAIN, wait=True)
        assert slow["phase"] == "failed" and "deadline" in slow["failure"]

    run(body)


def test_a_follower_that_leaves_stops_the_generation(gguf: Path) -> None:
    records: list[dict[str, Any]] = []

    async def body(nursery: trio.Nursery) -> dict[str, Any]:
        chains = asks(LocalRequester(gguf), nursery, records)
        snap = await chains.ask(event(max_tokens=2000), {}, CHAIN, wait=False)
        live = chains.live_text(snap["task_id"])
        assert live is not None
        async for _ in live:
            break  # the stream's client went away after its first delta
        await live.aclose()  # type: ignore[attr-defined]
        with trio.fail_after(60):
            while records[-1]["phase"] == "running":
                await trio.sleep(0.05)  # polling the record the chain's task writes
        return records[-1]

    snap = run(body)
    assert snap["phase"] == "failed" and "went away" in snap["failure"]
