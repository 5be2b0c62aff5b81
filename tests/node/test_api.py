"""Local API (token-protected routes, 127.0.0.1 only), the control client's daemon discovery,
and the first-run data dir."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from node.api.app import API_HOST, KEEP_ALIVE_S, build_app, serve_api, token_route
from node.api.token import load_or_create_token, read_token
from node.control import (
    KEEPALIVE_S,
    ApiClient,
    DaemonNotRunning,
    read_daemon_info,
    refusal,
    tls_verify,
    write_daemon_info,
)
from node.daemon import prepare_data_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_run_creates_key_config_and_token_privately(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    identity = prepare_data_dir(data)
    assert mode(data) == 0o700
    assert mode(data / "node.key") == 0o600 and mode(data / "api.token") == 0o600
    assert (data / "node.toml").read_text().startswith("# symphony node configuration")
    # a second run keeps the same identity, token and config
    token = read_token(data)
    assert prepare_data_dir(data).peer_id == identity.peer_id
    assert read_token(data) == token


def test_a_readable_token_file_is_refused(tmp_path: Path) -> None:
    load_or_create_token(tmp_path)
    os.chmod(tmp_path / "api.token", 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        read_token(tmp_path)


def test_daemon_discovery_through_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(DaemonNotRunning, match="no daemon is running"):
        read_daemon_info(tmp_path)
    info = {"pid": os.getpid(), "api_url": "http://127.0.0.1:1", "peer_id": "12D3KooWx",
            "network_id": "n", "addresses": ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWx"]}
    write_daemon_info(tmp_path, info)
    assert read_daemon_info(tmp_path).peer_id == "12D3KooWx"
    # a daemon killed with -9 leaves the file behind: its dead pid marks it stale
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    write_daemon_info(tmp_path, {**info, "pid": int(dead.stdout)})
    with pytest.raises(DaemonNotRunning, match="stale"):
        read_daemon_info(tmp_path)


def test_token_routes_refuse_without_the_token_and_the_client_sends_it(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    calls: list[object] = []

    async def do_thing(request: Request) -> Response:
        calls.append(await request.json())
        return JSONResponse({"ok": True})

    app = build_app(lambda: {"peer_id": "me"},
                    {"thing": [token_route("/do", do_thing)], "empty": []}, token)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api, app, 0)
            url = f"http://{API_HOST}:{port}"
            write_daemon_info(tmp_path, {"pid": os.getpid(), "api_url": url, "peer_id": "me",
                                         "network_id": "n", "addresses": []})
            client = ApiClient(tmp_path)

            def exercise() -> None:
                assert client.status() == {"peer_id": "me"}
                for headers in ({}, {"Authorization": "Bearer wrong"},
                                {"Authorization": f"Basic {token}"}):
                    r = httpx.post(url + "/thing/do", json={"x": 1}, headers=headers)
                    assert r.status_code == 401
                assert calls == []
                assert client.post("/thing/do", json={"x": 2}) == {"ok": True}
                assert httpx.get(url + "/thing/do").status_code == 405

            await trio.to_thread.run_sync(exercise)
            assert calls == [{"x": 2}]
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_client_reuses_its_connection_and_drops_it_before_the_server_would(
        tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)

    async def whoami(request: Request) -> Response:
        assert request.client is not None
        return JSONResponse({"port": request.client.port})

    app = build_app(lambda: {}, {"who": [token_route("/ami", whoami)]}, token)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api, app, 0)
            write_daemon_info(tmp_path, {"pid": os.getpid(), "api_url": f"http://{API_HOST}:{port}",
                                         "peer_id": "me", "network_id": "n", "addresses": []})

            def ports() -> list[int]:
                with ApiClient(tmp_path) as client:
                    return [client.post("/who/ami")["port"] for _ in range(3)]

            used = await trio.to_thread.run_sync(ports)
            assert len(set(used)) == 1  # one connection for the three calls
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert KEEPALIVE_S < KEEP_ALIVE_S  # an idle connection is never used as the server closes it


def test_the_status_route_serves_the_status_json(tmp_path: Path) -> None:
    app = build_app(lambda: {"n": 1}, {}, "t")
    assert [r.path for r in app.routes if isinstance(r, Route)] == ["/status"]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_api, app, 0)
            r = await trio.to_thread.run_sync(
                lambda: httpx.get(f"http://127.0.0.1:{port}/status"))
            assert json.loads(r.text) == {"n": 1}
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize(("answer", "said"), [
    ({"json": {"error": "no such task"}}, "no such task"),
    ({"json": {"error": {"message": "k must be positive", "field": "k"}}}, "k must be positive"),
    ({"json": ["not", "an", "object"]}, "['not', 'an', 'object']"),
    ({"text": "Bad Gateway"}, "Bad Gateway"),
])
def test_a_refusal_says_what_the_daemon_said(answer: dict[str, object], said: str) -> None:
    request = httpx.Request("POST", "http://127.0.0.1:1/tasks")
    response = httpx.Response(400, request=request, **answer)  # type: ignore[arg-type]
    exc = httpx.HTTPStatusError("refused", request=request, response=response)
    assert refusal(exc) == said


def test_certificates_are_checked_on_https_and_not_loaded_for_plain_http() -> None:
    assert tls_verify("https://node.example:8443") is True
    assert tls_verify("http://127.0.0.1:7000") is False
    assert tls_verify("HTTPS://node.example") is True  # any scheme but plain http verifies
