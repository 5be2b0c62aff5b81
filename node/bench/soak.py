"""`symphony bench soak`: SIGKILL one daemon of a small busy testnet, again and again.

Three daemons on loopback: an executor (the embedded model, one thread), a plain peer, and the
victim, which asks (it serves no model). Each cycle, a traffic thread drives the victim
through its HTTP API (asks with ``wait: false``, capability updates that it re-signs and
gossips, reads of its attestations); every few cycles the executor publishes a new version of
a small artifact and the victim starts fetching it (a relay transfer). At a random moment
(seeded, ``KILL_AFTER_S``) the victim gets SIGKILL. While it is dead its data dir is checked:
``PRAGMA integrity_check`` on its SQLite database, and every chunk its store holds for a saved
manifest re-hashed against that manifest. Then it is restarted (same data dir) and, once it
answers /status, checked against what it acknowledged before the kill: its capability record
is at least the sequence number a ``POST /ledger/capability`` answered, every attestation it
listed (and that has not expired) is still there, every task a ``POST /tasks/`` accepted is
still known. After the last cycle every accepted task must reach ``done`` or ``failed``
(resumed or cleanly failed) within its deadline and ``TASK_GRACE_S``.

Figures: ``cycles``, ``cycles_run`` (fewer when a restart did not answer within
``START_TIMEOUT_S``: the run stops there and reports, ``first_problem`` says so; the tasks
are then all counted unresolved), ``restarts_survived`` (restarted and answering; goal = cycles),
``records_lost`` (acknowledged ledger records missing after a restart; goal 0),
``tasks_lost`` (accepted tasks unknown after a restart), ``tasks_unresolved`` (neither done
nor failed at the end), ``integrity_failures`` (SQLite checks not "ok"), ``chunks_corrupt``
(held chunks not matching their manifest, of ``chunks_checked`` over all cycles), ``mean_restart_s`` and ``max_restart_s``
(SIGKILL to answering /status), ``acked_records``, ``acked_tasks``, ``relay_versions``, ``first_problem`` ("" when none).
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DEFAULT_CYCLES, QUICK_CYCLES = 100, 5
#: the victim is killed this long (uniform, seeded) after its cycle's traffic starts
KILL_AFTER_S = (0.3, 3.0)
SEED = 23
NETWORK_ID = "bench-soak"
RELAY_EVERY = 5
RELAY_BYTES = 1 << 20
RELAY_CHUNK = 64 * 1024
TASK_DEADLINE_MS = 30_000
TASK_GRACE_S = 30.0
START_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 10.0
#: between two API requests of the traffic thread (about 20 a second)
TRAFFIC_PAUSE_S = 0.05
#: node/ledger/api.py lists at most this many attestations per request
MAX_LISTED = 1000


@dataclass
class Acked:
    """What the victim acknowledged to its API clients (the things it must not lose)."""

    capability_seq: int = 0
    #: attestation hash -> expires_at_ms
    attestations: dict[str, int] = field(default_factory=dict)
    tasks: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def run(quick: bool, cycles: int | None = None) -> dict[str, Any]:
    from node.testnet import FAST_MEMBERSHIP, LocalTestnet

    n = cycles if cycles is not None else (QUICK_CYCLES if quick else DEFAULT_CYCLES)
    rng = random.Random(SEED)
    figures: dict[str, Any] = {"cycles": n}
    with tempfile.TemporaryDirectory(prefix="symphony-bench-soak-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=NETWORK_ID,
                           config=FAST_MEMBERSHIP)
        try:
            executor = net.start("executor", config={"executor": {"threads": 1}},
                                 timeout_s=START_TIMEOUT_S)
            net.start("peer", bootstrap=[executor], config={"executor": {"solver": ""}})
            victim = net.start("victim", bootstrap=[executor],
                               config={"executor": {"solver": ""}})
            net.wait_all_connected(START_TIMEOUT_S)
            figures.update(_cycles(net, executor, victim, n, rng, Path(tmp)))
        finally:
            net.kill_all()
    return figures


@dataclass
class _Tally:
    restarts: list[float] = field(default_factory=list)
    records_lost: int = 0
    tasks_lost: int = 0
    integrity_failures: int = 0
    chunks_corrupt: int = 0
    chunks_checked: int = 0
    relay_versions: int = 0
    first_problem: str = ""

    def problem(self, what: str) -> None:
        self.first_problem = self.first_problem or what


def _cycles(net: Any, executor: Any, victim: Any, n: int, rng: random.Random,
            tmp: Path) -> dict[str, Any]:
    from node.testnet import TestnetError

    acked, tally = Acked(), _Tally()
    artifact = tmp / "artifact.bin"
    for cycle in range(n):
        if cycle % RELAY_EVERY == 0:
            artifact.write_bytes(rng.randbytes(RELAY_BYTES))
            _relay(executor, victim, artifact, tally)
        traffic = _Traffic(victim, acked, cycle)
        traffic.start()
        time.sleep(rng.uniform(*KILL_AFTER_S))  # the kill moment is the thing measured
        t0 = time.perf_counter()
        victim.kill()
        traffic.stop()
        _check_dead(victim.data_dir, tally, cycle)
        try:
            victim.restart(START_TIMEOUT_S)
        except TestnetError as exc:  # the figures so far still count: report, do not raise
            tally.problem(f"cycle {cycle}: {exc}"[:300])
            break
        tally.restarts.append(time.perf_counter() - t0)
        _check_restored(victim, acked, tally, cycle)
    done = len(tally.restarts) == n
    unresolved = _wait_tasks(victim, acked) if done else len(acked.tasks)
    restarts = tally.restarts or [float("nan")]
    return {
        "cycles_run": len(tally.restarts) + (not done),
        "restarts_survived": len(tally.restarts),
        "records_lost": tally.records_lost,
        "tasks_lost": tally.tasks_lost,
        "tasks_unresolved": unresolved,
        "integrity_failures": tally.integrity_failures,
        "chunks_corrupt": tally.chunks_corrupt,
        "chunks_checked": tally.chunks_checked,
        "mean_restart_s": round(statistics.fmean(restarts), 2),
        "max_restart_s": round(max(restarts), 2),
        "acked_records": len(acked.attestations) + (acked.capability_seq > 0),
        "acked_tasks": len(acked.tasks),
        "relay_versions": tally.relay_versions,
        "first_problem": tally.first_problem,
    }


def _client(node: Any) -> httpx.Client:
    from node.api.token import read_token

    return httpx.Client(base_url=node.api_url, timeout=HTTP_TIMEOUT_S,
                        headers={"Authorization": f"Bearer {read_token(node.data_dir)}"})


def _relay(executor: Any, victim: Any, artifact: Path, tally: _Tally) -> None:
    """A new version of the artifact from the executor; the victim starts fetching it."""
    with _client(executor) as client:
        client.post("/relay/publish", json={"path": str(artifact), "name": "soak",
                                            "chunk_size": RELAY_CHUNK}).raise_for_status()
    with _client(victim) as client:
        client.post("/relay/fetch", json={"name": "soak", "signer": executor.peer_id})
    tally.relay_versions += 1


class _Traffic:
    """Drives the victim's API in a thread until stopped (its death ends every request)."""

    def __init__(self, victim: Any, acked: Acked, cycle: int) -> None:
        self.victim, self.acked, self.cycle = victim, acked, cycle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        with _client(self.victim) as client:
            i = 0
            while not self._stop.is_set():
                try:
                    self._one(client, i)
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    pass  # the victim died mid-request: nothing acknowledged
                i += 1
                self._stop.wait(TRAFFIC_PAUSE_S)

    def _one(self, client: httpx.Client, i: int) -> None:
        acked = self.acked
        if i % 3 == 0:
            r = client.post("/tasks/", json={"question": f"What is {i} plus {self.cycle}?",
                                             "answer_type": "number", "k": 1, "max_tokens": 4,
                                             "deadline_ms": TASK_DEADLINE_MS, "wait": False})
            if r.status_code in (200, 202):
                with acked.lock:
                    acked.tasks.add(r.json()["task_id"])
        elif i % 3 == 1:
            r = client.post("/ledger/capability", json={"tags": [f"soak-{self.cycle}-{i}"]})
            record = r.raise_for_status().json()["record"]
            if record is not None:
                with acked.lock:
                    acked.capability_seq = max(acked.capability_seq, int(record["seq"]))
        else:
            rows = _attestations(client)
            with acked.lock:
                for row in rows:
                    acked.attestations[row["hash"]] = int(row["expires_at_ms"])


