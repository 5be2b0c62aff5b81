"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright
through its executable path; Playwright's own browser download is never used): on a 3-daemon
testnet the page loads with no console error, shows the asker's two peers (in the table and as
a graph with latency on its edges) and the network's agents (e1's declared ones with their
tools marked read-only, e2's default generalist), and a question typed into the chat box gets
the network's answer, which the activity charts count. The executors serve the default
model's blocks 0-15 and 15-30, so the inference section shows both stages and the two-stage
chain the asker would use, with tokens/s; the asker runs an RL job book and e2 a rollout
worker (the test generator), so the RL section shows a run's groups per policy version with
their staleness. It saves a screenshot in the test's temporary directory, or as
docs/dashboard.png (the README's) with SYMPHONY_UPDATE_SCREENSHOT=1, so a suite run leaves the
tree clean.

Skipped, with the reason, where Playwright or Chromium is not installed (``make`` installs
both: ``chromium`` through ``make system-deps``). An installed Chromium that does not start is
a failure, not a skip."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.api.dashboard import dashboard_url
from node.api.token import read_token

from .conftest import ARITH_SOLVER, CONVERGE_S, ROOT, TASKS, Testnet
from .rl_generator import MODEL as RL_MODEL

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("SYMPHONY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
README_SCREENSHOT = ROOT / "docs" / "dashboard.png"
CALC = {"name": "calc", "description": "Exact arithmetic.", "skills": ["arithmetic", "math"],
        "tools": ["calculator"], "price": 0.25}
#: page waits (ms): generous, as the test runs three daemons and a browser at once
WAIT_MS = 60_000
INFERENCE = {"threads": 1}
#: the executors' block ranges of the default model (30 blocks)
STAGES = (("e1", "0:15"), ("e2", "15:30"))
RL_RUN = {"model": RL_MODEL, "dataset_size": 100, "vocab_size": 1000, "group_size": 2,
          "prompts_per_job": 1, "max_tokens": 8, "staleness": 1, "job_ms": 30_000,
          "version": 1}


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install -e .[test])")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (make system-deps)")
    with sync_api.sync_playwright() as playwright:
        # no sandbox: the tests may run as root, where Chromium's sandbox refuses to start
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def test_dashboard_shows_the_testnet_and_answers_the_chat(testnet: Testnet, browser: Any,
                                                          tmp_path: Path) -> None:
    asker = testnet.start("asker", config={"tasks": TASKS, "inference": INFERENCE,
                                           "rl_jobs": {"bid_window_ms": 1500}})
    extra = ({"agents": [CALC]},
             {"rl_worker": {"generator": "tests.node.rl_generator:honest"}})
    execs = [testnet.start(name, bootstrap=[asker], wait=False, extra_args=["--serve-blocks", span],
                           config={"executor": {"solver": ARITH_SOLVER}, "inference": INFERENCE,
                                   **more})
             for (name, span), more in zip(STAGES, extra, strict=True)]
    for node in execs:
        node.wait_ready(120)
    testnet.wait_all_connected(CONVERGE_S)
    _rl_run(testnet, asker)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(dashboard_url(asker.api_url, read_token(asker.data_dir)))
    assert page.url == f"{asker.api_url}/", "the sign-in should leave the token behind"

    # the peers, live from the event stream
    # (waits are CSS selectors: the page's CSP forbids the eval wait_for_function polls with)
    page.wait_for_selector("#peer-rows tr[data-peer]:nth-child(2)", timeout=WAIT_MS)
    shown = {row.get_attribute("data-peer")
             for row in page.query_selector_all("#peer-rows tr[data-peer]")}
    assert shown == {node.peer_id for node in execs}
    assert page.text_content("#live") == "live"
    assert asker.peer_id in (page.text_content("#node-facts") or "")
    _peer_graph(page, execs)

    # the agents section, from the cards in the asker's ledger
    page.wait_for_selector("#agent-rows tr[data-agent]:nth-child(2)", timeout=WAIT_MS)
    rows = {row.get_attribute("data-agent"): row
            for row in page.query_selector_all("#agent-rows tr[data-agent]")}
    assert set(rows) == {"calc", "generalist"}
    assert rows["calc"].get_attribute("data-peer") == execs[0].peer_id
    assert rows["generalist"].get_attribute("data-peer") == execs[1].peer_id
    calc = [td.text_content() for td in rows["calc"].query_selector_all("td")]
    assert calc[2] == "arithmetic, math" and calc[3] == "calculator (read-only)"
    assert calc[4] == "0.25 / 1k tokens" and calc[6] == "no vector"  # embeddings off here
    assert page.text_content("#agent-count") == "(2)"

    # the chat box asks the network; both executors vote
    page.fill("#question", "What is 6 * 7?")
    page.select_option("#k", "2")
    page.click("#ask")
    answer = page.wait_for_selector("#conversation .answer", timeout=WAIT_MS)
    assert answer is not None and answer.text_content() == "42"
    # the task row follows without a reload: done, two bids, two executors, the vote
    row = page.wait_for_selector("#task-rows tr[data-task]:has(td.phase-done)",
                                 timeout=WAIT_MS)
    assert row is not None
    text = row.text_content() or ""
    assert "What is 6 * 7?" in text and "42: 2 (100%)" in text
    assert len(row.query_selector_all("td:nth-child(4) li")) == 2  # bids
    assert len(row.query_selector_all("td:nth-child(5) li")) == 2  # executors
    _activity(page)
    _inference(page, execs)
    _rl(page)

    readme = os.environ.get("SYMPHONY_UPDATE_SCREENSHOT") == "1"
    if readme:  # a few more questions, so the activity charts show a curve
        _ask_more(page)
    shot = README_SCREENSHOT if readme else tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a real rendering, not an empty page
    assert errors == [], errors


