"""node/inference/stage_checks.py over in-memory streams (tiny model): a chain's stages commit
to every step, the requester checks the seed-selected ones by recomputing them on another
server, convicts a lying stage and leaves an honest one alone. The daemons' path (the ledger,
the rerun) is in tests/node/test_inference_integration.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

from models.dishonest import KINDS, DishonestStage  # noqa: E402
from node.inference.server import StageHost  # noqa: E402
from node.inference.stage_checks import check_chain  # noqa: E402
from protocol.inference.messages import RecheckResult, StatesReply  # noqa: E402
from protocol.inference.stage_checks import commit_ok  # noqa: E402
from protocol.ledger.records import AttestationKind  # noqa: E402
from protocol.machine import Send  # noqa: E402
from tests.node import chain_net  # noqa: E402
from tests.node.chain_net import (  # noqa: E402
    Net,
    generate,
    peer_of,
    reference,
    run_chain,
)

gguf = chain_net.gguf  # the tiny model's fixture (module scope)


def _lying(net: Net, name: str, kind: str) -> None:
    host = net.hosts[peer_of(name)]
    host.stage = DishonestStage(host.stage, kind, scale=0.05)  # type: ignore[assignment]


def test_the_configs_kinds_are_the_models() -> None:
    from node.inference.section import DISHONEST_KINDS

    assert DISHONEST_KINDS == KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_a_lying_stage_is_convicted_and_an_honest_chain_gives_the_reference(
        gguf: Path, kind: str) -> None:
    """b serves blocks [0, 2) dishonestly; c holds the same blocks and recomputes b's checked
    steps; every step is checked (rate 1). The chain without b gives the reference output."""

    async def body(net: Net) -> tuple[list[str], list[int], list[str]]:
        net.serve("b", 0, 2)
        net.serve("a", 0, 1)
        net.serve("c", 0, 2)
        _lying(net, "b", kind)
        chain = net.chain()
        chain.excluded.update({peer_of("a"), peer_of("c")})  # the plan takes b
        await chain.open()
        chain.excluded.clear()
        target_out = await _decode(net, chain)
        assert target_out and [net.name(p) for p, _, _ in chain.route] == ["b"]
        assert all(commit_ok(peer_of("b"), c) for c in chain.hops[0].commits.values())
        report = await check_chain(chain, 1.0)
        await chain.close()
        assert report.prefilled == []  # checked per position, on its committed K/V
        convicted = [net.name(a.subject) for a in report.convicted]
        assert all(a.kind is AttestationKind.VERIFICATION_FAILED and a.evidence_hash
                   for a in report.convicted)
        again = net.chain()
        again.excluded.add(peer_of("b"))
        out, route = await generate(net, again, 24)
        return convicted, out, route

    convicted, out, route = run_chain(gguf, body)
    assert convicted == ["b"], kind
    assert out == reference(gguf, 24) and "b" not in route


async def _decode(net: Net, chain: object) -> list[int]:
    import trio

    from models.blocks import greedy, load_head
    from node.inference.chain import ChainTarget
    from tests.node.chain_net import PROMPT

    target = ChainTarget(load_head(net.gguf), chain)  # type: ignore[arg-type]
    return await trio.to_thread.run_sync(greedy, target, PROMPT, 24)


async def _decoded_and_checked(net: Net, **chain_options: Any) -> Any:
    """A chain opened without c (so c is free to check), a generation through it, then every
    step checked: the check's report."""
    chain = net.chain(**chain_options)
    chain.excluded.add(peer_of("c"))
    await chain.open()
    chain.excluded.clear()
    await _decode(net, chain)
    report = await check_chain(chain, 1.0)
    await chain.close()
    return report


def test_honest_chains_pass_their_checks_forwarded_and_direct(gguf: Path) -> None:
    async def body(net: Net) -> list[tuple[list[str], int, list[str]]]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        net.serve("c", 0, 2)  # recomputes both
        results = []
        for forwarding in (True, False):
            report = await _decoded_and_checked(net, forwarding=forwarding)
            results.append(([net.name(p) for p in report.checked], report.steps_checked,
                             [a.subject for a in report.convicted] + report.dropped
                             + report.prefilled))
        return results

    for checked, steps, blamed in run_chain(gguf, body):
        assert checked == ["a", "b"] and steps >= 24 and not blamed


