"""The OpenAI-compatible routes without a network: every parameter is honoured or refused
with a 400 naming it, an unknown model is a 404 ``model_not_found``, every error is OpenAI's
error object, and the replies (whole and streamed) carry the chosen result, real usage and
the finish reason. The tasks service is an in-test double that answers like a finished task;
tests/node/test_openai_integration.py drives real daemons with the official client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from node.api.openai_request import OpenAIError, chat_request, completion_request
from node.api.openai_routes import openai_routes
from node.market.ask_request import AskError, parse_ask
from node.market.requester import TasksSection
from protocol.inference.placement import Placement, Route

TOKEN = "secret"


def SERVED(model: str) -> Placement:  # noqa: N802 (stands for the set of served models)
    """The placement of a network that serves "smollm2" whole and nothing else."""
    if model == "smollm2":
        return Placement(Route.MARKET, model, "served whole")
    return Placement(Route.NOT_FOUND, model, f"The model `{model}` does not exist")


CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize("extra,param", [
    ({"n": 2}, "n"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"temperature": "hot"}, "temperature"),
    ({"seed": 1.5}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": "yes"}, "stream"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"symphony": {"votes": 3}}, "symphony.votes"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     "messages"),
    ({"model": 3}, "model"),
])
def test_a_refused_chat_parameter_is_named(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        chat_request({**CHAT, **extra}, SERVED)
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize("extra", [
    {"presence_penalty": 0}, {"logprobs": False}, {"n": 1}, {"user": "me"},
    {"tools": []}, {"response_format": {"type": "text"}}, {"metadata": {"a": "b"}},
])
def test_neutral_and_bookkeeping_values_are_accepted(extra: dict[str, Any]) -> None:
    assert chat_request({**CHAT, **extra}, SERVED).ask["question"] == "Hi"


def test_an_unknown_model_is_model_not_found_and_auto_means_any() -> None:
    with pytest.raises(OpenAIError) as caught:
        chat_request({**CHAT, "model": "gpt-9"}, SERVED)
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")
    assert chat_request({**CHAT, "model": "auto"}, SERVED).ask["model"] == ""


def test_the_whole_conversation_and_the_sampling_reach_the_ask() -> None:
    parsed = chat_request({
        "model": "smollm2", "temperature": 0.3, "top_p": 0.9, "seed": -5, "stop": "\n\n",
        "max_completion_tokens": 40, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "developer", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "My name is Ada."}]},
                     {"role": "assistant", "content": "Hello Ada."},
                     {"role": "user", "content": "What is my name?"}]}, SERVED)
    ask = parsed.ask
    assert ask["history"] == [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "My name is Ada."},
                              {"role": "assistant", "content": "Hello Ada."}]
    assert (ask["question"], ask["style"], ask["max_tokens"]) == ("What is my name?", "chat", 40)
    assert ask["k"] == 1  # one executor unless the request asks for a vote
    assert (ask["temperature"], ask["top_p"], ask["stop"]) == (0.3, 0.9, "\n\n")
    assert 0 <= ask["seed"] < 1 << 63 and parsed.stream and parsed.include_usage
    voted = chat_request({**CHAT, "symphony": {"k": 3}}, SERVED).ask
    assert (voted["k"], voted["style"]) == (3, "cot")


def test_a_completion_sends_the_raw_prompt() -> None:
    ask = completion_request({"model": "auto", "prompt": ["Once upon"]}, SERVED).ask
    assert (ask["question"], ask["style"]) == ("Once upon", "plain")
    with pytest.raises(OpenAIError, match="echo"):
        completion_request({"model": "auto", "prompt": "x", "echo": True}, SERVED)


@pytest.mark.parametrize("field,value", [
    ("temperature", 2.5), ("temperature", -1), ("top_p", 0), ("top_p", 1.5),
    ("seed", -1), ("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]), ("style", "poem"),
    ("history", [{"role": "robot", "content": "x"}]), ("k", 0),
])
def test_the_ask_checks_the_task_fields(field: str, value: Any) -> None:
    with pytest.raises(AskError) as caught:
        parse_ask({"question": "q", field: value}, TasksSection(), b"\1" * 32)
    assert caught.value.param == field


def test_an_unset_temperature_is_left_to_the_k_rule() -> None:
    event = parse_ask({"question": "q", "k": 3}, TasksSection(), b"\1" * 32)
    assert event.temperature is None and event.top_p == 1.0 and event.stop == ()


# ---------------------------------------------------------------- the routes, on a double


def snapshot(tokens: int = 7, finish: str = "length", k: int = 1) -> dict[str, Any]:
    results = [{"executor": f"e{i}", "attempt": i, "answer": "Paris", "normalized": "paris",
                "weight": 0.5 + i, "cot": f"The capital is Paris.{i}\nEND more",
                "tokens": tokens, "prompt_tokens": 20, "finish_reason": finish}
               for i in range(k)]
    return {"task_id": "ab" * 32, "phase": "done", "answer": "paris", "results": results,
            "attempts": [{"attempt": i, "model": "smollm2"} for i in range(k)],
            "votes": [{"answer": "paris", "count": k}]}


class Service:
    def __init__(self, snap: dict[str, Any]) -> None:
        self.snap = snap
        self.asked: list[dict[str, Any]] = []

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        self.asked.append(request)
        if request.get("temperature", 0) > 2:
            raise AskError("temperature must be a number in [0.0, 2.0]", "temperature")
        return self.snap if wait else {**self.snap, "phase": "bidding"}

    async def wait_done(self, task_id: str) -> dict[str, Any]:
        return self.snap

    def place(self, model: str) -> Placement:
        return SERVED(model)

    def live_text(self, task_id: str) -> None:
        return None  # the market's tasks: no text before they are done

    def model_created(self) -> dict[str, int]:
        return {"smollm2": 1_700_000_000}

    def agent_created(self) -> dict[str, int]:
        return {"calc": 1_700_000_100, "smollm2": 1_700_000_200}


def client(snap: dict[str, Any]) -> TestClient:
    app = Starlette(routes=openai_routes(Service(snap)))
    app.state.api_token = TOKEN
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def test_a_whole_reply_has_usage_finish_reason_and_the_vote() -> None:
    got = client(snapshot(k=3)).post("/v1/chat/completions",
                                     json={**CHAT, "stop": "END", "symphony": {"k": 3}}).json()
    (choice,) = got["choices"]
    # the heaviest executor behind the voted answer, cut at the stop string
    assert choice["message"]["content"] == "The capital is Paris.2\n"
    assert choice["finish_reason"] == "stop" and got["model"] == "smollm2"
    assert got["usage"] == {"prompt_tokens": 60, "completion_tokens": 21, "total_tokens": 81}
    assert got["symphony"]["votes"][0]["count"] == 3 and got["created"] > 1_700_000_000
    assert got["id"] == "chatcmpl-" + "ab" * 32 and got["object"] == "chat.completion"


def test_a_cut_answer_reports_length() -> None:
    got = client(snapshot()).post("/v1/completions", json={"model": "auto", "prompt": "x"})
    assert got.json()["choices"][0]["finish_reason"] == "length"
    assert got.json()["object"] == "text_completion"


def test_the_stream_sends_role_content_finish_usage_and_done() -> None:
    with client(snapshot()).stream("POST", "/v1/chat/completions", json={
            **CHAT, "stream": True, "stream_options": {"include_usage": True}}) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "The capital is Paris.0\nEND more"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 20
    assert len({c["id"] for c in chunks}) == 1


def test_a_failed_task_mid_stream_is_an_error_event() -> None:
    failed = {**snapshot(), "phase": "failed", "failure": "no executor left", "results": []}
    with client(failed).stream("POST", "/v1/chat/completions",
                               json={**CHAT, "stream": True}) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert json.loads(lines[-1])["error"]["code"] == "task_failed"


@pytest.mark.parametrize("method,path,body,status,code", [
    ("POST", "/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404, "model_not_found"),
    ("POST", "/v1/chat/completions", {**CHAT, "temperature": 3}, 400, None),
    ("POST", "/v1/chat/completions", [1, 2], 400, None),
    ("GET", "/v1/chat/completions", None, 404, "unknown_url"),
    ("POST", "/v1/embeddings", {"input": "x"}, 404, "unknown_url"),
])
def test_every_error_is_an_openai_error_object(method: str, path: str, body: Any, status: int,
                                               code: str | None) -> None:
    got = client(snapshot()).request(method, path, json=body)
    assert got.status_code == status
    error = got.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


def test_a_wrong_key_is_a_401_error_object_and_models_have_created() -> None:
    c = client(snapshot())
    got = c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert got.status_code == 401 and got.json()["error"]["code"] == "invalid_api_key"
    # the agent named like a served model is listed once, as the model
    assert c.get("/v1/models").json()["data"] == [
        {"id": "smollm2", "object": "model", "created": 1_700_000_000, "owned_by": "symphony"},
        {"id": "calc", "object": "model", "created": 1_700_000_100,
         "owned_by": "symphony-agent"}]


def test_an_agents_name_as_the_model_names_that_agent() -> None:
    agents = {"calc", "smollm2"}
    parsed = chat_request({**CHAT, "model": "calc"}, SERVED, agents)
    assert parsed.ask["agent"] == "calc" and parsed.ask["model"] == "" and parsed.model == "calc"
    assert "agent" not in chat_request(CHAT, SERVED, agents).ask  # a served model wins
    assert completion_request({"model": "calc", "prompt": "x"}, SERVED,
                              agents).ask["agent"] == "calc"
    with pytest.raises(OpenAIError, match="does not exist"):
        chat_request({**CHAT, "model": "calc"}, SERVED)  # no such agent: not found
    service = Service(snapshot())
    app = Starlette(routes=openai_routes(service))
    app.state.api_token = TOKEN
    c = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    assert c.post("/v1/chat/completions", json={**CHAT, "model": "calc"}).status_code == 200
    (asked,) = service.asked
    assert asked["agent"] == "calc" and asked["model"] == ""


def test_a_failed_task_is_a_server_error() -> None:
    failed = {**snapshot(), "phase": "failed", "failure": "no executor left"}
    got = client(failed).post("/v1/chat/completions", json=CHAT)
    assert got.status_code == 502 and "no executor left" in got.json()["error"]["message"]


class FailoverService(Service):
    """A k=1 task whose first executor streamed part of a wrong start and failed: its text
    was discarded ("") and the replacement streamed the answer from the start."""

    def live_text(self, task_id: str) -> Any:  # type: ignore[override]
        async def texts() -> Any:
            for text in ("The cap", "The capital wa", "", "The capital is Par"):
                yield text

        return texts()


def test_a_restarted_stream_tells_the_client_to_discard_the_failed_executors_text() -> None:
    app = Starlette(routes=openai_routes(FailoverService(snapshot())))
    app.state.api_token = TOKEN
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}).stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    kept = ""
    pieces = []
    for chunk in chunks:
        if (chunk.get("symphony") or {}).get("stream_restarted"):
            assert chunk["symphony"]["discarded_chars"] == len(kept) and chunk["choices"] == []
            kept = ""
            pieces.append(None)
        elif chunk["choices"]:
            piece = chunk["choices"][0]["delta"].get("content", "")
            kept += piece
            pieces.append(piece)
    # not the failed executor's "The capital wa" with the replacement's text after it
    assert kept == "The capital is Paris.0\nEND more"
    assert pieces == ["", "The cap", "ital wa", None, "The capital is Par", "is.0\nEND more",
                      ""]
