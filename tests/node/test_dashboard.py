"""The dashboard's HTTP side against a real daemon: signing in with the token once (then a
session cookie), what is refused without it, the state document and its event stream, and
the chat box's checks. The browser test is tests/node/test_dashboard_browser.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from node.api.dashboard import cookie_name, dashboard_url, session_value
from node.api.dashboard_state import JOB_SERVICES, LiveFeed, dashboard_state
from node.api.token import read_token

from .conftest import Testnet

pytestmark = pytest.mark.integration

ASK_HEADERS = {"X-Symphony-Dashboard": "1"}


def test_sign_in_state_events_and_refusals(testnet: Testnet) -> None:
    node = testnet.start("solo")
    token = read_token(node.data_dir)
    base = node.api_url
    # no session: the page explains how to sign in, the data is refused
    assert httpx.get(f"{base}/").status_code == 401
    assert httpx.get(f"{base}/dashboard/state").status_code == 401
    assert httpx.get(f"{base}/?token=wrong").status_code == 401
    # the static files are public and loaded from here only
    js = httpx.get(f"{base}/dashboard/static/dashboard.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert httpx.get(f"{base}/dashboard/static/..%2Fapp.py").status_code == 404

    with httpx.Client(base_url=base, timeout=10) as browser:
        signed = browser.get(dashboard_url("", token))
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert token not in cookie and session_value(token) in cookie
        assert browser.cookies[cookie_name(token)] == session_value(token)
        page = browser.get("/")
        assert page.status_code == 200 and "Ask the network" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]

        state = browser.get("/dashboard/state").json()
        assert state["node"]["peer_id"] == node.peer_id
        assert state["node"]["device"]["kind"]
        assert state["peers"] == [] and state["tasks"] == []
        # a section per heavier job kind: the status of each such service the node runs
        running = set(node.status()["services"])
        for kind, names in JOB_SERVICES.items():
            present = {n for n in names if n in running}
            shown = state["jobs"][kind]
            assert (shown is None) if not present else set(shown) == present
        # the views the page draws: of the same services, and the running totals
        assert (state["rl"] is None) == (not {"rl_jobs", "rl_worker"} & running)
        assert (state["inference"] is None) == ("inference" not in running)
        assert state["totals"]["tasks_ended"] == 0 and state["totals"]["at_ms"] > 0

        with browser.stream("GET", "/dashboard/events") as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            line = next(events.iter_lines())
            assert line.startswith("data: ")
            assert json.loads(line[len("data: "):])["node"]["peer_id"] == node.peer_id

        # the chat box's ask: needs its header, refuses another origin and bad input
        assert browser.post("/dashboard/ask", json={"question": "hi"}).status_code == 403
        crossed = browser.post("/dashboard/ask", json={"question": "hi"},
                               headers={**ASK_HEADERS, "Origin": "http://127.0.0.1:1"})
        assert crossed.status_code == 403 and "cross-origin" in crossed.text
        bad_k = browser.post("/dashboard/ask", json={"question": "hi", "k": 0},
                             headers=ASK_HEADERS)
        assert bad_k.status_code == 400 and "k must be" in bad_k.json()["error"]
        empty = browser.post("/dashboard/ask", json={"question": " "}, headers=ASK_HEADERS)
        assert empty.status_code == 400 and "question" in empty.json()["error"]
        # DNS rebinding: a foreign Host name is refused even with the session
        assert browser.get("/dashboard/state",
                           headers={"Host": "evil.example"}).status_code == 421


class _Tasks:
    def recent(self, n: int) -> list[dict[str, Any]]:
        return [{"task_id": "ab" * 16, "phase": "done", "question": "What is 2 * 3?", "k": 1,
                 "answer": "6", "failure": None, "attempts": [], "votes": [],
                 "agent": "calc", "results": [
                     {"executor": "12D3KooWB", "tool_calls": [
                         {"name": "calculator", "arguments": {"expression": "2 * 3"},
                          "output": "6"}]},
                     {"executor": "12D3KooWC", "tool_calls": None}]}]


class _Source:
    services = {"tasks": _Tasks()}

    def status(self) -> dict[str, Any]:
        return {"peer_id": "12D3KooWA", "peers": []}


def test_a_tasks_agent_and_tool_calls_are_in_the_state() -> None:
    state = dashboard_state(_Source(), LiveFeed(lambda: 0))
    (task,) = state["tasks"]
    assert task["agent"] == "calc" and state["agents"] == []  # no ledger: no agents
    assert task["tool_calls"] == [{"executor": "12D3KooWB", "name": "calculator",
                                   "arguments": '{"expression": "2 * 3"}', "output": "6"}]