def _attestations(client: httpx.Client) -> list[dict[str, Any]]:
    """Every attestation the node lists (the API's maximum page; the soak stays far below)."""
    body = client.get("/ledger/attestations", params={"limit": MAX_LISTED}).raise_for_status()
    found: dict[str, Any] = body.json()
    if found["count"] > MAX_LISTED:
        raise RuntimeError(f"the victim holds {found['count']} attestations, more than one "
                           f"page of {MAX_LISTED}: the check would be incomplete")
    rows: list[dict[str, Any]] = found["attestations"]
    return rows


def _check_dead(data_dir: Path, tally: _Tally, cycle: int) -> None:
    """The victim's data dir while it is dead: SQLite integrity and the chunk store."""
    from node.relay.chunk_store import ChunkStore

    conn = sqlite3.connect(data_dir / "node.db")
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    if result != "ok":
        tally.integrity_failures += 1
        tally.problem(f"cycle {cycle}: integrity_check: {result}")
    store = ChunkStore(data_dir / "chunks")
    for manifest in store.manifests():
        held, verified = store.present(manifest), store.present(manifest, verify=True)
        tally.chunks_checked += len(held)
        if held != verified:
            tally.chunks_corrupt += len(held - verified)
            tally.problem(f"cycle {cycle}: {len(held - verified)} chunks fail their manifest")


