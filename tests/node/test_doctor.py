"""`symphony doctor`: each check passes on a healthy node and fails, with its fix, when broken."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from crypto.keys import Identity, save_identity
from node.config import load_config
from node.daemon import config_sections, load_service_classes
from node.doctor.local import key_check, listen_checks, model_check
from node.doctor.network import clock_check, nat_check, reachability_check
from node.doctor.report import FAIL, PASS, SKIP, WARN
from node.doctor.run import as_started, run_doctor
from node.market.executor import ExecutorSection
from node.p2p.multiaddrs import AddrError, tcp_endpoint
from tests.node.conftest import ARITH_SOLVER, TEST_NETWORK_ID, Testnet, run_cli

CONVERGE_S = 30.0
#: a well-formed peer id (the daemon's addresses always carry one)
PEER = "12D3KooWRawPbxPtP1eZaJpumGnyWX2DcUyd3RQnydr3eAto4Az7"


def _doctor(data_dir: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    done = run_cli("doctor", "--json", *args, data_dir=data_dir)
    assert done.returncode in (0, 1) and done.stdout, done.stderr
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def _doctor_here(data_dir: Path, *, check_model: bool = False,
                 **flags: Any) -> dict[str, dict[str, Any]]:
    """The checks of run_doctor in this process, for the config `node run` would build."""
    config = load_config({"data_dir": data_dir, **flags},
                         sections=config_sections(load_service_classes()))
    return {c.name: c.as_json() for c in run_doctor(config, check_model=check_model)}


def _failures(checks: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in checks.values() if c["status"] == FAIL]


# ---------------------------------------------------------------- checks one by one


def test_the_key_must_exist_and_be_private(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    missing = key_check(path)
    assert missing.status == FAIL and "symphony keygen" in missing.fix
    save_identity(Identity.generate(), path)
    assert key_check(path).status == PASS
    path.chmod(0o644)
    loose = key_check(path)
    assert loose.status == FAIL and "0644" in loose.detail
    assert loose.fix == f"chmod 600 {path}"


def test_a_listen_port_in_use_fails_and_port_zero_passes() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        (busy, any_port, bad) = listen_checks(
            (f"/ip4/127.0.0.1/tcp/{port}", "/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/9"),
            None)
    assert busy.status == FAIL and "already in use" in busy.detail and "--listen" in busy.fix
    assert any_port.status == PASS
    assert bad.status == FAIL and "not a /ip4" in bad.detail
    # while the daemon runs, its own addresses are what counts
    (ours,) = listen_checks((f"/ip4/127.0.0.1/tcp/{port}",),
                            [f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER}"])
    assert ours.status == PASS and "running daemon" in ours.detail
    with pytest.raises(AddrError, match=r"'/ip4/1.2.3.4/tcp/99999' is not a multiaddr: integer"):
        tcp_endpoint("/ip4/1.2.3.4/tcp/99999")


def test_a_running_daemon_is_judged_by_the_settings_it_was_started_with(tmp_path: Path) -> None:
    config = load_config({"data_dir": tmp_path}, sections=config_sections(load_service_classes()))
    started = {"listen": ["/ip4/127.0.0.1/tcp/0"], "bootstrap": [], "network_id": "itest"}
    got = as_started(config, {"started_with": started}, given=())
    assert (got.listen, got.bootstrap, got.network_id) == (("/ip4/127.0.0.1/tcp/0",), (),
                                                           "itest")
    # doctor's own flags win; a malformed report changes nothing
    assert as_started(config, {"started_with": started}, given=("listen",)).listen == \
        config.listen
    for bad in ({"listen": "/ip4/1.2.3.4/tcp/1"}, {"listen": [4001]}, {"network_id": 7}, []):
        assert as_started(config, {"started_with": bad}, given=()) == config


def test_a_missing_model_fails_the_model_check(tmp_path: Path) -> None:
    check, size = model_check(ExecutorSection(model=str(tmp_path / "missing.gguf")))
    assert check.status == FAIL and "model not found" in check.detail
    assert "[executor] model" in check.fix and size == 0
    assert model_check(ExecutorSection(solver=""))[0].status == WARN
    assert model_check(ExecutorSection(solver=ARITH_SOLVER))[0].status == PASS
    broken = model_check(ExecutorSection(solver="tests.node.no_such_module:factory"))[0]
    assert broken.status == FAIL and "cannot be imported" in broken.detail


def test_reachability_is_proven_by_peers_that_dialled_in() -> None:
    addrs = [f"/ip4/192.168.1.20/tcp/4001/p2p/{PEER}"]
    inbound = reachability_check({"addresses": addrs, "peers": [{"outbound": False}]})
    assert inbound.status == PASS
    behind = reachability_check({"addresses": addrs, "peers": [{"outbound": True}]})
    assert behind.status == WARN and "all private" in behind.detail
    assert "forward TCP port 4001" in behind.fix


def test_nat_status_says_autonat_and_the_relay_reservation() -> None:
    nat = {"reachability": "private", "autonat_answers": {"p": "private"},
           "relay_service": {"serving": False}, "reservations": [], "relayed_addrs": []}
    behind = nat_check({"nat": nat})
    assert behind.status == WARN and "no relay reservation" in behind.detail
    held = {**nat, "reservations": [{"relay": "12D3KooWrelay0000000", "expires_in_s": 3500}],
            "relayed_addrs": ["/ip4/1.2.3.4/tcp/1/p2p/R/p2p-circuit/p2p/A"]}
    assert nat_check({"nat": held}).status == PASS
    assert "relay reservation on 12D3KooWrelay000" in nat_check({"nat": held}).detail
    reached = reachability_check({"addresses": [], "peers": [], "nat": held})
    assert reached.status == PASS and "through a relay" in reached.detail
    public = {**nat, "reachability": "public", "relay_service": {"serving": True,
                                                                 "reservations": 2}}
    assert "relaying for 2 peer(s)" in nat_check({"nat": public}).detail
    assert nat_check({"nat": {**nat, "reachability": "unknown"}}).status == WARN
    assert nat_check({}).status == SKIP


def test_clock_offset_from_peers_records() -> None:
    def peers(*offsets: int) -> dict[str, Any]:
        return {"peers": [{"peer_id": f"peer{i}", "issued_at_ms": 1_000_000 + off,
                           "last_seen_ms": 1_000_000, "self": False}
                          for i, off in enumerate(offsets)]}

    assert clock_check(peers(), {}).status == SKIP
    assert clock_check(peers(-300, 5), {}).status == PASS
    ahead = clock_check(peers(-300, 9_000), {})
    assert ahead.status == WARN and "9000 ms in our future" in ahead.detail
    refused = clock_check(peers(5), {"peer0": {"from_future": 2}})
    assert refused.status == FAIL and "timedatectl" in refused.fix


# ---------------------------------------------------------------- the command on real nodes


@pytest.mark.integration
def test_doctor_passes_a_healthy_node_and_fails_each_broken_setting(
        testnet: Testnet, tmp_path: Path) -> None:
    a = testnet.start("a", config={"executor": {"solver": ARITH_SOLVER}})
    # b's node.toml names what its flags say too, so that doctor sees the same settings
    b = testnet.start("b", bootstrap=[a], config={
        "network_id": TEST_NETWORK_ID, "bootstrap": [a.addresses[0]],
        "listen": ["/ip4/127.0.0.1/tcp/0"], "executor": {"solver": ARITH_SOLVER}})
    testnet.wait_until(lambda: a.peer_id in b.ready_peers(), "b to join a", CONVERGE_S)

    def holds_a_record() -> bool:
        import httpx

        peers = httpx.get(b.api_url + "/ledger/peers", timeout=5).json()["peers"]
        return any(p["peer_id"] == a.peer_id for p in peers)

    testnet.wait_until(holds_a_record, "b to hold a's capability record", CONVERGE_S)
    # a was started with --listen /ip4/127.0.0.1/tcp/0 (flags only): doctor judges the
    # running daemon by that, not by the configured default /ip4/0.0.0.0/tcp/4001
    code, on_a_cli = _doctor(a.data_dir, "--skip-model")
    assert code == 0, _failures(on_a_cli)
    assert on_a_cli["listen /ip4/127.0.0.1/tcp/0"]["status"] == PASS
    assert "listen /ip4/0.0.0.0/tcp/4001" not in on_a_cli
    code, checks = _doctor(b.data_dir)
    assert code == 0, checks
    assert not [c for c in checks.values() if c["status"] == FAIL]
    boot = checks[f"bootstrap {a.addresses[0]}"]
    assert boot["status"] == PASS and f"'{TEST_NETWORK_ID}'" in boot["detail"]
    assert checks["key"]["status"] == checks["model"]["status"] == PASS
    assert checks["clock"]["status"] == PASS and checks["gpu"]["status"] in (PASS, WARN)
    assert checks["reachability"]["status"] == WARN  # nobody dialled b
    # the flags the daemon was started with count as they do for `node run`
    on_a = _doctor_here(a.data_dir, listen=("/ip4/127.0.0.1/tcp/0",), network_id=TEST_NETWORK_ID)
    assert not _failures(on_a), _failures(on_a)
    assert on_a["reachability"]["status"] == PASS  # b dialled a

    # a stopped node: the daemon's checks say they need it
    b.terminate()
    stopped = _doctor_here(b.data_dir)
    assert not _failures(stopped), _failures(stopped)
    assert stopped["clock"]["status"] == SKIP
    assert "running daemon" in stopped["reachability"]["detail"]

    # a wrong bootstrap port fails that check, with the fix, and the exit status says so
    port = int(a.addresses[0].split("/tcp/")[1].split("/")[0])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        wrong_port = closed.getsockname()[1]
    wrong = a.addresses[0].replace(f"/tcp/{port}/", f"/tcp/{wrong_port}/")
    assert wrong != a.addresses[0]
    code, checks = _doctor(b.data_dir, "--skip-model", "--bootstrap", wrong)
    assert code == 1
    assert [c["name"] for c in _failures(checks)] == [f"bootstrap {wrong}"]
    assert "nothing answers" in checks[f"bootstrap {wrong}"]["detail"]
    assert "check the port" in checks[f"bootstrap {wrong}"]["fix"]

    # another network's node is named with both ids
    checks = _doctor_here(b.data_dir, network_id="othernet")
    boot = checks[f"bootstrap {a.addresses[0]}"]
    assert [c["name"] for c in _failures(checks)] == [boot["name"]]
    assert f"'{TEST_NETWORK_ID}'" in boot["detail"] and "'othernet'" in boot["detail"]

    # a key readable by others
    (b.data_dir / "node.key").chmod(0o644)
    checks = _doctor_here(b.data_dir)
    assert [c["name"] for c in _failures(checks)] == ["key"]
    assert checks["key"]["fix"] == f"chmod 600 {b.data_dir / 'node.key'}"
    (b.data_dir / "node.key").chmod(0o600)

    # a model that is not there
    missing = tmp_path / "gone.gguf"
    (b.data_dir / "node.toml").write_text(tomli_w.dumps({
        "network_id": TEST_NETWORK_ID, "bootstrap": [a.addresses[0]],
        "executor": {"model": str(missing)}}))
    checks = _doctor_here(b.data_dir, check_model=True)
    assert [c["name"] for c in _failures(checks)] == ["model"]
    assert str(missing) in checks["model"]["detail"]
