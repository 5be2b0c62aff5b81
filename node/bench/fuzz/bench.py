"""`symphony bench fuzz`: a real libp2p attacker against a real daemon, one protocol at a time.

One daemon (``symphony node run``, its own process, default config with verification on: the
embedded model, so it serves every protocol) on loopback. The protocols attacked are the ones
the daemon itself says it serves (its identify answer, asked by the attacker process), so a
protocol added to the daemon is attacked without a change here. For each, an attacker process
(node/bench/fuzz/attacker.py, py-libp2p peers through node.p2p, a fresh key after each ban)
sends ``--frames N`` frames (default 100,000; ``--quick`` 1,200) with the attack kinds of
node/bench/fuzz/frames.py that cost one frame at a time: lying length prefixes,
valid-but-oversized messages, random bytes, mutated valid frames, one signed message replayed,
in that order. Each runs until its share is sent (an even share of what the kinds before it
left: the first two end at the daemon's first bans, so their shares pass to the others) or
``KIND_TIME_S`` has passed (on a slow or shared machine the time cap ends it first: the
figures say how many frames went out). Stalled half
frames cost the attacker the daemon's read deadline each (10 s): the ``stall`` kind runs for
``STALL_TIME_S``, long enough for a few bans, its frames on top of the others'. While it
runs, this process asks ``GET /status`` every ``probes.STATUS_EVERY_S`` and watches the
daemon's process.

Per protocol ``<p>`` (short names: ``msg``, ``meshsub-1.2``, ...; node/bench/fuzz/frames.py):

* ``<p>_frames_sent``: frames the attacker wrote (frames written after a ban and before the
  dropped connection reached the attacker count: the daemon refused them);
  ``<p>_crashes``: times the daemon process was found dead after (it is restarted for the
  next protocol; goal 0);
* ``<p>_<kind>_banned_after``: median frames a probe identity (one that writes a frame only
  once the last was answered) wrote before the daemon banned it (-1: no probe was banned);
  ``<p>_<kind>_bans``: identities banned, probes and the others; ``<p>_<kind>_frames``:
  frames of the kind; ``<p>_<kind>_frames_per_s``: its frames over the time it ran (where
  the daemon ends the stream at the first bad frame and bans within a few streams, this is
  bounded by how fast an attacker opens streams and connections, not by how fast it writes);
  ``<p>_<kind>_first_ban_s``: seconds from the kind's start to its first ban; ``<p>_bans``:
  all kinds together;
* ``<p>_refused``: fresh identities whose dial failed though not banned, ``<p>_refusal`` the
  first such error ("" when none); ``<p>_attacker_failures``: attacker runs that failed or
  outlived their time limit (the attacker's fault, not the daemon's: the run goes on, and
  that run's kinds are missing from the figures);
* ``<p>_rss_growth_mib``: the daemon's resident memory after minus before; ``<p>_fd_growth``
  its open file descriptors after minus before;
* ``<p>_status_p99_ms``: p99 latency of ``GET /status`` during the attack (a request that
  failed counts as its 10 s timeout);
* ``<p>_log_bytes``: bytes the daemon's log grew by.

Totals: ``protocols_served`` (and ``protocols``, their ids), ``crashes``, ``frames_sent``,
``min_frames_sent`` (the least any protocol got), ``kinds_banned`` of ``kinds_attacked``
(protocol x kind pairs in which a ban happened), ``unbanned`` (the other pairs, by name),
``attacker_failures``,
``status_p99_ms``, ``rss_growth_mib``, ``log_bytes``, ``elapsed_s``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from node.bench.fuzz.frames import KINDS, short_name
from node.bench.probes import StatusPoller, fd_count, rss_mib

FULL_FRAMES, QUICK_FRAMES = 100_000, 1_200
#: the longest one frame-at-a-time kind runs on one protocol (full, quick): long enough for a
#: third of the full run's 100,000 frames where the daemon keeps reading (ping, gossip,
#: identify push, relay chunks) at the frame rates README.md gives for bench fuzz
KIND_TIME_S = (16.0, 10.0)
#: how long the stall kind runs on one protocol (full, quick): a ban needs the daemon's read
#: deadline (10 s) to pass on ten stalled streams at once
STALL_TIME_S = (20.0, 14.0)
#: how long a stalled stream is held: past the daemon's 10 s read deadline
STALL_HOLD_S = 13.0
#: identities attacking at once (full, quick): the full run's volume needs several, the
#: quick run's budget one, or each identity would write too few frames to be banned
IDENTITIES = (8, 1)
NETWORK_ID = "bench-fuzz"
SEED = 17
#: the daemon loads and measures the default model before it is ready
START_TIMEOUT_S = 120.0
ATTACKER = [sys.executable, "-m", "node.bench.fuzz.attacker"]
#: kinds every protocol refuses at the first frame (a stream that ends mid-frame, a frame
#: over the limit), so their frames are bounded by connection setup, not by the budget
BANNED_AT_ONCE = ("bad_length", "oversized")


def run(quick: bool, frames: int | None = None) -> dict[str, Any]:
    from node.testnet import LocalTestnet

    total = frames if frames is not None else (QUICK_FRAMES if quick else FULL_FRAMES)
    mode = 1 if quick else 0
    # the kinds the daemon ends at their first frames go first: what they leave of the
    # protocol's frames goes to the kinds after them (node/bench/fuzz/attacker.kind_share)
    paced = sorted((k for k in KINDS if k != "stall"), key=lambda k: k not in BANNED_AT_ONCE)
    figures: dict[str, Any] = {"frames_per_protocol": total, "kinds": len(KINDS)}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="symphony-bench-fuzz-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=NETWORK_ID)
        try:
            # the default config and verification on: it serves every protocol, the states
            # stream included
            node = net.start("target", config={"verify": {"enabled": True}},
                             timeout_s=START_TIMEOUT_S)
            protocols = served_protocols(node)
            figures["protocols"] = protocols
            for i, protocol_id in enumerate(protocols):
                config = {"protocol_id": protocol_id, "network_id": NETWORK_ID,
                          "stall_hold_s": STALL_HOLD_S, "identities": IDENTITIES[mode]}
                name = short_name(protocol_id, NETWORK_ID)
                figures.update(_attack_one(node, name, [  # each run its own keys (seed)
                    {**config, "kinds": paced, "kind_time_s": KIND_TIME_S[mode],
                     "frames_total": total, "seed": SEED + 2 * i},
                    {**config, "kinds": ["stall"], "kind_time_s": STALL_TIME_S[mode],
                     "frames_total": total, "seed": SEED + 2 * i + 1}]))
        finally:
            net.kill_all()
    figures.update(_totals(figures))
    figures["elapsed_s"] = round(time.monotonic() - started, 1)
    return figures


def served_protocols(node: Any) -> list[str]:
    """The protocol ids the daemon announces in identify (asked by an attacker process)."""
    config = {"discover": True, "seed": SEED, "daemon_peer": node.peer_id,
              "daemon_addr": node.addresses[0]}
    done = subprocess.run(ATTACKER, input=json.dumps(config) + "\n", capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"asking the daemon's identify failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1])["protocols"])


def _attack_one(node: Any, name: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Attack one protocol of ``node`` (one attacker run per config); its ``<name>_*``
    figures (restarts a dead node)."""
    rss0, log0, fd0 = rss_mib(node.proc.pid), _log_bytes(node), fd_count(node.proc.pid)
    kinds: dict[str, Any] = {}
    failures: list[str] = []
    with StatusPoller(node.api_url) as poller:
        for config in configs:
            config = {**config, "daemon_peer": node.peer_id, "daemon_addr": node.addresses[0],
                      "api_url": node.api_url}
            limit_s = len(config["kinds"]) * (config["kind_time_s"] + STALL_HOLD_S + 30) + 60
            try:
                done = subprocess.run(ATTACKER, input=json.dumps(config) + "\n",
                                      capture_output=True, text=True, timeout=limit_s,
                                      check=False)
            except subprocess.TimeoutExpired:
                failures.append(f"{config['kinds']}: over its {limit_s:.0f} s limit")
                continue
            if done.returncode != 0 or not done.stdout.strip():
                # the attacker's own failure: said in the figures, and the next one goes on
                failures.append(f"{config['kinds']}: exit {done.returncode}: "
                                f"{done.stderr.strip()[-300:]}")
                continue
            kinds.update(json.loads(done.stdout.strip().splitlines()[-1]))
            if not node.running or any(k["unsupported"] for k in kinds.values()):
                break
    crashed = not node.running
    out: dict[str, Any] = {f"{name}_crashes": int(crashed),
                           f"{name}_attacker_failures": failures}
    if crashed:
        out[f"{name}_exit_code"] = node.proc.returncode
        node.restart()
    if any(k["unsupported"] for k in kinds.values()):
        return {**out, f"{name}_served": 0}
    out[f"{name}_served"] = 1
    out[f"{name}_frames_sent"] = sum(k["frames"] for k in kinds.values())
    out[f"{name}_bans"] = sum(k["bans"] for k in kinds.values())
    out[f"{name}_refused"] = sum(k["refused"] for k in kinds.values())
    out[f"{name}_refusal"] = next((k["refusal"] for k in kinds.values() if k["refusal"]), "")
    for kind, k in kinds.items():
        bans = k["banned_after"]
        out[f"{name}_{kind}_banned_after"] = int(statistics.median(bans)) if bans else -1
        out[f"{name}_{kind}_bans"] = k["bans"]
        out[f"{name}_{kind}_frames"] = k["frames"]
        out[f"{name}_{kind}_frames_per_s"] = k["frames_per_s"]
        out[f"{name}_{kind}_first_ban_s"] = k["first_ban_s"]
    out[f"{name}_rss_growth_mib"] = (round(rss_mib(node.proc.pid) - rss0, 1)
                                     if not crashed else None)
    out[f"{name}_fd_growth"] = fd_count(node.proc.pid) - fd0 if not crashed else None
    out[f"{name}_status_p99_ms"] = poller.p99_ms()
    out[f"{name}_log_bytes"] = _log_bytes(node) - log0 if not crashed else None
    return out