def _rl_api(node: Any, path: str, body: dict[str, Any]) -> None:
    token = read_token(node.data_dir)
    reply = httpx.post(f"{node.api_url}/rl_jobs{path}", json=body, timeout=40,
                       headers={"Authorization": f"Bearer {token}"})
    assert reply.status_code == 200, reply.text


def _rl_run(testnet: Testnet, learner: Any) -> None:
    """Groups of version 1 trained at version 1 (0 behind), then at version 2 (1 behind)."""
    def accepted(n: int) -> bool:
        book = learner.status()["services"]["rl_jobs"]["book"]
        return int(book.get("accepted", 0)) >= n

    _rl_api(learner, "/run", RL_RUN)
    _rl_api(learner, "/issue", {"count": 2})
    testnet.wait_until(lambda: accepted(2), "2 groups accepted", timeout_s=CONVERGE_S)
    _rl_api(learner, "/version", {"version": 2})
    _rl_api(learner, "/issue", {"count": 2, "version": 1})
    testnet.wait_until(lambda: accepted(4), "4 groups accepted", timeout_s=CONVERGE_S)


def _peer_graph(page: Any, execs: list[Any]) -> None:
    """One edge per peer, labelled with its measured latency."""
    page.wait_for_selector("#peer-graph g.edge[data-latency-ms] ~ g.edge[data-latency-ms]",
                           state="attached", timeout=WAIT_MS)
    edges = page.query_selector_all("#peer-graph g.edge")
    assert {e.get_attribute("data-peer") for e in edges} == {n.peer_id for n in execs}
    for edge in edges:  # the label is the peer's latency, rounded
        label = edge.text_content() or ""
        assert label.endswith(" ms"), label
        assert abs(float(label[:-3]) - float(edge.get_attribute("data-latency-ms") or 0)) < 1


def _activity(page: Any) -> None:
    """The asked task shows in tasks per minute, its answers' tokens in tokens per second."""
    # (attached, not visible: a flat line has an empty box)
    page.wait_for_selector("#tasks-chart path[data-series='asked, ended'][data-nonzero=yes]",
                           state="attached", timeout=WAIT_MS)
    assert int(page.get_attribute("#tasks-chart", "data-samples") or 0) >= 2
    assert page.query_selector(
        "#tokens-chart path[data-series='in answers received'][data-nonzero=yes]")
    # the asker computes nothing itself
    assert page.query_selector("#tasks-chart path[data-series='computed here'][data-nonzero=no]")


def _inference(page: Any, execs: list[Any]) -> None:
    """Both stages with their tokens/s, and the two-stage chain the asker would use."""
    page.wait_for_selector("#inference-chain tr[data-hop='1']", timeout=WAIT_MS)
    hops = page.query_selector_all("#inference-chain tr[data-hop]")
    assert [h.get_attribute("data-peer") for h in hops] == [n.peer_id for n in execs]
    assert [h.query_selector_all("td")[2].text_content() for h in hops] == ["0–15", "15–30"]
    stages = page.query_selector_all("#inference-stages tr[data-peer]")
    assert len(stages) == 2
    for stage in stages:
        assert (stage.query_selector_all("td")[3].text_content() or "").endswith(" tok/s")
    assert "tok/s" in (page.text_content("#inference-chain tbody tr:last-child") or "")
    assert _fact(page, "job-inference", "chain, estimated").endswith(" tok/s")
    assert len(page.query_selector_all("#job-inference svg.lanes rect.in-chain")) == 2
    assert page.query_selector_all("#job-inference svg.lanes rect.missing") == []


def _rl(page: Any) -> None:
    """The run's two versions: groups 0 behind at version 1, 1 behind at version 2."""
    page.wait_for_selector("#rl-versions tr[data-version='2']", timeout=WAIT_MS)
    rows = {r.get_attribute("data-version"): r.text_content() or ""
            for r in page.query_selector_all("#rl-versions tr[data-version]")}
    assert set(rows) == {"1", "2"}
    assert "2 × 0 behind" in rows["1"] and "2 × 1 behind" in rows["2"]
    bars = page.query_selector_all("#rl-staleness g.bar")
    assert [b.get_attribute("data-label") for b in bars] == ["v1", "v2"]
    assert page.query_selector("#rl-staleness rect.lag-1")
    assert _fact(page, "job-rl", "policy version") == "2"
    assert _fact(page, "job-rl", "staleness bound") == "1"


def _fact(page: Any, section: str, label: str) -> str:
    return page.text_content(f"#{section} .fact[data-fact='{label}'] .value") or ""


def _ask_more(page: Any) -> None:
    for i, (a, b) in enumerate(((7, 8), (9, 9), (12, 12), (3, 14))):
        page.fill("#question", f"What is {a} * {b}?")
        page.click("#ask")
        page.wait_for_selector(f"#conversation li:nth-child({i + 2})", timeout=WAIT_MS)
        page.wait_for_selector("#conversation li:first-child .answer", timeout=WAIT_MS)
        page.wait_for_timeout(1500)  # spread the tasks over the chart's time axis
