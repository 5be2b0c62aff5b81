"""The relay's HTTP routes refuse a body that is not a JSON object with a 400 naming the
problem, before the service is asked anything."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from node.relay.api import relay_routes


class Untouchable:
    """A relay service that fails the test if a route reaches it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"a bad body reached the service ({name})")


@pytest.mark.parametrize("path", ["/limits", "/publish", "/fetch", "/export", "/pull"])
@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b"3"])
def test_a_body_that_is_not_a_json_object_gets_a_400(path: str, content: bytes) -> None:
    app = Starlette(routes=relay_routes(Untouchable()))  # type: ignore[arg-type]
    app.state.api_token = "t"
    client = TestClient(app, headers={"Authorization": "Bearer t"})
    reply = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    assert reply.json() == {"error": "the body must be a JSON object"}


class NoHolders:
    """A relay service whose ledger offers no model."""

    async def pull_model(self, model: str) -> dict[str, object]:
        raise ValueError(f"no peer in the ledger offers a model named {model!r}")


@pytest.mark.parametrize("body", [{}, {"model": ""}, {"model": 3}])
def test_a_pull_needs_a_model(body: dict[str, object]) -> None:
    app = Starlette(routes=relay_routes(Untouchable()))  # type: ignore[arg-type]
    app.state.api_token = "t"
    reply = TestClient(app, headers={"Authorization": "Bearer t"}).post("/pull", json=body)
    assert reply.status_code == 400 and "needs a model" in reply.json()["error"]


def test_a_pull_of_a_model_nobody_offers_is_a_404_naming_it() -> None:
    app = Starlette(routes=relay_routes(NoHolders()))  # type: ignore[arg-type]
    app.state.api_token = "t"
    reply = TestClient(app, headers={"Authorization": "Bearer t"}).post(
        "/pull", json={"model": "tiny"})
    assert reply.status_code == 404 and "'tiny'" in reply.json()["error"]
