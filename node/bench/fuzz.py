"""`symphony bench fuzz`: a real libp2p attacker against a real daemon, one protocol at a time.

One daemon (``symphony node run``, its own process, default config with verification on: the
embedded model, so it serves every protocol) on loopback; for each protocol
it may serve (ours: ``msg``, ``relay-chunks``, ``verify-states``; py-libp2p's: gossipsub
``/meshsub/1.0.0``, ``1.1.0``, ``1.2.0``, identify, identify push, ping) an attacker process
(node/bench/fuzz_attacker.py, a py-libp2p peer through node.p2p) sends ``--frames N`` frames
(default 100,000; ``--quick`` 600), split evenly (at least one each) over the attack kinds of
node/bench/fuzz_frames.py: random bytes, mutated valid frames, lying length prefixes,
valid-but-oversized messages, one signed message replayed, and stalled half frames. Each kind
also has a time limit (``KIND_TIME_S``), so a kind that cannot reach its share in time
reports what it did send. While it runs, this process asks ``GET /status`` every
``probes.STATUS_EVERY_S`` and watches the daemon's process.

Per protocol ``<p>`` (a protocol the daemon does not serve reports ``<p>_served`` 0 only):

* ``<p>_frames_sent``: frames the attacker wrote; ``<p>_crashes``: times the daemon process
  was found dead after (it is restarted for the next protocol; goal 0);
* ``<p>_<kind>_banned_after``: median frames one identity wrote before the daemon banned it
  (-1: never banned within the kind's share); ``<p>_bans``: identities banned;
* ``<p>_refused``: fresh identities whose dial failed though not banned, ``<p>_refusal`` the
  first such error ("" when none);
* ``<p>_rss_growth_mib``: the daemon's resident memory after minus before; ``<p>_fd_growth``
  its open file descriptors after minus before;
* ``<p>_status_p99_ms``: p99 latency of ``GET /status`` during the attack (a request that
  failed counts as its 10 s timeout);
* ``<p>_log_bytes``: bytes the daemon's log grew by.

Totals: ``crashes``, ``frames_sent``, ``kinds_banned`` of ``kinds_attacked`` (protocol x kind
pairs, of served protocols, in which a ban happened), ``status_p99_ms``, ``rss_growth_mib``,
``log_bytes``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from node.bench.fuzz_frames import KINDS, LIBP2P_PROTOCOLS, SYMPHONY_PROTOCOLS
from node.bench.probes import StatusPoller, fd_count, rss_mib

FULL_FRAMES, QUICK_FRAMES = 100_000, 600
#: the longest one attack kind runs on one protocol (full, quick)
KIND_TIME_S = (90.0, 2.5)
#: how long a stalled stream is held: past the daemon's 10 s read deadline in the full run
STALL_HOLD_S = (12.0, 1.5)
NETWORK_ID = "bench-fuzz"
SEED = 17
#: the daemon loads and measures the default model before it is ready (busy 2-core machine)
START_TIMEOUT_S = 120.0


def run(quick: bool, frames: int | None = None) -> dict[str, Any]:
    from node.testnet import LocalTestnet

    total = frames if frames is not None else (QUICK_FRAMES if quick else FULL_FRAMES)
    mode = 1 if quick else 0
    figures: dict[str, Any] = {"frames_per_protocol": total, "kinds": len(KINDS)}
    with tempfile.TemporaryDirectory(prefix="symphony-bench-fuzz-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=NETWORK_ID)
        try:
            # the default config and verification on: it serves every protocol, the states
            # stream included
            node = net.start("target", config={"verify": {"enabled": True}},
                             timeout_s=START_TIMEOUT_S)
            for i, name in enumerate([*SYMPHONY_PROTOCOLS, *LIBP2P_PROTOCOLS]):
                config = {"target": name, "kinds": list(KINDS), "seed": SEED + i,
                          "frames_per_kind": max(1, total // len(KINDS)), "network_id": NETWORK_ID,
                          "kind_time_s": KIND_TIME_S[mode], "stall_hold_s": STALL_HOLD_S[mode]}
                figures.update(_attack_one(node, name, config))
        finally:
            net.kill_all()
    figures.update(_totals(figures))
    return figures


def _attack_one(node: Any, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Attack protocol ``name`` of ``node``; its ``<name>_*`` figures (restarts a dead node)."""
    config = {**config, "daemon_peer": node.peer_id, "daemon_addr": node.addresses[0],
              "api_url": node.api_url}
    rss0, log0, fd0 = rss_mib(node.proc.pid), _log_bytes(node), fd_count(node.proc.pid)
    limit_s = len(KINDS) * (config["kind_time_s"] + config["stall_hold_s"] + 30) + 60
    with StatusPoller(node.api_url) as poller:
        done = subprocess.run([sys.executable, "-m", "node.bench.fuzz_attacker"],
                              input=json.dumps(config) + "\n", capture_output=True, text=True,
                              timeout=limit_s, check=False)
    crashed = not node.running
    out: dict[str, Any] = {f"{name}_crashes": int(crashed)}
    if crashed:
        out[f"{name}_exit_code"] = node.proc.returncode
        node.restart()
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"the fuzz attacker on {name} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    kinds: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if any(k["unsupported"] for k in kinds.values()):
        return {**out, f"{name}_served": 0}
    out[f"{name}_served"] = 1
    out[f"{name}_frames_sent"] = sum(k["frames"] for k in kinds.values())
    out[f"{name}_bans"] = sum(len(k["banned_after"]) for k in kinds.values())
    out[f"{name}_refused"] = sum(k["refused"] for k in kinds.values())
    out[f"{name}_refusal"] = next((k["refusal"] for k in kinds.values() if k["refusal"]), "")
    for kind, k in kinds.items():
        bans = k["banned_after"]
        out[f"{name}_{kind}_banned_after"] = int(statistics.median(bans)) if bans else -1
    out[f"{name}_rss_growth_mib"] = (round(rss_mib(node.proc.pid) - rss0, 1)
                                     if not crashed else None)
    out[f"{name}_fd_growth"] = fd_count(node.proc.pid) - fd0 if not crashed else None
    out[f"{name}_status_p99_ms"] = poller.p99_ms()
    out[f"{name}_log_bytes"] = _log_bytes(node) - log0 if not crashed else None
    return out


def _totals(figures: dict[str, Any]) -> dict[str, Any]:
    served = [n for n in [*SYMPHONY_PROTOCOLS, *LIBP2P_PROTOCOLS] if figures.get(f"{n}_served")]
    pairs = [figures[f"{n}_{k}_banned_after"] for n in served for k in KINDS]
    growth = [figures[f"{n}_rss_growth_mib"] for n in served
              if figures.get(f"{n}_rss_growth_mib") is not None]
    return {
        "protocols_served": len(served),
        "crashes": sum(v for k, v in figures.items() if k.endswith("_crashes")),
        "frames_sent": sum(figures.get(f"{n}_frames_sent", 0) for n in served),
        "kinds_attacked": len(pairs),
        "kinds_banned": sum(1 for v in pairs if v >= 0),
        "status_p99_ms": max((figures[f"{n}_status_p99_ms"] for n in served), default=0.0),
        "rss_growth_mib": round(sum(growth), 1),
        "log_bytes": sum(figures.get(f"{n}_log_bytes") or 0 for n in served),
    }


def _log_bytes(node: Any) -> int:
    try:
        return int(node.log_path.stat().st_size)
    except FileNotFoundError:
        return 0