def _totals(figures: dict[str, Any]) -> dict[str, Any]:
    names = [short_name(p, NETWORK_ID) for p in figures.get("protocols", [])]
    served = [n for n in names if figures.get(f"{n}_served")]
    pairs = {f"{n}_{k}": figures.get(f"{n}_{k}_bans", 0) for n in served for k in KINDS}
    growth = [figures[f"{n}_rss_growth_mib"] for n in served
              if figures.get(f"{n}_rss_growth_mib") is not None]
    return {
        "protocols_served": len(served),
        "crashes": sum(v for k, v in figures.items() if k.endswith("_crashes")),
        "frames_sent": sum(figures.get(f"{n}_frames_sent", 0) for n in served),
        "min_frames_sent": min((figures.get(f"{n}_frames_sent", 0) for n in served), default=0),
        "kinds_attacked": len(pairs),
        "kinds_banned": sum(1 for v in pairs.values() if v > 0),
        "unbanned": sorted(p for p, v in pairs.items() if v <= 0),
        "attacker_failures": sum(len(figures.get(f"{n}_attacker_failures", [])) for n in names),
        "status_p99_ms": max((figures[f"{n}_status_p99_ms"] for n in served), default=0.0),
        "rss_growth_mib": round(sum(growth), 1),
        "log_bytes": sum(figures.get(f"{n}_log_bytes") or 0 for n in served),
    }


def _log_bytes(node: Any) -> int:
    try:
        return int(node.log_path.stat().st_size)
    except FileNotFoundError:
        return 0
