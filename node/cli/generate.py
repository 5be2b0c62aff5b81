"""``symphony generate``: a distributed generation through the local daemon's chain."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

#: a generation may take long on CPUs and slow links; the client waits this long
GENERATE_TIMEOUT_S = 600.0


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
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's JSON answer.")
def generate(prompt: str, max_tokens: int, speculative: int, rule: str, temperature: float,
             top_p: float, seed: int, data_dir: str | None, as_json: bool) -> None:
    """Generate from PROMPT through a chain of peers serving the model's blocks.

    The local daemon plans the chain from the ledger, decodes through it (greedily, or
    sampling with --temperature), and reports tokens/s, the acceptance rate (with
    --speculative) and the chain used.
    """
    import httpx

    from node.config import default_data_dir
    from node.control import ApiClient, DaemonNotRunning

    client = ApiClient(Path(data_dir).expanduser() if data_dir else default_data_dir(),
                       timeout_s=GENERATE_TIMEOUT_S)
    try:
        result = client.post("/inference/generate", json={
            "prompt": prompt, "max_tokens": max_tokens, "speculative": speculative,
            "rule": rule, "temperature": temperature, "top_p": top_p, "seed": seed})
    except DaemonNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    except httpx.HTTPStatusError as exc:
        raise click.ClickException(_message(exc.response)) from None
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    print_result(result)


def _message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"


def print_result(r: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(r["text"] + "\n\n")
    rate = r.get("acceptance_rate")
    out.write(f"{len(r['tokens'])} tokens in {r['wall_s']} s: {r['tokens_per_s']} tokens/s"
              + (f", acceptance {rate:.2f} (k={r['speculative']})" if rate is not None else "")
              + (f", {r['recoveries']} recoveries" if r.get("recoveries") else "") + "\n")
    for hop in r["chain"]:
        out.write(f"  blocks {hop['start']:>3}-{hop['end']:<3} {hop['peer']}\n")
