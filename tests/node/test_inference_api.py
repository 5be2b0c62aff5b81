"""The generate route of /inference: the acceptance rule and the wait for missing blocks it
passes on, and its refusals."""

from __future__ import annotations


def test_generate_route_passes_the_rule_and_refuses_an_unknown_one() -> None:
    from starlette.testclient import TestClient

    from node.api.app import build_app
    from node.inference.api import DEFAULT_WAIT_S, MAX_WAIT_S, inference_routes

    class Service:
        calls: list[tuple[str, int, int, str, float]] = []

        def status(self) -> dict[str, str]:
            return {}

        async def generate(self, prompt: str, max_tokens: int, speculative: int,
                           rule: str, wait_s: float) -> dict[str, str]:
            self.calls.append((prompt, max_tokens, speculative, rule, wait_s))
            return {"text": "ok"}

    service = Service()
    app = build_app(lambda: {}, {"inference": inference_routes(service)}, "t0ken")
    client = TestClient(app, headers={"Authorization": "Bearer t0ken"})
    body = {"prompt": "hi", "max_tokens": 4, "speculative": 2}
    assert client.post("/inference/generate", json={**body, "rule": "mars"}).status_code == 200
    assert client.post("/inference/generate", json=body).status_code == 200
    assert client.post("/inference/generate", json={**body, "wait_s": 2}).status_code == 200
    assert service.calls == [("hi", 4, 2, "mars", DEFAULT_WAIT_S), ("hi", 4, 2, "greedy",
                                                                     DEFAULT_WAIT_S),
                             ("hi", 4, 2, "greedy", 2.0)]
    for wait in (-1, MAX_WAIT_S + 1, "5", True):
        bad = client.post("/inference/generate", json={**body, "wait_s": wait})
        assert bad.status_code == 400 and "'wait_s'" in bad.json()["error"]["message"]
    assert len(service.calls) == 3
    refused = client.post("/inference/generate", json={**body, "rule": "sampling"})
    assert refused.status_code == 400 and "'rule'" in refused.json()["error"]["message"]
