"""Light daemons (``node run --light``, ``testnet --light``): the services they run, that they
import no model library, and the testnet command's node limits. No daemon starts here
(tests/node/test_bench_scale_integration.py runs a few)."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from node.cli.node import MAX_LIGHT_TESTNET_NODES, MAX_TESTNET_NODES
from node.cli.node import testnet as cli_testnet
from node.daemon import LIGHT_SERVICES, SERVICES, light_services
from node.testnet import LocalTestnet
from tests.node.conftest import ROOT

#: what a light daemon must never import (each costs hundreds of MB or seconds of start-up)
MODEL_LIBRARIES = ("torch", "llama_cpp", "transformers", "sentence_transformers")
#: and no heavy library a light daemon does not run: the MCP SDK (its types alone are tens of
#: MB per process) is loaded only by a node that has MCP servers configured
HEAVY_LIBRARIES = (*MODEL_LIBRARIES, "mcp", "mcp_types")


def test_light_services_are_the_registrys_own_in_its_order() -> None:
    assert list(light_services()) == list(LIGHT_SERVICES)
    assert all(light_services()[name] == SERVICES[name] for name in LIGHT_SERVICES)
    assert "executor" not in light_services() and "inference" not in light_services()


def test_a_light_daemon_imports_no_model_library_nor_the_mcp_sdk() -> None:
    # what `node run --light` imports before it runs: the CLI, the daemon, its services and
    # the libp2p transport, in a fresh interpreter
    code = (
        "import sys\n"
        "from node.daemon import load_service_classes, light_services\n"
        "import node.cli.node, node.p2p.host\n"
        "load_service_classes(light_services())\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY_LIBRARIES!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_testnet_refuses_many_full_daemons_but_not_light_ones() -> None:
    over = str(MAX_TESTNET_NODES + 1)
    with pytest.raises(click.BadParameter, match="needs --light"):
        cli_testnet.main(["--nodes", over], standalone_mode=False)
    with cli_testnet.make_context("testnet", ["--nodes", "100", "--light"]) as ctx:
        assert ctx.params["nodes"] == 100 and ctx.params["light"] is True
    with pytest.raises(click.BadParameter):
        cli_testnet.make_context("testnet", ["--nodes", str(MAX_LIGHT_TESTNET_NODES + 1),
                                         "--light"])


def test_a_light_testnet_starts_its_daemons_with_light(tmp_path) -> None:  # type: ignore[no-untyped-def]
    net = LocalTestnet(tmp_path, light=True)
    node = net.start("a", wait=False)
    try:
        assert "--light" in node.args
    finally:
        node.kill()
    with pytest.raises(ValueError, match="batch"):
        net.start_batches(["b"], batch=0)
