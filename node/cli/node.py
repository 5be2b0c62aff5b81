"""`symphony keygen`, `symphony node run|status`, `symphony demo`, `symphony testnet`.

These commands only parse: ``node run`` builds a frozen Config (flag > SYMPHONY_* env > TOML >
defaults, node/config.py) and calls ``node.daemon.run_daemon``; client commands find their
daemon through the data dir (node/control.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from node.cli.daemon_api import api_client, call, data_dir_option, echo_json, resolve_data_dir
from node.cli.options import LINK_SPEC
from node.config import ConfigError


@click.command()
@data_dir_option
@click.option("--force", is_flag=True, help="Replace an existing key (a new peer id!).")
def keygen(data_dir: str | None, force: bool) -> None:
    """Create this node's Ed25519 key (its identity and peer id)."""
    from crypto.keys import Identity, load_identity, save_identity

    directory = resolve_data_dir(data_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / "node.key"
    if path.exists() and not force:
        identity = load_identity(path)
        raise click.ClickException(
            f"{path} exists (peer id {identity.peer_id}); use --force to replace it")
    identity = Identity.generate()
    save_identity(identity, path)
    click.echo(identity.peer_id)


@click.group("node")
def node_group() -> None:
    """Run a node, or ask the running one."""


@node_group.command("run")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: <data-dir>/node.toml if present).")
@data_dir_option
@click.option("--listen", multiple=True, help="Multiaddr to listen on (repeatable).")
@click.option("--bootstrap", multiple=True, help="Peer multiaddr ending in /p2p/<id> (repeatable).")
@click.option("--network-id", default=None)
@click.option("--target-peers", type=int, default=None)
@click.option("--api-port", type=int, default=None, help="Local API port (0: any free port).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default=None)
@click.option("--json-logs/--console-logs", default=None, help="One JSON object per log line.")
@click.option("--serve-blocks", default=None, metavar="auto|A:B",
              help="Serve blocks A..B-1 of the inference model to chains, or 'auto': the "
                   "range the network covers worst.")
@click.option("--link", default=None, metavar="SPEC",
              help="Shape every connection as this link, e.g. rtt=60ms,up=20mbit,loss=0.5% "
                   "(also jitter=, down=).")
@click.option("--light", is_flag=True,
              help="Run only membership, discovery, ledger and relay: no model is loaded "
                   "(the config may then hold only those services' sections).")
def run(config_file: str | None, light: bool, **flags: Any) -> None:
    """Run the daemon until SIGINT/SIGTERM (a second signal forces exit)."""
    from node.config import load_config
    from node.daemon import (
        LIGHT_PROFILE,
        config_sections,
        light_services,
        load_extra_services,
        load_service_classes,
        run_daemon,
    )
    from node.logs import configure_logging

    classes = load_service_classes(light_services() if light else None)
    try:
        config = load_config(flags, config_file=Path(config_file) if config_file else None,
                             sections=config_sections(classes),
                             profile=LIGHT_PROFILE if light else None)
        classes.update(load_extra_services(config.extra_services))
    except (ConfigError, ImportError, AttributeError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(config.log_level, json_logs=config.json_logs)
    try:
        code = run_daemon(config, classes)
    except BaseExceptionGroup as group:  # a ConfigError only found at start (an agent's model)
        if group.subgroup(ConfigError) is None:
            raise
        raise click.ClickException(str(_leaf(group.subgroup(ConfigError)))) from None
    sys.exit(code)


def _leaf(error: BaseException | None) -> BaseException | None:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


@node_group.command("status")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON.")
def status(data_dir: str | None, as_json: bool) -> None:
    """Show the running daemon's peer id, addresses and peers."""
    result = call(api_client(data_dir).status)
    if as_json:
        echo_json(result)
    else:
        print_status(result)


@node_group.command("dashboard")
@data_dir_option
def dashboard(data_dir: str | None) -> None:
    """Print the running daemon's web dashboard URL (it carries the API token once)."""
    from node.api.dashboard import dashboard_url
    from node.api.token import read_token
    from node.control import DaemonNotRunning, read_daemon_info

    directory = resolve_data_dir(data_dir)
    try:
        info = read_daemon_info(directory)
    except DaemonNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(dashboard_url(info.api_url, read_token(directory)))


def print_status(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout)
    console.print(f"peer id   {s['peer_id']}\nnetwork   {s['network_id']}\n"
                  f"uptime    {s['uptime_s']:.0f} s\nversion   {s['versions']['agent']}")
    for addr in s["addresses"]:
        console.print(f"address   {addr}")
    table = Table(title=f"peers ({len(s['peers'])} connected, target {s['target_peers']})")
    for col in ("peer id", "state", "latency ms", "last seen s ago", "address"):
        table.add_column(col)
    for p in s["peers"]:
        table.add_row(p["peer_id"], p.get("state", ""), str(p.get("latency_ms", "")),
                      str(p.get("last_seen_s_ago", "")), (p.get("addrs") or [""])[0])
    console.print(table)
    for d in s["dropped"][-5:]:
        console.print(f"dropped   {d['peer_id']}: {d['reason']} ({d['s_ago']:.0f} s ago)")
    for peer, pen in s["penalties"].items():
        console.print(f"penalty   {peer}: score {pen['score']} ({pen['reasons'][-1]})")


@click.command()
@click.option("--executors", type=click.IntRange(1, 8), default=3, show_default=True,
              help="Daemons serving the default model (besides node a, which asks).")
@click.option("--questions", type=click.IntRange(0, 100), default=None,
              help="Evaluation-set questions to ask (default 20; 0: only start and stop).")
@click.option("--max-tokens", type=click.IntRange(8, 1024), default=None,
              help="Chain-of-thought budget per executor (default 96).")
@click.option("--timeout", "timeout_s", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the nodes to find each other.")
def demo(executors: int, questions: int | None, max_tokens: int | None,
         timeout_s: float) -> None:
    """A local network of daemons answers the shipped evaluation set: single vs voted accuracy.

    Starts 1 + EXECUTORS daemons on loopback (node a asks, the others serve the embedded
    SmolLM2), prints each node's peers, asks the questions through the network with k=3,
    prints single-executor and voted accuracy, and stops every daemon cleanly.
    """
    from rich.console import Console

    from node.cli.demo import DEFAULT_MAX_TOKENS, DEFAULT_QUESTIONS, run_demo
    from node.testnet import TestnetError

    console = Console(file=sys.stdout)
    with tempfile.TemporaryDirectory(prefix="symphony-demo-") as base:
        try:
            codes = run_demo(Path(base), executors=executors,
                             questions=DEFAULT_QUESTIONS if questions is None else questions,
                             max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
                             timeout_s=timeout_s, echo=click.echo, console=console)
        except TestnetError as exc:
            raise click.ClickException(str(exc)) from None
        if any(codes.values()):
            raise click.ClickException(f"unclean exits: {codes}")
        click.echo(f"\nstopped {len(codes)} nodes cleanly (exit codes {sorted(codes.values())})")


#: nodes a testnet may start: each full daemon loads a model, a light one (``--light``) none
MAX_TESTNET_NODES, MAX_LIGHT_TESTNET_NODES = 32, 200
#: daemons started at once (the rest wait for a batch to be ready), and the running nodes each
#: new one bootstraps from (drawn at random, so that no one node answers every Hello): see
#: LocalTestnet.start_batches
TESTNET_START_BATCH, TESTNET_BOOTSTRAP_SPREAD = 8, 3
#: each daemon's bound on becoming ready grows by this per daemon of the testnet (seconds)
TESTNET_READY_S_PER_NODE = 3.0


@click.command()
@click.option("--nodes", type=click.IntRange(1, MAX_LIGHT_TESTNET_NODES), default=3,
              show_default=True, help=f"Daemons to start (at most {MAX_TESTNET_NODES} "
                                      "unless --light).")
@click.option("--base-dir", type=click.Path(file_okay=False), default=None,
              help="Where the nodes' data dirs go (default: a fresh temp dir).")
@click.option("--network-id", default="localtest", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="IPv4 address the nodes listen on; 0.0.0.0 lets other machines join.")
@click.option("--link", default="", type=LINK_SPEC,
              help="Shape every daemon's connections as this link, e.g. "
                   "rtt=60ms,up=20mbit,loss=0.5%.")
@click.option("--light", is_flag=True,
              help="Light daemons: membership, discovery, ledger and relay, no model loaded.")
def testnet(nodes: int, base_dir: str | None, network_id: str, host: str, link: str,
            light: bool) -> None:
    """Start N daemons as a local testnet and print an invite to it; Ctrl-C or SIGTERM stops
    them all."""
    import signal

    from node.testnet import READY_TIMEOUT_S, LocalTestnet, TestnetError

    if nodes > MAX_TESTNET_NODES and not light:
        raise click.BadParameter(f"more than {MAX_TESTNET_NODES} nodes needs --light",
                                 param_hint="--nodes")

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM stops the testnet like Ctrl-C; SIGINT is re-armed because a shell starting us in
    # the background sets it to "ignore", which would leave no way to stop the daemons cleanly.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="symphony-testnet-"))
    net = LocalTestnet(base, network_id=network_id, listen=f"/ip4/{host}/tcp/0", link=link,
                       light=light)
    try:
        first = net.start("node0")  # the node the invite names
        net.start_batches([f"node{i}" for i in range(1, nodes)], batch=TESTNET_START_BATCH,
                          spread=TESTNET_BOOTSTRAP_SPREAD,
                          # later daemons start on cores the running ones share
                          timeout_s=max(READY_TIMEOUT_S, TESTNET_READY_S_PER_NODE * nodes))
        for node in net.nodes.values():
            click.echo(f"{node.name}  {node.peer_id}  api {node.api_url}  "
                       f"data {node.data_dir}  {node.addresses[0]}")
        click.echo(f"ask one: symphony node status --data-dir {first.data_dir}")
        click.echo(f"invite (on another machine: symphony join <invite>; start with --host "
                   f"0.0.0.0 for that):\n{_testnet_invite(first.data_dir, network_id)}")
        click.echo("Ctrl-C stops the testnet.")
        while all(n.running for n in net.nodes.values()):
            time.sleep(1)  # idle until Ctrl-C, noticing a node that exits on its own
        click.echo("a node exited:\n" + net.log_tails(10))
    except TestnetError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        codes = net.stop_all()
        click.echo(f"stopped: {codes}")


def _testnet_invite(data_dir: Path, network_id: str) -> str:
    """The invite to the testnet's first node (signed with its key)."""
    from crypto.keys import load_identity
    from node.control import ApiClient
    from node.p2p.invite import node_invite

    status = ApiClient(data_dir).status()
    return node_invite(load_identity(data_dir / "node.key"), network_id, status["addresses"],
                       issued_at_ms=int(time.time() * 1000))