def test_a_stage_no_one_can_recompute_is_unchecked_and_rate_zero_checks_nothing(
        gguf: Path) -> None:
    async def body(net: Net) -> tuple[list[str], list[str], list[str]]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        chain = net.chain()
        await chain.open()
        await _decode(net, chain)
        none = await check_chain(chain, 0.0)
        report = await check_chain(chain, 1.0)
        await chain.close()
        return none.checked + none.unchecked, [net.name(p) for p in report.unchecked], report.checked

    nothing, unchecked, checked = run_chain(gguf, body)
    assert nothing == [] and sorted(unchecked) == sorted(["a", "b"]) and checked == []


def _rewriting(host: StageHost, change: Callable[[Any], Any]) -> None:
    """``host``'s machine with every Send it returns passed through ``change`` first."""
    handle = host.machine.handle

    def rewritten(event: Any, now: int) -> list[Any]:
        return [Send(e.peer, change(e.message)) if isinstance(e, Send) else e
                for e in handle(event, now)]

    host.machine.handle = rewritten  # type: ignore[method-assign]


def _forged_kv(msg: Any) -> Any:
    if isinstance(msg, StatesReply) and msg.kv:
        return dataclasses.replace(msg, kv=bytes([msg.kv[0] ^ 1]) + msg.kv[1:])
    return msg


def _short_kv(msg: Any) -> Any:
    return dataclasses.replace(msg, kv=msg.kv[:-4]) if isinstance(msg, StatesReply) else msg


def _nan_result(msg: Any) -> Any:
    if isinstance(msg, RecheckResult):
        return dataclasses.replace(msg, outputs=b"\xff" * len(msg.outputs))  # NaNs
    return msg


def _short_result(msg: Any) -> Any:
    return dataclasses.replace(msg, kv=msg.kv[4:]) if isinstance(msg, RecheckResult) else msg


@pytest.mark.parametrize(("change", "culprit"), [
    (_forged_kv, "a"), (_short_kv, "a"), (_nan_result, "c"), (_short_result, "c")])
def test_malformed_kv_pages_and_recheck_results_cost_their_sender(
        gguf: Path, change: Callable[[Any], Any], culprit: str) -> None:
    """a serves blocks [0, 2) and sends K/V unlike its commitment or of the wrong size; or c,
    its only checker, answers a recheck with non-finite values or the wrong size. The sender
    is penalized, no one is convicted, and the check goes on without a traceback."""

    async def body(net: Net) -> tuple[list[str], list[str], list[str]]:
        net.serve("a", 0, 2)
        net.serve("c", 0, 2)
        _rewriting(net.hosts[peer_of(culprit)], change)
        report = await _decoded_and_checked(net)
        return ([net.name(p) for p in report.dropped + report.unchecked],
                [a.subject for a in report.convicted], sorted({p for p, _ in net.reports}))

    away, convicted, penalized = run_chain(gguf, body)
    assert convicted == [] and penalized == [culprit]
    assert away == ["a"]  # dropped (its pages) or left unchecked (no checker left)


def _too_large_with_kv(msg: Any) -> Any:
    """A stage whose first step does not fit a page with its K/V (as a long prefill)."""
    if isinstance(msg, StatesReply) and msg.kv:
        return dataclasses.replace(msg, steps=b"", inputs=b"", outputs=b"", kv=b"")
    return msg


@pytest.mark.parametrize("kind", ["", "noise"])
def test_steps_too_large_with_their_kv_are_checked_by_a_prefill(gguf: Path, kind: str) -> None:
    """The fallback: a's pages do not fit with their K/V, so the requester fetches its frames
    alone and has c recompute a's blocks from position 0; honest, a passes, lying, it is
    convicted."""

    async def body(net: Net) -> tuple[list[str], list[str], list[str]]:
        net.serve("a", 0, 2)
        net.serve("c", 0, 2)
        if kind:
            _lying(net, "a", kind)
        _rewriting(net.hosts[peer_of("a")], _too_large_with_kv)
        report = await _decoded_and_checked(net)
        return ([net.name(p) for p in report.prefilled], [net.name(p) for p in report.checked],
                [net.name(a.subject) for a in report.convicted])

    prefilled, checked, convicted = run_chain(gguf, body)
    assert prefilled == checked == ["a"]
    assert convicted == (["a"] if kind else [])
