"""Network namespaces for the NAT tests: a command that must succeed, why namespaces cannot
be made here ("" when they can), the one-router NAT of tests/node/test_nat.py (:class:`Nat`,
built by the ``nat`` fixture of tests/node/conftest.py) and a tests/node/nat_peer.py process
in a namespace (:class:`NatPeer`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

#: the repository root (nat_peer.py runs from there)
ROOT = Path(__file__).resolve().parents[2]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


def why_not() -> str:
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"g19probe{os.getpid() % 10000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


class Namespaces(Protocol):
    def open(self) -> None: ...

    def close(self) -> None: ...


N = TypeVar("N", bound=Namespaces)


def opened(net: N, what: str) -> Iterator[N]:
    """A fixture's body: ``net`` built (a skip saying why when namespaces cannot be made here),
    yielded, and removed again, whatever the test did."""
    why = why_not()
    if why:
        pytest.skip(why)
    try:
        try:
            net.open()
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"building {what} failed: {exc.cmd}: {exc.stderr}") from None
        yield net
    finally:
        net.close()


class Nat:
    """The namespaces of the module docstring; ``close()`` removes everything."""

    def __init__(self) -> None:
        n = os.getpid() % 250 + 1
        s = f"{os.getpid() % 10000:04d}"
        self.router, self.private = f"g19r{s}", f"g19p{s}"
        self.public_ip, self.router_ip = f"172.31.{n}.1", f"172.31.{n}.2"
        self.gateway_ip, self.private_ip = f"10.31.{n}.1", f"10.31.{n}.2"
        self._root_if, self._rtr_pub, self._rtr_priv, self._priv_if = (
            f"g19a{s}", f"g19b{s}", f"g19c{s}", f"g19d{s}")
        self.private_net = f"10.31.{n}.0/30"

    def open(self) -> None:
        r, p = self.router, self.private
        sh("ip", "netns", "add", r)
        sh("ip", "netns", "add", p)
        sh("ip", "link", "add", self._root_if, "type", "veth", "peer", "name", self._rtr_pub)
        sh("ip", "link", "set", self._rtr_pub, "netns", r)
        sh("ip", "addr", "add", f"{self.public_ip}/30", "dev", self._root_if)
        sh("ip", "link", "set", self._root_if, "up")
        # B may route to the private network: the NAT, not a missing route, must stop it
        sh("ip", "route", "add", self.private_net, "via", self.router_ip)
        sh("ip", "link", "add", self._rtr_priv, "netns", r, "type", "veth", "peer", "name",
            self._priv_if, "netns", p)
        inr, inp = ("ip", "netns", "exec", r), ("ip", "netns", "exec", p)
        sh(*inr, "ip", "addr", "add", f"{self.router_ip}/30", "dev", self._rtr_pub)
        sh(*inr, "ip", "addr", "add", f"{self.gateway_ip}/30", "dev", self._rtr_priv)
        for dev in (self._rtr_pub, self._rtr_priv, "lo"):
            sh(*inr, "ip", "link", "set", dev, "up")
        sh(*inp, "ip", "addr", "add", f"{self.private_ip}/30", "dev", self._priv_if)
        for dev in (self._priv_if, "lo"):
            sh(*inp, "ip", "link", "set", dev, "up")
        sh(*inp, "ip", "route", "add", "default", "via", self.gateway_ip)
        sh(*inr, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ruleset = "\n".join([
            "table ip nat {", "  chain masq {",
            "    type nat hook postrouting priority 100;",
            f'    oifname "{self._rtr_pub}" masquerade', "  }", "}",
            "table ip filter {", "  chain block_inbound {",
            "    type filter hook forward priority 0; policy drop;",
            "    ct state established,related accept",
            f'    iifname "{self._rtr_priv}" accept', "  }", "}", ""])
        subprocess.run([*inr, "nft", "-f", "-"], input=ruleset, check=True, text=True,
                       capture_output=True, timeout=30)

    def close(self) -> None:
        for args in (("ip", "link", "del", self._root_if), ("ip", "netns", "del", self.private),
                     ("ip", "netns", "del", self.router)):
            subprocess.run(args, capture_output=True, timeout=30)


class NatPeer:
    """tests/node/nat_peer.py in a namespace; its JSON lines one by one."""

    def __init__(self, ns: str, *args: str) -> None:
        self.role = args[0]
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.node.nat_peer", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # each peer bounds its own waits (nat_peer.py)
        if not line:
            raise AssertionError(f"{self.role} ended: {self.stop()}")
        self.log.append(line)
        found: dict[str, Any] = json.loads(line)
        return found

    def stop(self) -> str:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]
