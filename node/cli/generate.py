"""``symphony generate``: a distributed generation through the local daemon's chain."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from node.cli.daemon_api import api_client, call, data_dir_option, echo_json

#: a generation may take long on CPUs and slow links; the client waits this long
GENERATE_TIMEOUT_S = 600.0
#: while blocks are missing, the daemon is asked what is still missing this often (seconds)
WAIT_POLL_S = 0.5


@click.command()
@click.argument("prompt")
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=64, show_default=True)
@click.option("--speculative", type=click.IntRange(0, 16), default=0, show_default=True,
              help="Speculative decoding: at most K tokens drafted locally per step (the "
                   "length adapts to the acceptance and the chain's step time) and verified by "
                   "the chain in one pass (0: plain greedy decoding).")
@click.option("--rule", type=click.Choice(["greedy", "mars"]), default="greedy",
              show_default=True,
              help="How drafts are verified: greedy (the output is plain greedy decoding's) or "
                   "mars (also keeps the target's close second choices: faster, not exact).")
@click.option("--temperature", type=click.FloatRange(0.0, 2.0), default=0.0, show_default=True,
              help="0: greedy; above: seeded sampling (drafts are then verified by rejection "
                   "sampling, so the output is distributed as plain sampling's).")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0,
              show_default=True, help="Nucleus sampling mass (1: off).")
@click.option("--seed", type=click.IntRange(0, (1 << 63) - 1), default=0, show_default=True)
@click.option("--wait-s", type=click.FloatRange(0.0, 3600.0), default=60.0, show_default=True,
              help="While some of the model's blocks are offered by no one yet (a server "
                   "still loading, an offer not yet in the ledger), wait up to this long, "
                   "saying which are missing; then fail naming them.")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's JSON answer.")
def generate(prompt: str, max_tokens: int, speculative: int, rule: str, temperature: float,
             top_p: float, seed: int, wait_s: float, data_dir: str | None,
             as_json: bool) -> None:
    """Generate from PROMPT through a chain of peers serving the model's blocks.

    The local daemon plans the chain from the ledger, decodes through it (greedily, or
    sampling with --temperature), and reports tokens/s, the acceptance rate (with
    --speculative) and the chain used.
    """
    client = api_client(data_dir, timeout_s=GENERATE_TIMEOUT_S)
    left_s = call(wait_for_blocks, client.get, wait_s)
    result = call(client.post, "/inference/generate", json={
        "prompt": prompt, "max_tokens": max_tokens, "speculative": speculative,
        "rule": rule, "temperature": temperature, "top_p": top_p, "seed": seed,
        "wait_s": left_s})
    if as_json:
        echo_json(result)
        return
    print_result(result)


def wait_for_blocks(get: Any, wait_s: float) -> float:
    """Wait while the daemon's ``GET /inference/`` lists blocks no one offers, at most
    ``wait_s``, with a line on stderr whenever what is missing changes; the seconds left (the
    daemon waits those too, and its error names what is still missing when they run out)."""
    from protocol.inference.routing import blocks_text

    started = time.monotonic()
    shown: list[Any] = []
    while True:
        info = get("/inference/")
        missing = [tuple(r) for r in info.get("missing", [])]
        left = max(0.0, wait_s - (time.monotonic() - started))
        if not missing or left <= 0:
            return left
        if missing != shown:
            click.echo(f"waiting up to {left:.0f} s for {blocks_text(missing)} of "
                       f"{info.get('model', '?')}: offered by no peer yet", err=True)
            shown = missing
        time.sleep(min(WAIT_POLL_S, left))


def print_result(r: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(r["text"] + "\n\n")
    rate = r.get("acceptance_rate")
    out.write(f"{len(r['tokens'])} tokens in {r['wall_s']} s: {r['tokens_per_s']} tokens/s"
              + (f", acceptance {rate:.2f} (k={r['speculative']})" if rate is not None else "")
              + (f", {r['recoveries']} recoveries" if r.get("recoveries") else "") + "\n")
    for hop in r["chain"]:
        out.write(f"  blocks {hop['start']:>3}-{hop['end']:<3} {hop['peer']}\n")
