"""`symphony rl publish ADAPTER`: a trained LoRA adapter joins the network, to be run by agents.

The command checks that the file is a llama.cpp LoRA GGUF (``general.type = adapter``,
``adapter.type = lora``: what models/rl/export.py writes), names it by its content hash
(node/agents/adapters.py) and has the running daemon relay it as the artifact of that name
(``POST /relay/publish``) to every connected peer. A node serves it as an agent by naming the
hash in an ``[[agents]]`` table (``adapter = "<hash>"``): its executor fetches the adapter
through the relay, checks it against the hash, loads it beside its model and bids for the
tasks the agent's card matches.
"""

from __future__ import annotations

from pathlib import Path

import click

from node.cli.daemon_api import api_client, call, data_dir_option, echo_json


def check_lora_gguf(path: Path) -> None:
    """Raise ClickException unless ``path`` is a llama.cpp LoRA adapter GGUF."""
    from models.gguf_reader import read_gguf

    try:
        meta, tensors = read_gguf(path)
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{path} is not a GGUF file: {exc}") from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise click.ClickException(
            f"{path} is a GGUF but not a LoRA adapter (general.type="
            f"{meta.get('general.type')!r}, adapter.type={meta.get('adapter.type')!r})")
    if not tensors:
        raise click.ClickException(f"{path} is a LoRA adapter with no tensors")


@click.command("publish")
@click.argument("adapter", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@data_dir_option
def publish(adapter: str, as_json: bool, data_dir: str | None) -> None:
    """Relay the LoRA adapter file ADAPTER (e.g. a learner's exported <sha256>.gguf) to the
    connected peers, named by its content hash, for agents to run."""
    from node.agents.adapters import adapter_artifact, file_adapter_hash

    path = Path(adapter).resolve()
    check_lora_gguf(path)
    content_hash = file_adapter_hash(path)
    client = api_client(data_dir)
    result = call(client.post, "/relay/publish", json={
        "path": str(path), "name": adapter_artifact(content_hash), "format": "raw"})
    shown = {"adapter": content_hash, "artifact": result["name"], "version": result["version"],
             "manifest": result["id"], "bytes": result["total_size"],
             "recipients": len(result["recipients"])}
    if as_json:
        echo_json(shown)
        return
    click.echo(f"published adapter {content_hash} ({shown['bytes']} bytes) to "
               f"{shown['recipients']} peers; serve it as an agent with, in node.toml:\n"
               f'[[agents]]\nname = "my-agent"\ndescription = "..."\nskills = ["..."]\n'
               f'adapter = "{content_hash}"')