def _check_restored(victim: Any, acked: Acked, tally: _Tally, cycle: int) -> None:
    """After the restart: everything acknowledged before the kill is still there."""
    with _client(victim) as client, acked.lock:
        me = client.get(f"/ledger/peers/{victim.peer_id}")
        seq = int((me.json().get("record") or {}).get("seq", 0)) if me.status_code == 200 else 0
        if seq < acked.capability_seq:
            tally.records_lost += 1
            tally.problem(f"cycle {cycle}: own record seq {seq} < acknowledged "
                          f"{acked.capability_seq}")
        now_ms = int(time.time() * 1000)
        held = {row["hash"] for row in _attestations(client)}
        lost = [h for h, exp in acked.attestations.items() if exp > now_ms and h not in held]
        if lost:
            tally.records_lost += len(lost)
            tally.problem(f"cycle {cycle}: {len(lost)} acknowledged attestations missing")
        for task_id in sorted(acked.tasks):
            if client.get(f"/tasks/{task_id}").status_code == 404:
                tally.tasks_lost += 1
                tally.problem(f"cycle {cycle}: accepted task {task_id} unknown")
                acked.tasks.discard(task_id)


def _wait_tasks(victim: Any, acked: Acked) -> int:
    """How many accepted tasks are neither done nor failed once their deadlines passed."""
    from node.testnet import TestnetError, wait_until

    def open_tasks() -> list[str]:
        with _client(victim) as client:
            return [t for t in sorted(acked.tasks)
                    if client.get(f"/tasks/{t}").json().get("phase") not in ("done", "failed")]

    try:
        wait_until(lambda: not open_tasks(), "accepted tasks to finish",
                   timeout_s=TASK_DEADLINE_MS / 1000 + TASK_GRACE_S)
    except TestnetError:
        return len(open_tasks())
    return 0
