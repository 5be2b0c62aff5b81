"""The generate route of /inference: the acceptance rule it passes on, and its refusals."""

from __future__ import annotations


def test_generate_route_passes_the_rule_and_refuses_an_unknown_one() -> None:
    from starlette.testclient import TestClient

    from node.api.app import build_app
    from node.inference.api import inference_routes

    class Service:
        calls: list[tuple[str, int, int, str]] = []

        def status(self) -> dict[str, str]:
            return {}

        async def generate(self, prompt: str, max_tokens: int, speculative: int,
                           rule: str) -> dict[str, str]:
            self.calls.append((prompt, max_tokens, speculative, rule))
            return {"text": "ok"}

    service = Service()
    app = build_app(lambda: {}, {"inference": inference_routes(service)}, "t0ken")
    client = TestClient(app, headers={"Authorization": "Bearer t0ken"})
    body = {"prompt": "hi", "max_tokens": 4, "speculative": 2}
    assert client.post("/inference/generate", json={**body, "rule": "mars"}).status_code == 200
    assert client.post("/inference/generate", json=body).status_code == 200
    assert service.calls == [("hi", 4, 2, "mars"), ("hi", 4, 2, "greedy")]
    refused = client.post("/inference/generate", json={**body, "rule": "sampling"})
    assert refused.status_code == 400 and "'rule'" in refused.json()["error"]["message"]
