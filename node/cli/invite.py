"""`symphony invite` and `symphony join INVITE`: bring another machine into a network.

``invite`` asks the running daemon of a data dir for its network id and addresses, signs them
with the node's key (node/p2p/invite.py) and prints the one-line invite. ``join INVITE`` takes
the same flags as ``symphony node run``; it checks the invite, writes the network id and the
inviting node's addresses as ``network_id`` and ``bootstrap`` into the data dir's node.toml
(other keys kept), and starts the daemon as ``node run`` would.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import click

from node.cli.daemon_api import data_dir_option, resolve_data_dir
from node.cli.node import run as node_run
from node.config import CONFIG_FILE_NAME


@click.command()
@data_dir_option
@click.option("--address", "extra", multiple=True,
              help="Also invite to this multiaddr (a forwarded port, a public IP), e.g. "
                   "/ip4/203.0.113.7/tcp/4001; /p2p/<peer id> is added (repeatable).")
def invite(data_dir: str | None, extra: tuple[str, ...]) -> None:
    """Print a signed one-line invite to this running node's network."""
    from crypto.keys import KeyFileError, load_identity
    from node.control import ApiClient, DaemonNotRunning
    from node.p2p.invite import InviteError, node_invite

    directory = resolve_data_dir(data_dir)
    try:
        status = ApiClient(directory).status()
        identity = load_identity(directory / "node.key")
    except (DaemonNotRunning, KeyFileError) as exc:
        raise click.ClickException(str(exc)) from None
    peer = identity.peer_id
    if status["peer_id"] != peer:
        raise click.ClickException(f"the daemon runs as {status['peer_id']} but "
                                   f"{directory / 'node.key'} is {peer}")
    try:
        line = node_invite(identity, status["network_id"], status["addresses"], extra,
                           issued_at_ms=int(time.time() * 1000))
    except InviteError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(line)


def _join(invite_text: str, **flags: Any) -> None:
    from node.p2p.invite import InviteError, read_invite

    try:
        invitation = read_invite(invite_text)
    except InviteError as exc:
        raise click.BadParameter(str(exc), param_hint="INVITE") from None
    if flags.get("network_id") not in (None, invitation.network_id):
        raise click.BadParameter(
            f"--network-id {flags['network_id']!r} contradicts the invite's network id "
            f"{invitation.network_id!r}", param_hint="--network-id")
    directory = resolve_data_dir(flags.get("data_dir"))
    write_join_config(directory / CONFIG_FILE_NAME, invitation.network_id, invitation.addrs)
    click.echo(f"joining network {invitation.network_id!r} through {invitation.peer_id} "
               f"({len(invitation.addrs)} address(es)); config written to "
               f"{directory / CONFIG_FILE_NAME}", err=True)
    click.get_current_context().invoke(node_run, **flags)


def write_join_config(path: Path, network_id: str, addrs: tuple[str, ...]) -> None:
    """Set ``network_id`` and ``bootstrap`` in ``path`` (created if absent), keeping the rest."""
    import tomli_w

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else ""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise click.ClickException(f"{path} is not valid TOML ({exc}); fix or remove it") from None
    header = "# network_id and bootstrap written by `symphony join`\n"
    if not table:  # only comments (the template written on first run): keep them below
        path.write_text(header + tomli_w.dumps({"network_id": network_id,
                                                "bootstrap": list(addrs)}) + "\n" + text)
        return
    table.update(network_id=network_id, bootstrap=list(addrs))
    path.write_text(header + tomli_w.dumps(table))


join = click.Command(
    "join", callback=_join,
    params=[click.Argument(["invite_text"], metavar="INVITE"), *node_run.params],
    help="Join the network of an invite (from `symphony invite`) and run the daemon; takes "
         "the flags of `symphony node run` (--data-dir, --listen, ...).")
