"""A node behind a NAT, on one machine: network namespaces, veth pairs and a masquerading
router namespace whose forward chain drops connections from outside (nftables).

Layout (``S`` is a per-run suffix)::

    root namespace: nodes B and C (public), 172.31.N.1 --- veth --- 172.31.N.2 router
    router: masquerades what leaves towards B, forwards nothing new from B's side
    router 10.31.N.1 --- veth --- 10.31.N.2 nodes A and D (private namespace, default
    route: the router)

B and a relay C are public (root namespace); A and D sit behind the NAT and bootstrap from C,
keeping only that one peer. Nothing outside can dial A. AutoNAT tells A and D they are private
and C that it is public; A and D reserve a slot on C and advertise their relayed addresses; B
dials both through C. D (hole punching on) upgrades B<->D to a direct connection (D dials B: a
public peer is the "unilateral" case of the spec); A's stays relayed. A task asked on B runs on
A over the relay and on D directly, and ``symphony doctor`` on A shows its reservation. Two
nodes behind two different NATs punch through both: tests/node/test_nat_hole_punch.py.

Needs root, ``ip netns`` and ``nft``; skips with the reason where the kernel or the user does
not allow them.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.api.token import read_token
from node.control import daemon_file
from node.testnet import NodeProcess, wait_until
from tests.node.conftest import ARITH_SOLVER, CONVERGE_S, ROOT, TASKS, TEST_NETWORK_ID, Testnet
from tests.node.netns import Nat

pytestmark = pytest.mark.integration

CLONE_NEWNET = 0x40000000


def _in_namespace(name: str) -> ThreadPoolExecutor:
    """One thread that lives in network namespace ``name`` (HTTP to a daemon inside it)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def enter() -> None:
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name} failed")
        finally:
            os.close(fd)

    return ThreadPoolExecutor(max_workers=1, initializer=enter)


def _doctor(wrapper: list[str], data_dir: Path, *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [*wrapper, sys.executable, "-c", "from node.cli.main import main; main()", "doctor",
         "--json", "--skip-model", "--data-dir", str(data_dir), "--network-id",
         TEST_NETWORK_ID, *flags], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout, done.stderr
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def _behind_nat(nat: Nat, testnet: Testnet, name: str, bootstrap: str,
                config: dict[str, Any]) -> NodeProcess:
    """A daemon in the private namespace, dialling ``bootstrap`` and keeping only that peer
    (it reaches everyone else through the relay, or by hole punching); its node.toml is the
    testnet's (fast membership, no verification) with the test solver and ``config``."""
    data_dir = testnet.write_config(name, {"executor": {"solver": ARITH_SOLVER}, **config})
    node = NodeProcess(name, data_dir, [
        "--listen", f"/ip4/{nat.private_ip}/tcp/0", "--network-id", TEST_NETWORK_ID,
        "--bootstrap", bootstrap, "--target-peers", "1", "--json-logs"],
        wrapper=("ip", "netns", "exec", nat.private))
    testnet.nodes[name] = node  # killed with the others at teardown
    node.spawn()
    return node


def _started(node: NodeProcess) -> None:
    node.info = wait_until(lambda: json.loads(daemon_file(node.data_dir).read_text()),
                           f"{node.name} to write daemon.json", timeout_s=CONVERGE_S)


def _ask(b: NodeProcess, k: int) -> dict[str, Any]:
    reply = httpx.post(f"{b.api_url}/tasks/", timeout=90,
                       headers={"Authorization": f"Bearer {read_token(b.data_dir)}"},
                       json={"question": "What is 6 * 7?", "answer_type": "number",
                             "k": k, "deadline_ms": 60000, "wait": True})
    assert reply.status_code in (200, 201), reply.text
    snap: dict[str, Any] = reply.json()
    assert snap["phase"] == "done" and snap["answer"] == "42", snap
    return snap


def test_nodes_behind_a_nat_are_reached_through_a_relay_and_hole_punched(
        nat: Nat, testnet: Testnet) -> None:
    public = ["--listen", f"/ip4/{nat.public_ip}/tcp/0"]
    c = testnet.start("c", extra_args=public)  # relays once AutoNAT says it is public
    c_public = next(a for a in c.addresses if nat.public_ip in a)
    b = testnet.start("b", bootstrap=[c_public], config={"tasks": TASKS}, extra_args=public)
    a = _behind_nat(nat, testnet, "a", c_public, {"nat": {"hole_punch": False}})
    d = _behind_nat(nat, testnet, "d", c_public, {})
    _started(a)
    _started(d)
    inside = _in_namespace(nat.private)
    try:
        status = lambda node: inside.submit(  # noqa: E731 - a one-line probe
            lambda: httpx.get(node.api_url + "/status", timeout=5).json()).result()
        # nobody outside can dial A: the router forwards nothing new from outside
        port = int(a.addresses[0].split("/tcp/")[1].split("/")[0])
        with pytest.raises(OSError):
            socket.create_connection((nat.private_ip, port), timeout=3).close()
        # AutoNAT: C could not dial A back, so A is private and reserves a slot on C
        held = testnet.wait_until(lambda: status(a)["nat"]["reservations"],
                                  "a to reserve a slot on c", CONVERGE_S)
        assert held[0]["relay"] == c.peer_id and status(a)["nat"]["reachability"] == "private"
        assert c.status()["nat"]["reachability"] == "public"
        relayed = status(a)["nat"]["relayed_addrs"]
        assert relayed and relayed[0].endswith(f"/p2p/{c.peer_id}/p2p-circuit/p2p/{a.peer_id}")
        # B learns their relayed addresses (their Hello to C, C's peer exchange), dials them
        # through C; D upgrades its connection to B by hole punching, A (punching off) not
        testnet.wait_until(lambda: {a.peer_id, d.peer_id} <= b.ready_peers(),
                           "b to reach a and d", CONVERGE_S)
        testnet.wait_until(lambda: status(d)["nat"]["hole_punch"].get("unilateral"),
                           "d to upgrade its connection to b", CONVERGE_S)
        testnet.wait_until(lambda: d.peer_id not in b.status()["nat"]["relayed_peers"],
                           "b's relayed connection to d to be replaced", CONVERGE_S)
        assert c.status()["nat"]["relay_service"]["counts"]["circuit"] >= 2
        # the market: a task asked on B runs on A over the relay and on D directly
        snap = _ask(b, 2)
        assert sorted(r["executor"] for r in snap["results"]) == sorted([a.peer_id, d.peer_id])
        assert a.peer_id in b.status()["nat"]["relayed_peers"]
        on_a = _doctor(["ip", "netns", "exec", nat.private], a.data_dir,
                       "--listen", f"/ip4/{nat.private_ip}/tcp/0", "--bootstrap", c_public)
        assert on_a["nat"]["status"] == "pass" and "relay reservation" in on_a["nat"]["detail"]
        assert on_a["reachability"]["status"] == "pass"
        assert on_a[f"bootstrap {c_public}"]["status"] == "pass"
    finally:
        inside.shutdown(wait=False)
