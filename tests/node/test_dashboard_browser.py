"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright
through its executable path; Playwright's own browser download is never used): on a 3-daemon
testnet the page loads with no console error, shows the asker's two peers and the network's
agents (e1's declared ones with their tools marked read-only, e2's default generalist), and a
question typed into the chat box gets the network's answer. It saves a screenshot in the test's
temporary directory, or as docs/dashboard.png (the README's) with SYMPHONY_UPDATE_SCREENSHOT=1,
so a suite run leaves the tree clean.

Skipped, with the reason, where Playwright or Chromium is not installed (``make`` installs
both: ``chromium`` through ``make system-deps``). An installed Chromium that does not start is
a failure, not a skip."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.api.dashboard import dashboard_url
from node.api.token import read_token

from .conftest import ARITH_SOLVER, CONVERGE_S, ROOT, TASKS, Testnet

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("SYMPHONY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
README_SCREENSHOT = ROOT / "docs" / "dashboard.png"
CALC = {"name": "calc", "description": "Exact arithmetic.", "skills": ["arithmetic", "math"],
        "tools": ["calculator"], "price": 0.25}
#: page waits (ms): a shared 2-core machine runs three daemons and a browser at once
WAIT_MS = 60_000


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
    asker = testnet.start("asker", config={"tasks": TASKS})
    execs = [testnet.start(name, bootstrap=[asker], wait=False,
                           config={"executor": {"solver": ARITH_SOLVER}, **agents})
             for name, agents in (("e1", {"agents": [CALC]}), ("e2", {}))]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(dashboard_url(asker.api_url, read_token(asker.data_dir)))
    assert page.url == f"{asker.api_url}/", "the sign-in should leave the token behind"

    # the peers, live from the event stream
    page.wait_for_function(
        "document.querySelectorAll('#peer-rows tr[data-peer]').length === 2", timeout=WAIT_MS)
    shown = {row.get_attribute("data-peer")
             for row in page.query_selector_all("#peer-rows tr[data-peer]")}
    assert shown == {node.peer_id for node in execs}
    assert page.text_content("#live") == "live"
    assert asker.peer_id in (page.text_content("#node-facts") or "")

    # the agents section, from the cards in the asker's ledger
    page.wait_for_function(
        "document.querySelectorAll('#agent-rows tr[data-agent]').length === 2", timeout=WAIT_MS)
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

    shot = (README_SCREENSHOT if os.environ.get("SYMPHONY_UPDATE_SCREENSHOT") == "1"
            else tmp_path / "dashboard.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a real rendering, not an empty page
    assert errors == [], errors
