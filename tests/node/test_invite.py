"""Invites: `symphony invite` signs a node's network id and addresses in one line, `symphony
join INVITE` checks it, writes the config and runs a daemon that joins through that node."""

from __future__ import annotations

import base64
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import msgpack
import pytest

from crypto.envelope import Envelope
from crypto.keys import Identity
from node.cli.invite import write_join_config
from node.p2p.invite import (
    INVITE_DOMAIN,
    INVITE_PREFIX,
    InviteError,
    dialable_addrs,
    make_invite,
    read_invite,
)
from node.testnet import NodeProcess
from tests.node.conftest import CLI_TIMEOUT_S, ROOT, TEST_NETWORK_ID, Testnet, run_cli

CONVERGE_S = 30.0


def _addr(identity: Identity, host: str = "127.0.0.1", port: int = 4001) -> str:
    return f"/ip4/{host}/tcp/{port}/p2p/{identity.peer_id}"


def test_an_invite_round_trips_and_any_change_is_refused() -> None:
    me = Identity.from_seed(bytes(range(32)))
    line = make_invite(me, "mynet", [_addr(me, "192.168.1.5"), _addr(me)], issued_at_ms=7)
    assert line.startswith(INVITE_PREFIX) and "\n" not in line and len(line) < 600
    invite = read_invite(line + "\n")
    assert invite.network_id == "mynet" and invite.peer_id == me.peer_id
    assert invite.addrs == (_addr(me, "192.168.1.5"), _addr(me)) and invite.issued_at_ms == 7
    body = line[len(INVITE_PREFIX):]
    for i in (3, len(body) // 2, len(body) - 3):
        flipped = body[:i] + ("A" if body[i] != "A" else "B") + body[i + 1:]
        with pytest.raises(InviteError, match="damaged or was altered"):
            read_invite(INVITE_PREFIX + flipped)
    with pytest.raises(InviteError, match="starts with"):
        read_invite("symphony-invite-9:" + body)


def test_an_invite_may_only_name_its_signers_addresses() -> None:
    me, other = Identity.from_seed(bytes(32)), Identity.from_seed(bytes([1]) * 32)
    with pytest.raises(InviteError, match="no address of"):
        make_invite(me, "mynet", [_addr(other)], issued_at_ms=1)
    payload = msgpack.packb([1, "mynet", [_addr(me), _addr(other)], 1], use_bin_type=True)
    forged = Envelope.sign(me, INVITE_DOMAIN, payload).encode()
    text = INVITE_PREFIX + base64.urlsafe_b64encode(forged).decode().rstrip("=")
    with pytest.raises(InviteError, match="addresses of another peer"):
        read_invite(text)
    bad_net = msgpack.packb([1, "Bad Net!", [_addr(me)], 1], use_bin_type=True)
    text = INVITE_PREFIX + base64.urlsafe_b64encode(
        Envelope.sign(me, INVITE_DOMAIN, bad_net).encode()).decode()
    with pytest.raises(InviteError, match="network id"):
        read_invite(text)
    not_an_addr = f"/ip4/1.2.3/tcp/1/p2p/{me.peer_id}"  # signed, so only the parse refuses it
    bad_addr = msgpack.packb([1, "mynet", [not_an_addr], 1], use_bin_type=True)
    text = INVITE_PREFIX + base64.urlsafe_b64encode(
        Envelope.sign(me, INVITE_DOMAIN, bad_addr).encode()).decode()
    with pytest.raises(InviteError, match=r"address '/ip4/1\.2\.3/tcp/1/p2p/\w+' is not a multiaddr"):
        read_invite(text)


def test_unspecified_hosts_become_this_machines_addresses_loopback_last() -> None:
    me = Identity.from_seed(bytes(32))
    addrs = dialable_addrs([_addr(me, "0.0.0.0")], [_addr(me, "203.0.113.7")])
    assert addrs[0] == _addr(me, "203.0.113.7")
    assert addrs[-1] == _addr(me, "127.0.0.1")
    assert not any("/0.0.0.0/" in a for a in addrs)


def test_join_writes_network_id_and_bootstrap_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("# a comment the template wrote\n# target_peers = 8\n")
    write_join_config(path, "mynet", ("/ip4/1.2.3.4/tcp/1/p2p/x",))
    assert "# a comment the template wrote" in path.read_text()
    assert tomllib.loads(path.read_text()) == {"network_id": "mynet",
                                               "bootstrap": ["/ip4/1.2.3.4/tcp/1/p2p/x"]}
    path.write_text('target_peers = 3\nnetwork_id = "old"\n[limits]\nmax_connections = 9\n')
    write_join_config(path, "mynet", ("/ip4/1.2.3.4/tcp/1/p2p/x",))
    table = tomllib.loads(path.read_text())
    assert table["network_id"] == "mynet" and table["target_peers"] == 3
    assert table["limits"] == {"max_connections": 9}


@pytest.mark.integration
def test_join_with_an_invite_from_a_running_node(testnet: Testnet, tmp_path: Path) -> None:
    a = testnet.start("a")
    shown = run_cli("invite", data_dir=a.data_dir)
    assert shown.returncode == 0, shown.stderr
    line = shown.stdout.strip()
    invite = read_invite(line)
    assert invite.network_id == TEST_NETWORK_ID and invite.peer_id == a.peer_id
    assert set(a.addresses) <= set(invite.addrs)

    garbage = run_cli("join", line[:-6] + "AAAAAA", data_dir=tmp_path / "never")
    assert garbage.returncode == 2 and "INVITE" in garbage.stderr
    assert not (tmp_path / "never" / "node.toml").exists()

    joiner = NodeProcess("j", tmp_path / "j", ["--listen", "/ip4/127.0.0.1/tcp/0", "--json-logs"],
                         command=("join", line))
    testnet.nodes["j"] = joiner  # killed with the others at teardown
    joiner.spawn().wait_ready()
    testnet.wait_until(lambda: a.peer_id in joiner.ready_peers(), "j to join a", CONVERGE_S)
    written = tomllib.loads((tmp_path / "j" / "node.toml").read_text())
    assert written["network_id"] == TEST_NETWORK_ID and written["bootstrap"] == list(invite.addrs)
    assert joiner.status()["network_id"] == TEST_NETWORK_ID


@pytest.mark.integration
def test_testnet_prints_an_invite_to_its_first_node(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SYMPHONY_DATA_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from node.cli.main import main; main()", "testnet", "--nodes",
         "1", "--base-dir", str(tmp_path), "--network-id", "invtest"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
        start_new_session=True)
    assert proc.stdout is not None
    # a reader thread: select() on the pipe misses lines already in the text wrapper's buffer
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],  # type: ignore[union-attr]
                     daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while not any(s.startswith(INVITE_PREFIX) for s in seen):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=left))
            except queue.Empty:
                pass
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(CLI_TIMEOUT_S)
    invite = read_invite(next(s for s in seen if s.startswith(INVITE_PREFIX)))
    node0 = next(s for s in seen if s.startswith("node0 "))
    assert invite.network_id == "invtest" and invite.peer_id == node0.split()[1]
